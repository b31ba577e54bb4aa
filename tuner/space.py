"""The search space: schedules of a loop tree, drawn with Optuna's define-by-run API.

On a CPU the space is centred on the automatic schedule for the target: every decision the
automatic scheduler makes (register tile rows and columns, reduction and cache blocks, the loop
order of a contraction, packing, placement of producers, the parallel loop, vector widths) is a
parameter named by stage and dim, drawn from the value the scheduler chose and its neighbours
(`looptool.autoschedule.automatic_choices`): halves and doubles of a block, a row or a vector
more or less, the orders one swap away.  The same rules then build the schedule from the drawn
values (`looptool.autoschedule.drawn_tree`), so a random draw lands near a good schedule and the
automatic schedule is the draw that takes every centre value.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import optuna

from looptool import autoschedule, ir
from looptool.analysis.target import Target, host
from looptool.codegen import gpu as codegen_gpu
from looptool.codegen.llvm import ITEM_BYTES
from looptool.runtime import gpu as runtime_gpu
from looptool.schedule import TENSOR_INSTRUCTIONS, LoopTree

WARP_LANES = 32


class InvalidDraw(ValueError):
    """A drawn combination of transforms that the schedule API refused."""


def sample(trial: optuna.Trial, tree: LoopTree, threads: int = 1, target: Target | None = None) -> LoopTree:
    """Draw one schedule of `tree`'s program for `target` (default: this CPU) on `threads` cores
    (illegal ones are possible: the caller checks them)."""
    target = (target or host()).with_cores(threads)
    centre = centre_of(tree.program, target)

    def pick(name: str, value, options: tuple):
        choice = centre.get(name)
        return value if choice is None else trial.suggest_categorical(name, list(choice.options))
    try:
        return autoschedule.drawn_tree(tree.program, target, pick)
    except ValueError as err:
        raise InvalidDraw(str(err)) from None


def automatic_params(program: ir.Program, threads: int = 1, target: Target | None = None) -> dict:
    """The parameters of the space's centre: drawn, they give the automatic schedule."""
    centre = centre_of(program, (target or host()).with_cores(threads))
    return {name: choice.value for name, choice in centre.items()}


@functools.lru_cache(maxsize=32)
def centre_of(program: ir.Program, target: Target) -> dict[str, autoschedule.Choice]:
    """The automatic scheduler's choices for `program` on `target` (computed once per process)."""
    return autoschedule.automatic_choices(program, target)


def _loads(stage):
    return list(ir.loads(stage.expr))


def _extent(tree: LoopTree, stage: str, loop: str) -> int:
    return next(lp.extent for lp in tree.schedule.of(stage).loops if lp.name == loop)


def _choose(trial: optuna.Trial, name: str, options: list[int]) -> int:
    return trial.suggest_categorical(name, options or [1])


# GPU --------------------------------------------------------------------------------------------
UNROLL_LIMIT = 8
GPU_THREADS_X = (8, 16, 32, 64, 128)
GPU_THREADS_Y = (1, 2, 4, 8, 16, 32)
GPU_REGISTER_TILE = (1, 2, 4, 8, 16)
GPU_ROW_GROUPS = (1, 2, 4)       # runs a thread's rows come in (register_tiled's y_groups)
GPU_K_TILE = (4, 8, 16, 32)
GPU_TILE_STAGES = (0, 2, 3)     # cp.async pipeline of the shared k tiles (0: copied, then computed)
GPU_ROW_THREADS = (128, 256, 512, 1024)
MMA_BLOCK = (64, 128, 256)
MMA_WARPS = (1, 2, 4)
MMA_K_TILE = (16, 32, 64)
MMA_STAGES = (0, 2, 3, 4)
MMA_ACCUMULATORS = 128          # float registers a lane gives its warp tile's accumulators
BLOCK_REGISTERS = 65536         # 32-bit registers a block's threads share (every CUDA GPU since Kepler)
OTHER_REGISTERS = 32            # what a tensor-core thread needs beside its accumulators (addresses, operands)
WGMMA_GROUPS = (1, 2, 4)
WGMMA_K_TILE = 64               # 128-byte rows of 16-bit elements: a k-major operand's only layout


def sample_gpu(trial: optuna.Trial, tree: LoopTree) -> LoopTree:
    """Draw one GPU schedule. Three families: 'tiles' gives every root stage blocks and threads over
    its output with per-thread register tiles, reductions accumulated in registers (cache_write) over
    k tiles whose inputs may be staged in shared memory, and 128-bit vectors along the contiguous
    dim; 'rows' (programs of several stages) gives each block a row of the output, computes the
    producers there, and binds the innermost dim to threads, combining reductions across them;
    'mma' (a contraction of two bfloat16 or float16 tensors) runs it on tensor cores (`mma_tiled`:
    block tile, warps, k tile, pipeline stages), and on Hopper so does 'wgmma' (`wgmma_tiled`: block
    tile, warpgroups, pipeline stages)."""
    try:
        stages = [st.name for st in tree.program.stages]
        if len(stages) > 1 and trial.suggest_categorical("gpu.family", ["tiles", "rows"]) == "rows":
            return _gpu_rows(trial, tree)
        family = _half_contraction(tree) and trial.suggest_categorical("gpu.tensor.family", tensor_families())
        if family in TENSOR_FAMILIES:
            return _gpu_tensor(trial, tree, family)
        for stage in stages:
            tree = _gpu_tiles(trial, tree, stage)
        _check_block_size(tree)
    except ValueError as err:
        raise InvalidDraw(str(err)) from None
    return tree


def _half_contraction(tree: LoopTree) -> bool:
    """One stage summing the product of two bfloat16 (or two float16) tensors."""
    return _contraction_dtype(tree) in ("bfloat16", "float16")


def _contraction_dtype(tree: LoopTree) -> str | None:
    """The dtype of both tensors of a one-stage sum of the product of two tensors of one dtype."""
    stages = tree.program.stages
    if len(stages) != 1 or stages[0].reduce_op != "sum" or len(stages[0].reduce_dims) != 1:
        return None
    dtypes = [tree.buffers[load.buffer].dtype for load in _loads(stages[0])]
    return dtypes[0] if len(dtypes) == 2 and dtypes[0] == dtypes[1] else None


@dataclass(frozen=True)
class TensorFamily:
    """A tensor-core family of the GPU space: the teams (warps or warpgroups) a block's tile is split
    between, the tile a team's part is made of, the threads of a team, the k tiles to draw and how a
    pipeline may copy its tiles."""

    team: str
    teams: tuple[int, ...]
    k_tiles: tuple[int, ...]
    tile: tuple[int, int]
    threads: int
    build: Callable
    copiers: tuple[str, ...] = ("cp.async",)


def _gpu_tensor(trial: optuna.Trial, tree: LoopTree, family: str) -> LoopTree:
    """Draw block tile, teams, k tile and stages of a tensor-core family and build its schedule."""
    spec = TENSOR_FAMILIES[family]
    st = tree.program.output
    m, n = [d for d in st.loop_dims if d not in st.reduce_dims][-2:]
    block = tuple(_choose(trial, f"gpu.{family}.block.{d}", list(MMA_BLOCK)) for d in (m, n))
    teams = tuple(_choose(trial, f"gpu.{family}.{spec.team}s.{d}", list(spec.teams)) for d in (m, n))
    k_tile = _choose(trial, f"gpu.{family}.k.tile", list(spec.k_tiles)) if len(spec.k_tiles) > 1 else spec.k_tiles[0]
    stages = _choose(trial, f"gpu.{family}.stages", list(MMA_STAGES))
    copier = _choose(trial, f"gpu.{family}.copier", list(spec.copiers)) if stages and len(spec.copiers) > 1 \
        else spec.copiers[0]
    part = (block[0] // teams[0], block[1] // teams[1])
    if part[0] % spec.tile[0] or part[1] % spec.tile[1]:
        raise ValueError(f"a {spec.team} tile of {part[0]}x{part[1]} is not made of {spec.tile[0]}x{spec.tile[1]} tiles")
    threads, accumulators = teams[0] * teams[1] * spec.threads, part[0] * part[1] // spec.threads
    if threads > 1024 or accumulators > min(MMA_ACCUMULATORS, BLOCK_REGISTERS // threads - OTHER_REGISTERS):
        raise ValueError(f"{teams[0] * teams[1]} {spec.team}s of {part[0]}x{part[1]} need {threads} threads (at "
                         f"most 1024) of {accumulators} accumulators (at most {MMA_ACCUMULATORS}, and "
                         f"{BLOCK_REGISTERS} registers a block)")
    shared = (block[0] + block[1]) * k_tile * 2 * max(stages, 1)
    if shared > mma_shared_limit():
        raise ValueError(f"{shared} bytes of shared memory a block (at most {mma_shared_limit()})")
    return spec.build(tree, st.name, block, teams, k_tile, stages, copier)


TENSOR_START = {"wgmma": ((128, 256), (2, 1), 64, 4, "tma"), "mma": ((128, 256), (2, 4), 64, 2, "cp.async")}
# bench.gpu's fastest float32 schedule: 128 x 128 block tiles of 8 x 8 per thread, k tiles of 32 in shared
# memory, A as stored, copied by cp.async one k tile ahead.
TILES_START = {"vector": 4, "x.threads": 16, "x.tile": 2, "y.threads": 16, "y.tile": 8, "y.groups": 2, "k.tile": 32,
               "k.unroll": True, "shared.in0": True, "shared.in1": True, "as_stored.in0": False,
               "as_stored.in1": False, "ahead.in0": True, "stages": 2}


def gpu_start_params(program: ir.Program) -> dict:
    """The GPU space's first draw for a contraction (a study starts there, as a CPU study starts from
    the automatic schedule): for half precision the best tensor-core family of this GPU (wgmma on
    Hopper, else mma) with the block, teams, k tile, stages and copier of bench.gpu's fastest
    schedule of that family; for float32 the fastest register-tile schedule (`TILES_START`) where
    the matrices hold one block tile; {} for other programs."""
    tree = LoopTree(program)
    dtype = _contraction_dtype(tree)
    if dtype == "float32":
        return _tiles_start(program)
    if dtype not in ("bfloat16", "float16"):
        return {}
    family = tensor_families()[-1]
    spec, (block, teams, k_tile, stages, copier) = TENSOR_FAMILIES[family], TENSOR_START[family]
    st = program.output
    m, n = [d for d in st.loop_dims if d not in st.reduce_dims][-2:]
    params = {"gpu.tensor.family": family, f"gpu.{family}.block.{m}": block[0], f"gpu.{family}.block.{n}": block[1],
              f"gpu.{family}.{spec.team}s.{m}": teams[0], f"gpu.{family}.{spec.team}s.{n}": teams[1],
              f"gpu.{family}.stages": stages}
    if len(spec.k_tiles) > 1:
        params[f"gpu.{family}.k.tile"] = k_tile
    if len(spec.copiers) > 1:
        params[f"gpu.{family}.copier"] = copier
    return params


def _tiles_start(program: ir.Program) -> dict:
    st = program.output
    x, y, _ = _tile_dims(st)
    p = TILES_START
    fits = (program.size(x) >= p["x.threads"] * p["x.tile"] * p["vector"] and y is not None
            and program.size(y) >= p["y.threads"] * p["y.tile"] and program.size(st.reduce_dims[0]) >= p["k.tile"])
    return {f"{st.name}.gpu.{name}": value for name, value in p.items()} if fits else {}


@functools.cache
def tensor_families() -> list[str]:
    """The GPU space's families for a half-precision contraction: CUDA-core tiles, mma.sync, and
    wgmma where the GPU is a Hopper (none found: no wgmma)."""
    try:
        hopper = runtime_gpu.device_arch() in codegen_gpu.WGMMA_ARCHS
    except RuntimeError:
        hopper = False
    return ["tiles", "mma", "wgmma"] if hopper else ["tiles", "mma"]


@functools.cache
def mma_shared_limit() -> int:
    """Shared memory an mma block may use: what the current GPU allows a kernel that opts in to
    dynamic shared memory, or 48 KB (static, every CUDA GPU) where no GPU is found."""
    try:
        return runtime_gpu.shared_limit()
    except RuntimeError:
        return codegen_gpu.STATIC_SHARED


def shared_tiled(tree: LoopTree, block: int, k_tile: int, y_tile: int, x_threads: int) -> LoopTree:
    """A matmul's output in block x block tiles: each thread computes y_tile x (block / x_threads)
    outputs (x_threads apart along n), and both inputs are staged in shared memory per k tile,
    copied by the block's threads."""
    return tree.split("m", block).split("n", block).split("k", k_tile).split("m.1", y_tile) \
        .split("n.1", x_threads) \
        .reorder("m.0", "n.0", "k.0", "m.1.0", "n.1.1", "k.1", "m.1.1", "n.1.0") \
        .bind("m.0", "block.y").bind("n.0", "block.x").bind("m.1.0", "thread.y").bind("n.1.1", "thread.x") \
        .unroll("m.1.1").unroll("n.1.0") \
        .cache("in0").place("in0.t0", "t0", 3).cache("in1").place("in1.t0", "t0", 3) \
        .bind("m.1.0", "thread.y", stage="in0.t0").bind("k.1", "thread.x", stage="in0.t0") \
        .bind("n.1.1", "thread.x", stage="in1.t0").bind("k.1", "thread.y", stage="in1.t0")


def register_tiled(tree: LoopTree, stage: str, x_threads: int, x_groups: int, vector: int, y_threads: int,
                   y_tile: int, k_tile: int = 8, unroll_k: bool = False, shared: tuple[str, ...] = (),
                   as_stored: tuple[str, ...] = (), *, y_groups: int = 1) -> LoopTree:
    """Blocks and threads over a stage's last two pure dims (x: contiguous, y): each thread computes
    y_tile x (x_groups * vector) outputs, its x outputs `vector`-wide and x_threads * vector apart,
    its y outputs in `y_groups` runs of consecutive rows, y_threads runs apart (so a tile of an
    input laid out along y is read, and copied, in whole vectors by neighbouring threads).
    A reduction runs in registers over k tiles of `k_tile`; inputs in `shared` are staged in shared
    memory per k tile, those also in `as_stored` in their own layout (see `_stage_in_shared`)."""
    st = tree.program.stage(stage)
    x, y, others = _tile_dims(st)
    span = x_threads * vector
    tree = tree.split(x, span * x_groups, stage=stage).split(f"{x}.1", span, stage=stage)
    threads = [f"{x}.1.1"]
    registers = [f"{x}.1.0"]
    if vector > 1:
        tree = tree.split(f"{x}.1.1", vector, stage=stage)
        threads, registers = [f"{x}.1.1.0"], registers + [f"{x}.1.1.1"]
    blocks = [f"{x}.0"]
    if y is not None and y_groups > 1:
        run = y_tile // y_groups
        tree = tree.split(y, y_threads * y_tile, stage=stage).split(f"{y}.1", y_threads * run, stage=stage) \
            .split(f"{y}.1.1", run, stage=stage)
        blocks, threads = [f"{y}.0"] + blocks, [f"{y}.1.1.0"] + threads
        registers = [f"{y}.1.0", f"{y}.1.1.1"] + registers
    elif y is not None:
        tree = tree.split(y, y_threads * y_tile, stage=stage).split(f"{y}.1", y_tile, stage=stage)
        blocks, threads, registers = [f"{y}.0"] + blocks, [f"{y}.1.0"] + threads, [f"{y}.1.1"] + registers
    tree = tree.reorder(*others, *blocks, *threads, *registers, stage=stage)
    tree = _bind_tile(tree, stage, blocks, threads, registers, vector)
    if not st.reduce_dims:
        return tree
    acc = f"{stage}.acc"
    depth = len(others) + len(blocks)
    tree = tree.cache_write(stage).place(acc, stage, depth)
    reduce_outer, reduce_inner = [], []
    for dim in st.reduce_dims:
        tree = tree.split(dim, k_tile, stage=acc)
        reduce_outer.append(f"{dim}.0")
        reduce_inner.append(f"{dim}.1")
    tree = tree.reorder(*reduce_outer, *threads, *reduce_inner, *registers, stage=acc)
    tree = _bind_tile(tree, acc, [], threads, registers, vector)
    if unroll_k:
        for loop in reduce_inner:
            tree = tree.unroll(loop, stage=acc)
    for buffer in shared:
        tree = _stage_in_shared(tree, acc, buffer, depth + len(reduce_outer), buffer in as_stored)
    return tree


def transposed_ahead(tree: LoopTree, stage: str, buffer: str, tile: int = 32) -> LoopTree:
    """Copy the 2-D input `buffer` that `stage` reads into a temp laid out reduction dim first, by a
    kernel of its own that runs before the stage's: `tile` x `tile` blocks, each thread loading a
    16-byte vector along the input's contiguous dim and each warp storing whole rows of the temp.
    The stage then reads the temp (`<buffer>.<stage>`), whose k tiles are copied into shared memory
    as stored, 16 bytes at a time (so cp.async can pipeline them), and read as vectors along the
    tile's rows: the transpose a shared copy would do element by element, done once."""
    if not _transposable(tree, stage, buffer):
        raise ValueError(f"transposed_ahead: {buffer} (dims {_layout(tree.program, buffer)}) is not a 2-D input "
                         f"with the reduction dim of {stage} ({tree.program.stage(stage).reduce_dims}) last")
    rows, k = _layout(tree.program, buffer)
    copy = f"{buffer}.{stage}"
    width = 16 // ITEM_BYTES[tree.buffers[buffer].dtype]
    tree = tree.cache(buffer, stage=stage, order=(k, rows)).place(copy, None, 0)
    tree = tree.split(rows, tile, stage=copy).split(k, tile, stage=copy).split(f"{k}.1", width, stage=copy)
    tree = tree.reorder(f"{k}.0", f"{rows}.0", f"{k}.1.0", f"{rows}.1", f"{k}.1.1", stage=copy)
    for loop, axis in ((f"{k}.0", "block.y"), (f"{rows}.0", "block.x"), (f"{k}.1.0", "thread.y"),
                       (f"{rows}.1", "thread.x")):
        tree = tree.bind(loop, axis, stage=copy)
    return tree.vectorize(f"{k}.1.1", stage=copy)


def _transposable(tree: LoopTree, stage: str, buffer: str) -> bool:
    """Whether `transposed_ahead` applies: a 2-D input whose last dim is the stage's reduction dim."""
    dims = _layout(tree.program, buffer)
    reduce_dims = tree.program.stage(stage).reduce_dims
    return len(dims) == 2 and dims[0] not in reduce_dims and dims[1] in reduce_dims


def _tile_dims(stage) -> tuple[str, str | None, list[str]]:
    """(x: the contiguous output dim, y: the pure dim before it or None, the other pure dims)."""
    pure = [d for d in stage.loop_dims if d not in stage.reduce_dims]
    x = stage.dims[-1]
    y = next((d for d in reversed(pure) if d != x), None)
    return x, y, [d for d in pure if d not in (x, y)]


def _bind_tile(tree, stage, blocks, threads, registers, vector):
    for loop, axis in zip(reversed(blocks), ("block.x", "block.y", "block.z")):
        tree = tree.bind(loop, axis, stage=stage)
    for loop, axis in zip(reversed(threads), ("thread.x", "thread.y")):
        tree = tree.bind(loop, axis, stage=stage)
    for loop in registers:
        if loop == registers[-1] and vector > 1:
            tree = tree.vectorize(loop, stage=stage)
        elif _extent(tree, stage, loop) > 1:
            tree = tree.unroll(loop, stage=stage)
    return tree


def _layout(program, buffer: str) -> tuple[str, ...]:
    """The dims of an input, or of a stage's buffer, in the order it is laid out."""
    return next((b.dims for b in program.inputs if b.name == buffer), None) or program.stage(buffer).dims


def _stage_in_shared(tree: LoopTree, acc: str, buffer: str, depth: int, as_stored: bool = False) -> LoopTree:
    """Copy the tile of `buffer` one k step uses into shared memory, read 128 bits at a time along the
    source's contiguous dim, with the copy's largest loops bound to threads (where none fills the
    block's y threads, the widest is split to fill them: a 32-row k tile copied by all 16 rows of
    threads, not by the 2 a 2-wide loop would give). The tile is laid out
    reduction dims first (the register tile reads consecutive words along its pure dim; for A of a
    matmul a transpose, stored word by word), or `as_stored` in the source's own layout (written
    in whole 16-byte vectors, which cp.async can pipeline; the register tile's unrolled k steps are
    then read as vectors along k)."""
    program = tree.program
    dims = _layout(program, buffer)
    reduce_dims = program.stage(acc).reduce_dims
    order = dims if as_stored else \
        tuple(d for d in dims if d in reduce_dims) + tuple(d for d in dims if d not in reduce_dims)
    copy = f"{buffer}.{acc}"
    tree = tree.cache(buffer, stage=acc, order=order).place(copy, acc, depth)
    loops = list(tree.schedule.of(copy).loops)
    contiguous = [lp for lp in loops if lp.dim == dims[-1]]
    vector = None
    if contiguous and contiguous[-1].extent == 4:
        vector = contiguous[-1].name
    elif contiguous and contiguous[-1].extent % 4 == 0:
        tree = tree.split(contiguous[-1].name, 4, stage=copy)
        vector = f"{contiguous[-1].name}.1"
        loops = list(tree.schedule.of(copy).loops)
    free = [lp for lp in loops if lp.name != vector]
    block = _block_size(tree, acc)
    along_rows = sorted(free, key=lambda lp: (lp.dim != order[-1], lp.stride))   # neighbours in shared memory
    widest = sorted(free, key=lambda lp: -lp.extent)
    bound = {}                                          # loop name -> thread axis
    x = _fitting(along_rows, block[0], bound)
    if x is not None:
        bound[x.name] = "thread.x"
    y = _fitting(widest, block[1], bound)
    wider = next((lp for lp in widest if lp.name not in bound and lp.extent > block[1] > 1), None)
    if (y is None or y.extent < block[1]) and wider is not None and wider.extent % block[1] == 0:
        tree = tree.split(wider.name, block[1], stage=copy)     # every row of threads gets a share
        bound[f"{wider.name}.1"] = "thread.y"
    elif y is not None:
        bound[y.name] = "thread.y"
    for name, axis in bound.items():
        tree = tree.bind(name, axis, stage=copy)
    rest = [lp for lp in tree.schedule.of(copy).loops if lp.name != vector and lp.name not in bound]
    tree = tree.reorder(*bound, *[lp.name for lp in rest], *([vector] if vector else []), stage=copy)
    for lp in rest:
        if lp.extent <= UNROLL_LIMIT:
            tree = tree.unroll(lp.name, stage=copy)
    return tree.vectorize(vector, stage=copy) if vector else tree


def _fitting(loops: list, limit: int, taken: dict):
    """The first of `loops` longer than 1 and at most `limit` that is not `taken`, or None."""
    return next((lp for lp in loops if 1 < lp.extent <= limit and lp.name not in taken), None)


def _block_size(tree: LoopTree, stage: str) -> tuple[int, int, int]:
    extents = {}
    for lp in tree.schedule.effective_loops(stage):
        if lp.annotation.startswith("thread"):
            extents[lp.annotation] = lp.extent
    return tuple(extents.get(f"thread.{a}", 1) for a in "xyz")


def _check_block_size(tree: LoopTree):
    for node in tree.root:
        codegen_gpu.launch_dims(node)


def _gpu_tiles(trial: optuna.Trial, tree: LoopTree, stage: str) -> LoopTree:
    st = tree.program.stage(stage)
    if not st.dims:
        return tree
    x, y, _ = _tile_dims(st)
    x_size = tree.program.size(x)
    vector = trial.suggest_categorical(f"{stage}.gpu.vector", [1, 4]) if x_size % 4 == 0 else 1
    x_threads = _choose(trial, f"{stage}.gpu.x.threads", [t for t in GPU_THREADS_X if t <= x_size])
    x_groups = _choose(trial, f"{stage}.gpu.x.tile", [1, 2])
    y_threads, y_tile, y_groups = 1, 1, 1
    if y is not None:
        y_size = tree.program.size(y)
        y_threads = _choose(trial, f"{stage}.gpu.y.threads", [t for t in GPU_THREADS_Y if t <= y_size])
        y_tile = _choose(trial, f"{stage}.gpu.y.tile", [t for t in GPU_REGISTER_TILE if t <= y_size])
        y_groups = _choose(trial, f"{stage}.gpu.y.groups", [g for g in GPU_ROW_GROUPS if y_tile % g == 0])
        if y_threads * y_tile > y_size:
            raise ValueError(f"a block tile of {y_threads * y_tile} rows exceeds the {y_size} there are")
    if x_threads * vector * x_groups > x_size:
        raise ValueError(f"a block tile of {x_threads * vector * x_groups} columns exceeds the {x_size} there are")
    if not 32 <= x_threads * y_threads <= 1024:
        raise ValueError(f"{x_threads * y_threads} threads per block (use 32 to 1024)")
    k_tile, unroll_k, shared, as_stored = 8, False, (), ()
    if st.reduce_dims:
        k_size = min(tree.program.size(d) for d in st.reduce_dims)
        k_tile = _choose(trial, f"{stage}.gpu.k.tile", [k for k in GPU_K_TILE if k <= k_size])
        unroll_k = trial.suggest_categorical(f"{stage}.gpu.k.unroll", [True, False])
        inputs = sorted({ld.buffer for ld in _loads(st) if ld.buffer.startswith("in")})
        shared = tuple(b for b in inputs if trial.suggest_categorical(f"{stage}.gpu.shared.{b}", [True, False]))
        as_stored = tuple(b for b in shared if trial.suggest_categorical(f"{stage}.gpu.as_stored.{b}", [False, True]))
        ahead = tuple(b for b in shared if b not in as_stored and _transposable(tree, stage, b)
                      and trial.suggest_categorical(f"{stage}.gpu.ahead.{b}", [False, True]))
        for b in ahead:
            tree = transposed_ahead(tree, stage, b)
        shared = tuple(f"{b}.{stage}" if b in ahead else b for b in shared)
        as_stored = as_stored + tuple(f"{b}.{stage}" for b in ahead)
    tree = register_tiled(tree, stage, x_threads, x_groups, vector, y_threads, y_tile, k_tile, unroll_k, shared,
                          as_stored, y_groups=y_groups)
    if shared and len(st.reduce_dims) == 1:
        stages = _choose(trial, f"{stage}.gpu.stages", list(GPU_TILE_STAGES))
        if stages:
            tree = tree.pipeline(f"{st.reduce_dims[0]}.0", stages, stage=f"{stage}.acc")
    return tree


def _gpu_rows(trial: optuna.Trial, tree: LoopTree) -> LoopTree:
    output = tree.program.output
    x = output.dims[-1]
    threads = _choose(trial, "gpu.rows.threads", [t for t in GPU_ROW_THREADS if t <= tree.program.size(x)])
    outer = [d for d in output.loop_dims if d not in output.reduce_dims and d != x]
    if not outer:
        raise ValueError("the rows family needs an output with at least two dims")
    for dim, axis in zip(reversed(outer[-3:]), ("block.x", "block.y", "block.z")):
        tree = tree.bind(dim, axis, stage=output.name)
    tree = _threads_over(tree, output.name, x, threads)
    depth = len(outer)
    for stage in reversed(tree.program.stages[:-1]):
        tree = tree.place(stage.name, tree.program.readers(stage.name)[0].name, depth)
        for dim in tree.program.stage(stage.name).loop_dims:
            if any(lp.dim == dim for lp in tree.schedule.of(stage.name).loops):
                tree = _threads_over(tree, stage.name, dim, threads)
    return tree


def _threads_over(tree: LoopTree, stage: str, dim: str, threads: int) -> LoopTree:
    """Threads take strided elements of `dim` (coalesced): thread t handles t, t + threads, ..."""
    loop = next(lp.name for lp in tree.schedule.of(stage).loops if lp.dim == dim)
    tree = tree.split(loop, threads, stage=stage)
    return tree.reorder(f"{loop}.1", f"{loop}.0", stage=stage).bind(f"{loop}.1", "thread.x", stage=stage)


def mma_tiled(tree: LoopTree, stage: str, block: tuple[int, int] = (128, 128), warps: tuple[int, int] = (2, 2),
              k_tile: int = 32, stages: int = 0, copier: str = "cp.async") -> LoopTree:
    """A contraction on tensor cores (mma.m16n8k16): blocks of block[0] x block[1] outputs (m x n), split
    between warps[0] x warps[1] warps (thread.y, thread.z), each computing its warp tile as unrolled
    16 x 8 mma tiles whose accumulators stay in registers (`cache_write`) across the k loop; per k tile
    of `k_tile`, both operands are staged in shared memory by all threads with 16-byte copies, and read
    by ldmatrix. With `stages` >= 2 the copies are pipelined (by `copier`: only cp.async reaches
    ldmatrix's layout). A batch dim (one) goes on block.z."""
    return _tensor_tiled(tree, stage, block, warps, k_tile, stages, "mma.m16n8k16", copier)


def wgmma_tiled(tree: LoopTree, stage: str, block: tuple[int, int] = (128, 256), groups: tuple[int, int] = (2, 1),
                k_tile: int = 64, stages: int = 0, copier: str = "cp.async") -> LoopTree:
    """A contraction on Hopper's tensor cores (wgmma): as `mma_tiled`, but the block's tile is split
    between groups[0] x groups[1] warpgroups (4 warps each, on thread.y), each computing its tile as 64 x N wgmma
    tiles (N its columns, at most 256) straight from the shared-memory tiles (k_tile * 2 bytes must be
    128 where A's k is contiguous); a pipeline's tiles are copied by `copier` ('cp.async' or 'tma')."""
    columns = block[1] // groups[1]
    fitting = [name for name, shape in TENSOR_INSTRUCTIONS.items()
               if shape["warps"] > 1 and columns % shape["n"] == 0]
    if not fitting:
        raise ValueError(f"a warpgroup's {columns} columns are not a multiple of 64 (wgmma tiles are 64 x N)")
    return _tensor_tiled(tree, stage, block, groups, k_tile, stages,
                         max(fitting, key=lambda name: TENSOR_INSTRUCTIONS[name]["n"]), copier)


TENSOR_FAMILIES = {"mma": TensorFamily("warp", MMA_WARPS, MMA_K_TILE, (16, 8), 32, mma_tiled),
                   "wgmma": TensorFamily("group", WGMMA_GROUPS, (WGMMA_K_TILE,), (64, 64), 128, wgmma_tiled,
                                         ("tma", "cp.async"))}


def _tensor_tiled(tree: LoopTree, stage: str, block: tuple[int, int], teams: tuple[int, int], k_tile: int,
                  stages: int, instruction: str, copier: str) -> LoopTree:
    """The schedule `mma_tiled` and `wgmma_tiled` describe: `teams` warps (or warpgroups) over the
    block's tile, each computing its part as unrolled tiles of `instruction`."""
    shape = TENSOR_INSTRUCTIONS[instruction]
    st = tree.program.stage(stage)
    m, n = [d for d in st.loop_dims if d not in st.reduce_dims][-2:]
    k, = st.reduce_dims
    batch = [d for d in st.loop_dims if d not in st.reduce_dims and d not in (m, n)]
    if len(batch) > 1:
        raise ValueError(f"mma_tiled binds one batch dim to block.z; stage {stage} has {batch}")
    acc = f"{stage}.acc"
    tree = tree.cache_write(stage).split(m, block[0], stage=stage).split(n, block[1], stage=stage)
    tree = tree.reorder(*batch, f"{m}.0", f"{n}.0", f"{m}.1", f"{n}.1", stage=stage)
    tree = tree.place(acc, stage, len(batch) + 2)
    tree = tree.split(k, k_tile, stage=acc).reorder(f"{k}.0", f"{m}.1", f"{n}.1", f"{k}.1", stage=acc)
    for load in _loads(st):     # placed before the warp splits: the copies keep whole rows of the tile
        tree = _copy_by_warps(tree, acc, load.buffer, (teams[0] * shape["warps"], teams[1]), len(batch) + 3)
    tiles = (f"{m}.1.1.1", f"{n}.1.1.1")
    for name in (stage, acc):
        for dim, warp, tile in ((m, block[0] // teams[0], shape["m"]), (n, block[1] // teams[1], shape["n"])):
            tree = tree.split(f"{dim}.1", warp, stage=name).split(f"{dim}.1.1", tile, stage=name)
        tree = tree.bind(f"{m}.1.0", "thread.y", stage=name).bind(f"{n}.1.0", "thread.z", stage=name)
        tree = tree.unroll(f"{m}.1.1.0", stage=name).unroll(f"{n}.1.1.0", stage=name)
    tree = tree.bind(f"{m}.0", "block.y", stage=stage).bind(f"{n}.0", "block.x", stage=stage)
    for dim in batch:
        tree = tree.bind(dim, "block.z", stage=stage)
    tree = tree.reorder(f"{m}.1.0", f"{n}.1.0", f"{m}.1.1.0", f"{n}.1.1.0", *tiles, stage=stage)
    tree = tree.split(f"{k}.1", shape["k"], stage=acc).unroll(f"{k}.1.0", stage=acc)
    tree = tree.reorder(f"{m}.1.0", f"{n}.1.0", f"{k}.1.0", f"{m}.1.1.0", f"{n}.1.1.0", *tiles, f"{k}.1.1", stage=acc)
    tree = tree.tensorize(tiles, instruction, stage=stage).tensorize((*tiles, f"{k}.1.1"), instruction, stage=acc)
    return tree.pipeline(f"{k}.0", stages, stage=acc, copier=copier) if stages >= 2 else tree


def _copy_by_warps(tree: LoopTree, acc: str, buffer: str, warps: tuple[int, int], depth: int) -> LoopTree:
    """Stage `buffer`'s tile of one k step in shared memory (in its own layout), copied by the block's
    warps with 16-byte vectors along its contiguous dim, lanes on the chunks of a row (or on rows), warps
    sharing the rest."""
    dims = _layout(tree.program, buffer)
    copy = f"{buffer}.{acc}"
    tree = tree.cache(buffer, stage=acc, order=dims).place(copy, acc, depth)
    width = 16 // ITEM_BYTES[tree.buffers[buffer].dtype]
    inner = [lp for lp in tree.schedule.of(copy).loops if lp.dim == dims[-1]][-1]
    if inner.extent > width:
        tree = tree.split(inner.name, width, stage=copy)
        inner = next(lp for lp in tree.schedule.of(copy).loops if lp.name == f"{inner.name}.1")
    loops = [lp for lp in tree.schedule.of(copy).loops if lp.name != inner.name]
    # lanes along the rows of the tile, unless its rows hold 4 or more 16-byte chunks: lanes then take
    # the chunks, so each copy instruction reads whole 32-byte sectors
    chunks = [lp for lp in loops if lp.dim == dims[-1] and lp.extent >= 4]
    rows = max((lp for lp in loops if lp.dim != dims[-1]), key=lambda lp: lp.extent)
    lanes = chunks[-1] if chunks else rows
    if lanes.extent > WARP_LANES:
        tree = tree.split(lanes.name, WARP_LANES, stage=copy)
        lanes = next(lp for lp in tree.schedule.of(copy).loops if lp.name == f"{lanes.name}.1")
    bound = [(lanes.name, "thread.x")]
    for axis, size in (("thread.y", warps[0]), ("thread.z", warps[1])):
        free = [lp for lp in tree.schedule.of(copy).loops if lp.name not in (inner.name, *(n for n, _ in bound))]
        if size == 1 or not free:
            continue
        # a loop of the copy on every thread axis of the block, so no two warps write the same element
        spare = max(free, key=lambda lp: (lp.extent % size == 0 and lp.extent >= size, lp.extent))
        tree = tree.split(spare.name, -(-spare.extent // size), stage=copy)
        bound.append((f"{spare.name}.0", axis))
    rest = [lp.name for lp in tree.schedule.of(copy).loops if lp.name not in (inner.name, *(n for n, _ in bound))]
    tree = tree.reorder(*(name for name, _ in bound), *rest, inner.name, stage=copy)
    for name, axis in bound:
        tree = tree.bind(name, axis, stage=copy)
    for name in rest:
        tree = tree.unroll(name, stage=copy)
    return tree.vectorize(inner.name, stage=copy)
