"""The search space: schedules of a loop tree, drawn with Optuna's define-by-run API.

On a CPU the space is centred on the automatic schedule for the target: every decision the
automatic scheduler makes (register tile rows and columns, reduction and cache blocks, the loop
order of a contraction, packing, placement of producers, the parallel loop, vector widths) is a
parameter named by stage and dim, drawn from the value the scheduler chose and its neighbours
(`looptool.autoschedule.automatic_choices`): a quarter to four times a block, two rows or two
vectors more or less, the orders one swap away.  The same rules then build the schedule from the drawn
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
from looptool.autoschedule.gpu import (TENSOR_START, accumulator, atomic_parts_total, contraction_dtype,
                                       float32_block, float32_plan, holds_block_tile,
                                       mma_tiled, persistent_grid, register_tiled, resident_grid, stage_bytes,
                                       tile_dims, transposable, transposed_ahead, wgmma_start, wgmma_tiled)
from looptool.codegen import gpu as codegen_gpu
from looptool.runtime import gpu as runtime_gpu
from looptool.schedule import LoopTree


class InvalidDraw(ValueError):
    """A drawn combination of transforms that the schedule API refused."""


def sample(trial: optuna.Trial, tree: LoopTree, threads: int = 1, target: Target | None = None) -> LoopTree:
    """Draw one schedule of `tree`'s program for `target` (default: this CPU) on `threads` cores
    (illegal ones are possible: the caller checks them)."""
    target = (target or host()).with_cores(threads)
    centre = centre_of(tree.program, target)

    def pick(name: str, value, options: tuple):
        choice = centre.get(name)
        if choice is None:
            return value
        labels = [categorical(option) for option in choice.options]
        return choice.options[labels.index(trial.suggest_categorical(name, labels))]
    try:
        return autoschedule.drawn_tree(tree.program, target, pick)
    except ValueError as err:
        raise InvalidDraw(str(err)) from None


def automatic_params(program: ir.Program, threads: int = 1, target: Target | None = None) -> dict:
    """The parameters of the space's centre: drawn, they give the automatic schedule."""
    centre = centre_of(program, (target or host()).with_cores(threads))
    return {name: categorical(choice.value) for name, choice in centre.items()}


def categorical(option):
    """A choice as an Optuna parameter value: a dynamic extent (`ir.Size`, 'the whole dim') by its name,
    since as an int it equals its representative size, another option that Optuna would confuse it with."""
    return str(option) if isinstance(option, ir.Size) else option


@functools.lru_cache(maxsize=32)
def centre_of(program: ir.Program, target: Target) -> dict[str, autoschedule.Choice]:
    """The automatic scheduler's choices for `program` on `target` (computed once per process)."""
    return autoschedule.automatic_choices(program, target)


def _loads(stage):
    return list(ir.loads(stage.expr))


def _choose(trial: optuna.Trial, name: str, options: list[int]) -> int:
    return trial.suggest_categorical(name, options or [1])


# GPU --------------------------------------------------------------------------------------------
GPU_SPACE_VERSION = 2          # in GPU study names: Optuna refuses a stored study whose choices changed (2: k 64)
GPU_THREADS_X = (8, 16, 32, 64, 128)
GPU_THREADS_Y = (1, 2, 4, 8, 16, 32)
GPU_REGISTER_TILE = (1, 2, 4, 8, 16)
GPU_ROW_GROUPS = (1, 2, 4)       # runs a thread's rows come in (register_tiled's y_groups)
GPU_K_TILE = (4, 8, 16, 32, 64)
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
    'mma' (a contraction of two bfloat16 or float16 tensors, alone or with pointwise stages after it)
    runs it on tensor cores (`mma_tiled`: block tile, warps, k tile, pipeline stages), and on Hopper so
    does 'wgmma' (`wgmma_tiled`: block tile, warpgroups, pipeline stages); the pointwise stages (a bias,
    relu, a cast) are computed in its write-back (`epilogue`). Split-k's float32 parts (`atomic_parts_total`)
    draw only 'tiles' (their sum placed in rows of the result was never legal)."""
    try:
        stages = [st.name for st in tree.program.stages]
        total = atomic_parts_total(tree.program, stages[0])      # split-k's parts added into it: not tiled apart
        if len(stages) > 1 and total is None and trial.suggest_categorical("gpu.family", ["tiles", "rows"]) == "rows":
            return _gpu_rows(trial, tree)
        contraction = half_contraction(tree.program)
        family = contraction and trial.suggest_categorical("gpu.tensor.family", tensor_families())
        if family in TENSOR_FAMILIES:
            tree = _gpu_tensor(trial, tree, family, contraction)
            for stage in stages[1:]:
                tree = tree.epilogue(stage)
            return tree
        for stage in stages:
            if stage != total:
                tree = _gpu_tiles(trial, tree, stage, summed_by=total if stage == stages[0] else None)
        _check_block_size(tree)
    except ValueError as err:
        raise InvalidDraw(str(err)) from None
    return tree


def half_contraction(program: ir.Program) -> str | None:
    """The stage a tensor-core family runs: a program's first stage where it sums the product of two
    bfloat16 (or two float16) tensors and every later stage is pointwise (an epilogue); else None."""
    first = program.stages[0]
    if contraction_dtype(program, first.name) not in ("bfloat16", "float16"):
        return None
    return None if any(st.reduce_dims for st in program.stages[1:]) else first.name


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


def _gpu_tensor(trial: optuna.Trial, tree: LoopTree, family: str, stage: str) -> LoopTree:
    """Draw block tile, teams, k tile and stages of a tensor-core family and build its schedule of `stage`."""
    spec = TENSOR_FAMILIES[family]
    st = tree.program.stage(stage)
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
    shared = stage_bytes(block, k_tile, 2) * max(stages, 1)
    if shared > mma_shared_limit():
        raise ValueError(f"{shared} bytes of shared memory a block (at most {mma_shared_limit()})")
    gpu = _gpu()
    if copier == "tma" and stages and gpu is not None and _choose(trial, f"gpu.{family}.persistent", [False, True]):
        persistent = resident_grid(gpu, block, k_tile, stages, 2)
        return spec.build(tree, st.name, block, teams, k_tile, stages, copier, persistent=persistent)
    return spec.build(tree, st.name, block, teams, k_tile, stages, copier)


def gpu_start_params(program: ir.Program) -> dict:
    """The GPU space's first draw for a contraction (a study starts there, as a CPU study starts from
    the automatic schedule): for a half-precision contraction, with an epilogue or not (`half_contraction`),
    the best tensor-core family of this GPU (wgmma on Hopper, else mma) with the block, teams, k tile,
    stages and copier of the automatic schedule (`wgmma_start`) or of bench.gpu's fastest mma schedule;
    for float32 (a product alone, or split-k's parts added atomically) the automatic register-tile schedule
    (`_tiles_start`) where the matrices hold one block tile; {} for other programs."""
    first = program.stages[0].name
    if contraction_dtype(program, first) == "float32" \
            and (len(program.stages) == 1 or atomic_parts_total(program, first)):
        return _tiles_start(program, first)
    contraction = half_contraction(program)
    if contraction is None:
        return {}
    family = tensor_families()[-1]
    spec, (block, teams, k_tile, stages, copier) = TENSOR_FAMILIES[family], TENSOR_START[family]
    if family == "wgmma":          # the automatic schedule's template for this GPU
        block, teams, k_tile, stages, copier = wgmma_start(program, contraction, _gpu())
    st = program.stage(contraction)
    m, n = [d for d in st.loop_dims if d not in st.reduce_dims][-2:]
    params = {"gpu.family": "tiles"} if len(program.stages) > 1 else {}
    params |= {"gpu.tensor.family": family, f"gpu.{family}.block.{m}": block[0], f"gpu.{family}.block.{n}": block[1],
               f"gpu.{family}.{spec.team}s.{m}": teams[0], f"gpu.{family}.{spec.team}s.{n}": teams[1],
               f"gpu.{family}.stages": stages}
    if len(spec.k_tiles) > 1:
        params[f"gpu.{family}.k.tile"] = k_tile
    if len(spec.copiers) > 1:
        params[f"gpu.{family}.copier"] = copier
    if copier == "tma":
        params[f"gpu.{family}.persistent"] = bool(persistent_grid(program, contraction, _gpu(), block, k_tile, stages, copier))
    return params


def _tiles_start(program: ir.Program, stage: str) -> dict:
    """The automatic schedule's register tiles of the float32 contraction `stage` on this GPU as this space's
    parameters: its block (`float32_block`), threads and tiles (`float32_plan`), and which inputs it copies
    as stored or transposes ahead (`float32_copies`); {} where the matrices hold no block tile."""
    st = program.stage(stage)
    block = float32_block(program, stage, _sm_count())
    tree = LoopTree(program)
    tiles = float32_plan(tree, stage, block, _gpu())
    if not holds_block_tile(program, stage, tiles):
        return {}
    ahead, stored = tiles["ahead"], tiles["stored"]
    params = {"vector": tiles["vector"], "x.threads": tiles["x_threads"], "x.tile": tiles["x_groups"],
              "y.threads": tiles["y_threads"], "y.tile": tiles["y_tile"], "y.groups": tiles["y_groups"],
              "k.tile": tiles["k_tile"], "k.unroll": True, "stages": tiles["stages"]}
    for buffer in sorted({ld.buffer for ld in _loads(st) if ld.buffer.startswith("in")}):
        params |= {f"shared.{buffer}": True, f"as_stored.{buffer}": buffer in stored}
        if buffer not in stored and transposable(tree, stage, buffer):
            params[f"ahead.{buffer}"] = buffer in ahead
    return {f"{stage}.gpu.{name}": value for name, value in params.items()}


def _gpu():
    """The current GPU (`runtime.gpu.gpu_target`), or None where there is no GPU."""
    try:
        return runtime_gpu.gpu_target()
    except (RuntimeError, ImportError):
        return None


def _sm_count() -> int | None:
    """The current GPU's SM count, or None where there is no GPU."""
    gpu = _gpu()
    return gpu and gpu.sms


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


def _check_block_size(tree: LoopTree):
    for nodes in codegen_gpu.kernel_nodes(tree.root):
        codegen_gpu.launch_dims(nodes)


def _gpu_tiles(trial: optuna.Trial, tree: LoopTree, stage: str, summed_by: str | None = None) -> LoopTree:
    """Draw `stage`'s register tiles (`register_tiled`; with `summed_by`, split-k's parts added into that
    stage atomically, as the automatic schedule runs them)."""
    st = tree.program.stage(stage)
    if not st.dims:
        return tree
    x, y, _ = tile_dims(st)
    x_size = tree.program.size(x)
    vector = trial.suggest_categorical(f"{stage}.gpu.vector", [1, 4]) if x_size % 4 == 0 else 1
    x_threads = _choose(trial, f"{stage}.gpu.x.threads", [t for t in GPU_THREADS_X if t <= x_size])
    x_groups = _choose(trial, f"{stage}.gpu.x.tile", [1, 2])
    y_threads, y_tile, y_groups = 1, 1, 1
    if y is not None:
        y_size = tree.program.size(y)
        y_threads = _choose(trial, f"{stage}.gpu.y.threads", [t for t in GPU_THREADS_Y if t <= y_size])
        y_tile = _choose(trial, f"{stage}.gpu.y.tile", [t for t in GPU_REGISTER_TILE if t <= y_size])
        y_groups = _choose(trial, f"{stage}.gpu.y.groups", list(GPU_ROW_GROUPS))     # the same choices in every
        if y_tile % y_groups:                                                         # trial (Optuna requires it)
            raise ValueError(f"{y_tile} rows a thread do not come in {y_groups} runs")
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
        ahead = tuple(b for b in shared if b not in as_stored and transposable(tree, stage, b)
                      and trial.suggest_categorical(f"{stage}.gpu.ahead.{b}", [False, True]))
        for b in ahead:
            tree = transposed_ahead(tree, stage, b, block_rows=y_threads * y_tile)
        shared = tuple(f"{b}.{stage}" if b in ahead else b for b in shared)
        as_stored = as_stored + tuple(f"{b}.{stage}" for b in ahead)
    tree = register_tiled(tree, stage, x_threads, x_groups, vector, y_threads, y_tile, k_tile, unroll_k, shared,
                          as_stored, y_groups=y_groups, summed_by=summed_by)
    if shared and len(st.reduce_dims) == 1:
        stages = _choose(trial, f"{stage}.gpu.stages", list(GPU_TILE_STAGES))
        if stages:
            tree = tree.pipeline(f"{st.reduce_dims[0]}.0", stages, stage=accumulator(stage, summed_by))
    return tree


def _gpu_rows(trial: optuna.Trial, tree: LoopTree) -> LoopTree:
    output = tree.program.output
    if len(output.dims) < 2:
        raise ValueError("the rows family needs an output with at least two dims")
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
        left = [d for d in stage.loop_dims if any(lp.dim == d for lp in tree.schedule.of(stage.name).loops)]
        if left:                    # one loop to thread.x: a GPU index runs one loop of a nest
            tree = _threads_over(tree, stage.name, left[-1], threads)
    return tree


def _threads_over(tree: LoopTree, stage: str, dim: str, threads: int) -> LoopTree:
    """Threads take strided elements of `dim` (coalesced): thread t handles t, t + threads, ..."""
    loop = next(lp.name for lp in tree.schedule.of(stage).loops if lp.dim == dim)
    tree = tree.split(loop, threads, stage=stage)
    return tree.reorder(f"{loop}.1", f"{loop}.0", stage=stage).bind(f"{loop}.1", "thread.x", stage=stage)


TENSOR_FAMILIES = {"mma": TensorFamily("warp", MMA_WARPS, MMA_K_TILE, (16, 8), 32, mma_tiled),
                   "wgmma": TensorFamily("group", WGMMA_GROUPS, (WGMMA_K_TILE,), (64, 64), 128, wgmma_tiled,
                                         ("tma", "cp.async"))}

