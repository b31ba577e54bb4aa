"""The automatic GPU scheduler: a schedule for any program, from its structure and the GPU's facts.

Contractions whose matrices hold a block tile take the measured templates of `autoschedule.gpu`.
Every other program is scheduled by these rules, each written into `explain()`:

- **Rows** (softmax, layer norm: reductions over one dim `r` feeding a pointwise result over the same
  rows) run as one kernel: the reductions are placed inside the result's loop over the rows. Where `r`
  is the contiguous dim, a block takes a row and its threads stride along it, reductions combined
  across the threads; otherwise each thread takes a column and walks `r` itself.
- **Pointwise** stages: 16-byte vectors along the contiguous dim, `BLOCK_THREADS` threads a block
  (rows of a narrow array share a block), the rest over the grid; a transpose through shared-memory
  tiles, read along the input's rows and written along the result's.
- **Reductions along the contiguous dim**: a block an output, its threads striding along the dim and
  combining their partials; **along any other dim**: a thread an output, coalesced along the kept
  contiguous dim. Where that leaves the GPU idle (fewer blocks or threads than the SMs keep in flight:
  a dot product, a sum over a tall matrix's rows), the reduction is first split (`rfactor`) into
  independent partial results, reduced again by a second kernel.
- A schedule the legality check refuses falls back to the next rule, and finally to one output
  element per thread (`default_gpu_tree`).
"""
from __future__ import annotations

import math

from .. import ir
from ..analysis.gpu_target import WARP_LANES, GpuTarget
from ..schedule import LoopTree
from . import gpu as templates
from .structure import load_strides

BLOCK_THREADS = 256          # 8 warps: 8 blocks fill an SM of 2048 threads, and a block's warps hide each other
MAX_BLOCK_THREADS = 1024
UNROLL_WHOLE = 8            # inner reduction loops this short are unrolled whole when walked
WALK_UNROLL = 4             # copies of a reduction loop's body a thread walking it alone runs at once
# elements a thread striding along a row takes, at most, to have them unrolled; and the elements a row gives
# each thread per pass (which sets the threads a row gets). H100, session 14, --knob row_share (8/8 -> 32/32):
# softmax 8192^2 0.214 -> 0.194 ms, 1000x3001 18.2 -> 17.7 us, 256x20000 30.1 -> 29.1 us; row sums 8192^2
# 0.109 -> 0.094 ms; layer norms and dot products unchanged. Fewer threads a row keep more rows in flight.
STRIDED_UNROLL = 32
ROW_ELEMENTS_PER_THREAD = 32
ROWS_IN_TURN = True          # (`rows_in_turn`)
# ... the share of the L2 cache the rows resident at once may hold (H100, session 33, --knob turn_l2_share, x torch at
# 0.5 / 0.7 / 0.9: softmax 256x100000 0.80 / 0.83 / 0.84, 512x65536 1.07 / 1.11 / 1.11, 2048x50257 1.15 / 1.16 / 1.17,
# layer norm 256x100000 1.74 / 1.79 / 1.79)
TURN_L2_SHARE = 0.7
# ... and each thread of such a block (alone on its SM, or nearly) unrolls its walk this many times, not LONG_ROW_UNROLL
# (H100, session 33, --knob in_turn_unroll, x torch at 8 / 16 / 32: softmax 256x100000 0.83 / 0.96 / 0.98,
# 2048x50257 1.15 / 1.25 / 1.09, layer norm 256x100000 1.79 / 1.90 / 1.92, 2048x50257 2.00 / 2.12 / 2.06)
IN_TURN_UNROLL = 16
LONG_ROW_UNROLL = 8          # a row too long for that: its loop unrolled this many times, loads in flight a thread
                             # (H100, session 18, --knob long_row_unroll: softmax 2048x50257 0.695 -> 0.632 ms at 8)
SHARE_ROW_VALUES = True      # a row group's exp computed once (`share`; --knob share_row_values)
WEIGHTED_ROW_ELEMENTS = 8    # ... where the row's block also walks a weighted sum (attention 1024x64: 39.9 us, 44.4 at 32)
ROW_WALK_UNROLL = 16        # ... where the walk is a whole row (attention's p . v): its loads come from L2
# the most the walks in blocks of a row (attention's p . v) read besides their rows, an SM; above it the rows'
# factor is written whole and the product is a contraction of its own (H100, --knob walk_bytes_per_sm: 4096 x 64
# 0.64 -> 0.39 ms at 32 MiB an SM; 1024 x 64 stays fused, 0.041 against 0.084), which `.cuda()` runs as a program
# of its own (`weights_apart`: split-k then fills the SMs; session 18, 2048 x 128, 15.5 MiB an SM: see docs/gpu.md).
# Session 22, H200, through `.cuda()`, x torch at 8 / 2 MiB: 2048 x 32 (3.9 MiB an SM) 0.70 / 0.94, 2048 x 64
# 0.82 / 1.17 (a narrow v is walked by as few threads as it is wide); 1024 x 64, 1000 x 64, 512 x 32 and 333 x
# 64 stay fused (their times within 2 %; apart, 512 x 32 and 333 x 64 lost 27 and 37 %)
WALK_BYTES_PER_SM = 2 << 20
# rows at least FEW_ROWS_SPLIT long, at most one an FEW_ROWS_SMS SMs, are not fused (`few_long_rows`; 0: never).
# H100, session 22, x torch fused / split: softmax 7x777777 0.84 / 4.15, 4x3000000 0.54 / 10.7, 1x10^7 0.82 / 35,
# 16x200000 0.72 / 1.38 (layer norm 5.2 / 6.1); kept fused: 32x100000 (softmax 0.77 / 0.90 but layer norm
# 4.3 / 3.7), 60x65536 (softmax 0.88 / 0.61, layer norm 4.4 / 2.0)
FEW_ROWS_SPLIT = 1 << 16
FEW_ROWS_SMS = 8
FUSED_SUM_TERMS = 32         # a reduction this short, read only by a pointwise stage, is summed in its threads
THREAD_TILE_ROWS = 4         # outputs along a second dim a thread walking a reduction takes at once
SCALAR_RUN = 4               # elements a thread takes where rows hold no whole vectors
TRANSPOSE_TILE = WARP_LANES      # a transposed tile's side: a warp reads a row of it, and writes a column
TRANSPOSE_ROWS_A_THREAD = 4  # rows of a transposed tile each thread copies and writes (loads in flight)
BLOCK_CHUNK = BLOCK_THREADS * 8      # the least a block's partial result sums (8 loads in flight a thread)
THREAD_CHUNK = 8             # the least a thread's partial result sums
# a split reduction's final sum of at least LONG_ROW partials an output takes a block an output where a thread an
# output (or a vector of them) would leave the GPU fewer warps an SM than this (H100, session 33, --knob
# final_warps_an_sm, x torch at 0 / 1: column sum 200000x50 0.27 / 1.51, its 50 threads each adding 2500 partials
# alone before; 3001x1000 0.92 / 1.13; 4 as 1)
FINAL_WARPS_AN_SM = 1
# a reduction along rows at least this long takes a block a row; shorter rows, a thread a row (one warp a
# row was one block of 32 threads for 2-4 elements a lane: H100, bench.gpu_rules_variants --knob long_row,
# row sum 100000x77 0.068 ms at 32 against 0.023 at 128; rows of 300 and more unchanged)
LONG_ROW = 4 * WARP_LANES
THREAD_ROWS_BELOW = WARP_LANES   # softmax-like rows shorter than this run a thread a row (`fused_rows`)
# softmax-like rows a warp takes alone (at most 32 elements a lane) shorter than this go a warp a row, several rows
# a block (`rows_by_warp`; H100, session 32, --knob warp_rows_below, x torch with a block of one warp taking 4 rows
# in turn / a warp a row / also rows up to 1024: softmax 65536x33 0.76 / 1.04 / 1.05, 65536x48 0.77 / 0.99 / 1.00,
# 32768x100 0.93 / 1.10 / 1.10, 32768x127 0.94 / 1.11 / 1.10, 8192x1000 1.08 / 1.08 / 0.77, layer norm 65536x64
# 4.64 / 5.98 / 6.09, 8192x1024 1.39 / 1.38 / 1.13). Session 33 (x torch, below 128 / 257 / 513; rows of 128 and more
# had a block of one warp): softmax 4096x200 0.89 / 1.11 / 1.10, 8192x300 0.99 / 0.97 / 1.16, 16384x512 1.02 / 1.02 /
# 1.02, 32768x512 1.02 / 1.01 / 0.98, layer norm 10000x200 1.92 / 2.49 / 2.41; plain sums too (`summed_by_warps`)
WARP_ROWS_BELOW = 512
# ... and rows shorter than this half a warp a row, two rows a warp (`rows_by_warp`; H100, session 33, --knob
# half_warp_rows_below, x torch at 0 / 65: softmax 65536x33 1.00 / 1.16, 65536x48 0.98 / 1.22, 65536x64 1.05 / 1.15,
# layer norm 65536x64 5.79 / 6.37; a warp a row took 200 SASS instructions a row of 48, half a warp 144)
HALF_WARP_ROWS_BELOW = 65
ROW_VECTORS = True           # a thread's short row moved in vectors (`row_vectors`)
# ... and one that holds none read and written through shared memory, this many rows a block (`rows_staged`; 0:
# not), where they take at most STAGED_SHARED_SHARE of it (H100, session 31, --knob staged_rows, x torch at 0 /
# 128 / 256: softmax 100000x31 0.30 / 1.14 / 1.14, x17 0.58 / 1.34 / 1.30, x25 0.38 / 1.26 / 1.19, x13 0.64 / 1.02 /
# 1.12, 1000000x31 0.20 / 0.93 / 0.86; layer norm 100000x31 7.8 / 33.7 / 32.6)
STAGED_ROWS = 128
STAGED_SHARED_SHARE = 0.3
ROW_SHARED_SHARE = 0.25      # of a block's shared memory, the most a row kept there may take (H100, session
                             # 13, --knob row_shared_share: 0.95 made softmax 2048x50257 0.70 -> 1.01 ms and
                             # 256x20000 0.035 -> 0.048 ms; re-reading a long row through L2 is faster)


def gpu_tree(program: ir.Program, gpu: GpuTarget) -> LoopTree:
    """The automatic schedule of `program` on `gpu`; `explain()` on the result gives the reasons. A program
    with dynamic dims takes a rule's schedule only where it serves every size (`sized_at_launch`)."""
    reasons = [gpu.describe()]
    for label, rule in RULES.items():
        planner = _Planner(program, gpu)
        try:
            tree = rule(planner)
        except ValueError as err:          # a rule's transform that does not apply to this program
            reasons.append(f"{label}: not applicable ({err})")
            continue
        if tree is None:
            continue
        if program.dynamic and not sized_at_launch(tree):
            reasons.append(f"{label}: would run a dynamic extent on threads or unrolled (`sized_at_launch`)")
            continue
        legal, why = tree.check()
        if legal:
            return LoopTree(tree.program, tree.schedule, tuple(reasons + planner.reasons + dynamic_reason(program)))
        reasons.append(f"{label}: refused by the legality check ({why})")
    reasons.append("one output element per thread: no rule applied")
    tree = default_gpu_tree(program)
    return LoopTree(tree.program, tree.schedule, tuple(reasons + dynamic_reason(program)))


def weights_apart(program: ir.Program, gpu: GpuTarget) -> ir.Apart | None:
    """A program ending in a weighted sum (an attention head's softmax times v) as its weights and the sum
    (`ir.weights_apart`), two programs run one after the other, where walking the sum in the weights'
    rows would read more than WALK_BYTES_PER_SM an SM besides them: the sum then runs on the matrix
    templates, split along its reduction where its blocks leave SMs idle. None where it walks in the rows."""
    apart = ir.weights_apart(program)
    if apart is None:
        return None
    weights, other = apart.product.inputs
    rows = math.prod(weights.shape) // program.size(program.output.reduce_dims[0])
    return apart if walks_too_far(math.prod(other.shape) * templates.ITEM_BYTES[other.dtype] * rows, gpu) else None


def walks_too_far(walk: int, gpu: GpuTarget) -> bool:
    """Whether a weighted sum walked in its weights' rows, reading `walk` bytes besides them over all
    rows, reads more than WALK_BYTES_PER_SM an SM: then the weights are computed whole first."""
    return walk > WALK_BYTES_PER_SM * gpu.sms


def dynamic_reason(program: ir.Program) -> list[str]:
    """The reason a dynamic program's schedule serves every size, for `explain()`."""
    if not program.dynamic:
        return []
    dims = [dim for dim, _ in program.dynamic]
    return [f"dynamic dims {dims}: their outer loops over blocks (their counts set at launch) or in a thread's "
            f"own walk; tiles cut by a tail at a dynamic size test it against the size the kernel takes"]


def sized_at_launch(tree: LoopTree) -> bool:
    """Whether every loop whose extent is set at run time (`ir.Size`: a dynamic dim, or the outer loop of
    its split) runs on a block axis or as a plain loop a thread walks: threads, unrolled and vectorized
    loops need their counts when the kernel is built. A split's inner loops keep a fixed extent; their tail
    at the run-time size is tested against the size the kernel takes."""
    return all(not isinstance(lp.extent, ir.Size) or lp.annotation.startswith("block.") or not lp.annotation
               for stage in tree.program.stages for lp in tree.schedule.of(stage.name).loops)


def default_gpu_tree(program: ir.Program) -> LoopTree:
    """The simplest GPU schedule (and the tuner's reference): one output element per thread,
    `BLOCK_THREADS // 2` threads a block along each stage's contiguous dim, its other pure dims (up
    to two) over blocks."""
    tree = LoopTree(program)
    for stage in program.stages:
        pure = [d for d in stage.loop_dims if d not in stage.reduce_dims]
        if not pure:
            continue
        x = stage.dims[-1]
        tree = tree.split(x, BLOCK_THREADS // 2, stage=stage.name).bind(f"{x}.0", "block.x", stage=stage.name) \
            .bind(f"{x}.1", "thread.x", stage=stage.name)
        outer = [d for d in pure if d != x][-2:]
        for dim, axis in zip(reversed(outer), ("block.y", "block.z")):
            tree = tree.bind(dim, axis, stage=stage.name)
        tree = tree.reorder(*outer, f"{x}.0", f"{x}.1", stage=stage.name)
    return tree


def _fused_rows(planner: "_Planner") -> LoopTree | None:
    return planner.fused_rows()


def _per_stage(planner: "_Planner") -> LoopTree:
    """Each stage by its own rule, in order; stages a rule makes (copies, partial results) are that
    rule's to schedule."""
    done: set[str] = set()
    while True:
        todo = [st.name for st in planner.tree.program.stages if st.name not in done]
        if not todo:
            return planner.tree
        planner.schedule_stage(todo[0])
        done |= {todo[0]} | ({st.name for st in planner.tree.program.stages} - set(todo))


RULES = {"fused rows": _fused_rows, "per stage": _per_stage}     # tried in this order


def contiguous_dim(program: ir.Program, stage: ir.Stage) -> str | None:
    """The loop dim along which the stage's largest input is contiguous (stride 1), if any."""
    loads = sorted(ir.loads(stage.expr), key=lambda ld: -math.prod(program.buffer_shape(ld.buffer)))
    for load in loads:
        unit = [d for d, s in load_strides(program, load).items() if abs(s) == 1 and d in stage.loop_dims]
        if unit:
            return unit[0]
    return None


def in_rows(stage: ir.Stage, row: str, outer: list[str]) -> bool:
    """Whether `stage` can run in the rows of a row group: it reduces `row` to dims of `outer`, or is
    pointwise over `row` and those dims (a value a later reduction of the group reads)."""
    if stage.reduce_dims:
        return stage.reduce_dims == (row,) and set(stage.dims) <= set(outer)
    return set(stage.dims) <= set(outer) | {row}


def k_last_where_unaligned(tree: LoopTree, stage: str) -> tuple[LoopTree, dict[str, str]]:
    """`tree` with each operand of contraction `stage` whose rows (its last dim, not k) are not whole 16-byte vectors
    copied ahead with k last (`cache`), where k is whole vectors: TMA addresses only rows on 16-byte boundaries, and
    a k-major operand suits wgmma as well. A pad copy is done in that copy (`inline`). Also {operand: its copy}."""
    program = tree.program
    st = program.stage(stage)
    k = st.reduce_dims[0]
    relaid = {}
    for load in dict.fromkeys(ir.loads(st.expr)):
        dims, shape = program.buffer_dims(load.buffer), program.buffer_shape(load.buffer)
        item = templates.ITEM_BYTES[load.dtype]
        aligned = shape[-1] * item % templates.VECTOR_BYTES == 0
        if dims[-1] == k or aligned or program.size(k) * item % templates.VECTOR_BYTES:
            continue
        tree = tree.cache(load.buffer, stage=stage, order=tuple(d for d in dims if d != k) + (k,))
        if load.buffer in {s.name for s in program.stages}:
            tree = tree.inline(load.buffer)
        relaid[load.buffer] = f"{load.buffer}.{stage}"
    return tree, relaid


def _dividing(size: int, factor: int, multiple: int = 1) -> int:
    """The least divisor of `size` from `factor` up to twice it (blocks with no ragged end, whose reads need
    no guard and stay vectors), one that is a multiple of `multiple` first (a walk unrolled that many times
    then has no remainder), else `factor`."""
    divisors = [f for f in range(factor, min(2 * factor, size) + 1) if size % f == 0]
    return next((f for f in divisors if f % multiple == 0), divisors[0] if divisors else factor)


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


class _Planner:
    """Applies the rules stage by stage, keeping the tree and the reasons so far."""

    def __init__(self, program: ir.Program, gpu: GpuTarget):
        self.tree = LoopTree(program)
        self.gpu = gpu
        self.reasons: list[str] = []
        self.scheduled: set[str] = set()      # stages a rule scheduled ahead of their turn

    def note(self, stage: str, text: str):
        self.reasons.append(f"{stage}: {text}")

    def size(self, dim: str) -> int:
        return self.tree.program.size(dim)

    # Rows: reductions placed inside the pointwise result over the same rows ---------------------------
    def fused_rows(self) -> LoopTree | None:
        """Softmax-like programs as one kernel: the stages just before the result that reduce over one
        dim `row` (the result's, or the one it keeps) to dims the result has, placed inside the result's
        loop over its rows; stages before them by their own rules. None where the program ends otherwise."""
        program = self.tree.program
        result, earlier = program.output, list(program.stages[:-1])
        if len(result.reduce_dims) > 1 or not earlier:
            return None
        row = result.reduce_dims[0] if result.reduce_dims else \
            (earlier[-1].reduce_dims[0] if len(earlier[-1].reduce_dims) == 1 else None)
        outer = [d for d in result.dims if d != row]
        group = []
        while earlier and (in_rows(earlier[-1], row, outer) if group else earlier[-1].reduce_dims == (row,)):
            group.insert(0, earlier.pop())
        if row is None or not group or (not result.reduce_dims and row not in result.dims):
            return None
        # rows shorter than a warp go a thread a row: a block a row would leave lanes idle and give each
        # row a block of its own (softmax 100000x10 on an H200: 0.20x torch)
        contiguous = contiguous_dim(program, result) == row
        by_block = (contiguous and self.size(row) >= THREAD_ROWS_BELOW) or not outer
        if by_block and self.few_long_rows(outer, row):
            return None
        if not contiguous and self.threads_too_few(math.prod(map(self.size, outer)), self.size(row)):
            return None            # a thread a column would leave the GPU idle: each stage by its own rules, split
        if by_block and self.size(row) <= STRIDED_UNROLL * self.row_threads(row):
            group = self.shared_values(group)
        for stage in earlier:
            self.schedule_stage(stage.name)
        shared = [d for d in outer if any(d in st.dims for st in group)]
        inner = [d for d in outer if d not in shared]
        if by_block:
            return self.rows_by_block(self.tree.program.output, group, row, shared, inner)
        return self.rows_by_thread(result, group, row, outer)

    def few_long_rows(self, outer: list[str], row: str) -> bool:
        """Whether a block a row would leave most SMs idle on rows long enough to split (at most an
        SM in FEW_ROWS_SMS has a row, each at least FEW_ROWS_SPLIT long): each stage then runs by its own
        rules, the reductions split across blocks (`split_reduction`)."""
        rows = math.prod(self.size(d) for d in outer)
        return FEW_ROWS_SPLIT and FEW_ROWS_SMS * rows <= self.gpu.sms and self.size(row) >= FEW_ROWS_SPLIT

    def shared_values(self, group: list[ir.Stage]) -> list[ir.Stage]:
        """The group with each exp (log, tanh, erf) that a reduction of it and later stages both compute made a
        stage of its own (`share`: a softmax's exp(x - max), once a value instead of twice), placed in the
        rows with the rest. Only for rows whose threads' slices are unrolled, so they stay in registers (H100,
        --knob share_row_values: softmax 1000x3001 20.5 -> 15.0 us, 256x20000 29.4 -> 24.1 us; a row of
        50257, kept in memory, 0.70 -> 1.01 ms)."""
        for stage in [st.name for st in group if st.reduce_dims and SHARE_ROW_VALUES]:
            try:
                self.tree = self.tree.share(stage)
            except ValueError:
                continue
            self.note(stage, f"its exp (or other costly value) computed once, into {stage}.e, which later passes read")
        names = {st.name for st in group} | {f"{st.name}.e" for st in group}
        return [st for st in self.tree.program.stages if st.name in names]

    def rows_by_block(self, result: ir.Stage, group, row: str, shared: list[str], inner: list[str]) -> LoopTree:
        """A block a row (the `shared` dims); the group's threads stride along it and combine. The result
        does too where it is pointwise or reduces the row alone; where it also keeps `inner` dims, its
        threads take the last of them and walk the row, the factor of its product that leaves them out
        (attention's softmax) computed once for the row first (`hoist`), into shared memory."""
        name = result.name
        weighted = bool(result.reduce_dims and inner)
        threads = self.row_threads(row, WEIGHTED_ROW_ELEMENTS if weighted else ROW_ELEMENTS_PER_THREAD)
        walk = self.walk_bytes(result, inner) * math.prod(self.size(d) for d in shared) if weighted else 0
        if walks_too_far(walk, self.gpu):
            kept = self.tree, list(self.reasons)
            split = self.rows_then_product(result, group, row, shared, walk)
            if split is not None:
                return split
            self.tree, self.reasons = kept
            self.note(name, f"walked in the rows although that reads {walk >> 20} MiB: its product has no "
                            f"contraction template (a bfloat16 v against float32 softmax values, say)")
        if not weighted and shared and threads == WARP_LANES and self.size(row) < WARP_ROWS_BELOW:
            return self.rows_by_warp(result, group, row, shared)
        factor = self.hoisted_factor(name) if weighted else None     # before the stage's other steps
        passes = list(group) + ([self.tree.program.stage(factor)] if factor else [])
        self.tree = self.tree.reorder(*shared, *inner, row, stage=name)
        turn = None if weighted else self.rows_in_turn([self.tree.program.stage(name), *passes], row, shared, threads)
        unroll = IN_TURN_UNROLL if turn else LONG_ROW_UNROLL
        if turn:
            last = shared[-1]
            self.tree = self.tree.split(last, turn, stage=name)
            depth = self.bind_grid(name, shared[:-1] + [f"{last}.0"]) + 1
            self.note(name, f"its blocks take {turn} rows each in turn ({last}.1): the rows the blocks resident at "
                            f"once hold, re-read by later passes, then fit in {TURN_L2_SHARE:.0%} of the L2 "
                            f"cache ({self.gpu.l2_bytes >> 20} MiB)")
        else:
            depth = self.bind_grid(name, shared)
        if weighted:
            x = inner[-1]
            across = min(MAX_BLOCK_THREADS, _pow2_at_least(self.size(x)))
            self.tree = self.tree.split(x, across, stage=name).bind(f"{x}.1", "thread.x", stage=name)
            self.walked(name, [row], ROW_WALK_UNROLL)
            how = f"its threads take {across} of {x} each and walk {row}"
            if factor:
                how += f", reading {factor} (the factor of its product that leaves out {x}, computed once " \
                       f"for the row by the threads striding along it)"
        else:
            self.strided(name, row, threads, unroll)
            how = f"{threads} threads striding along it" + (f", {unroll} loads in flight a thread" if turn else "")
        kept = self.row_in_shared([self.tree.program.stage(name), *passes], row, shared, depth, threads)
        for st in passes:
            self.tree = self.tree.place(st.name, name, depth)
            self.strided(st.name, row, threads, unroll)
        if kept:
            how += f"; {kept} read once, its row kept in shared memory for every pass"
        self.note(name, f"one kernel: {', '.join(st.name for st in group)} placed in its rows, a block a row "
                        f"({row} contiguous, {self.size(row)} long), the reductions' {threads} threads striding "
                        f"along it and combined; {how}")
        return self.tree

    def rows_by_warp(self, result: ir.Stage, group, row: str, shared: list[str]) -> LoopTree:
        """A warp a row (rows shorter than HALF_WARP_ROWS_BELOW: half a warp a row, two rows a warp), as many rows a
        block (thread.y) as make BLOCK_THREADS: the group's reductions are combined by shuffles within the warp,
        each lane keeping the row's total in its own registers, so no barrier and no shared memory; a block of one
        warp a row filled half an SM's threads at most."""
        name, last = result.name, shared[-1]
        lanes = WARP_LANES // 2 if self.size(row) < HALF_WARP_ROWS_BELOW else WARP_LANES
        rows = min(BLOCK_THREADS // lanes, self.size(last))
        along = [row] if row in result.loop_dims else []            # (not where the result copies a row's total)
        self.tree = self.tree.reorder(*shared, *along, stage=name).split(last, rows, stage=name)
        depth = self.bind_grid(name, shared[:-1] + [f"{last}.0"]) + 1
        self.tree = self.tree.bind(f"{last}.1", "thread.y", stage=name)
        for st in group:
            self.tree = self.tree.place(st.name, name, depth)
        for st in [result, *group]:
            if row in st.loop_dims:
                self.strided(st.name, row, lanes)
        taken = "a warp a row" if lanes == WARP_LANES else f"{lanes} lanes a row ({WARP_LANES // lanes} rows a warp)"
        self.note(name, f"one kernel: {', '.join(st.name for st in group)} placed in its rows, {taken}, {rows} "
                        f"rows a block ({last}.1 on thread.y; {row} contiguous, {self.size(row)} long): the reductions "
                        f"combined by shuffles within the warp, no barrier")
        return self.tree

    def rows_in_turn(self, stages: list[ir.Stage], row: str, shared: list[str], threads: int) -> int | None:
        """Rows a block takes in turn where the rows its passes re-read are too long to stay in its threads'
        registers and the blocks resident at once would hold more of them than TURN_L2_SHARE of the L2 cache (the later
        passes then read them from DRAM again: softmax 2048x50257 on an H100, 2 blocks an SM, hit L2 40% of
        the time): the grid then holds at most as many blocks as that share holds rows, one an SM at most.
        None otherwise. `stages`: the result, then the passes in its rows."""
        if not ROWS_IN_TURN or self.size(row) <= STRIDED_UNROLL * threads:
            return None
        own = {st.name for st in stages}
        reread = {ld.buffer: ld.dtype for st in stages for ld in ir.loads(st.expr)
                  if ld.buffer not in own and row in self.tree.program.buffer_dims(ld.buffer)}
        row_bytes = sum(self.size(row) * templates.ITEM_BYTES[dtype] for dtype in reread.values())
        rows = math.prod(self.size(d) for d in shared)
        resident = self.gpu.threads_per_sm // threads * self.gpu.sms
        room = int(self.gpu.l2_bytes * TURN_L2_SHARE)
        if not shared or not row_bytes or min(rows, resident) * row_bytes <= room:
            return None
        blocks = max(1, min(self.gpu.sms, room // row_bytes))
        return min(self.size(shared[-1]), -(-rows // blocks))

    def walk_bytes(self, result: ir.Stage, inner: list[str]) -> int:
        """Bytes a block a row of a weighted walk reads besides its row: the factor of its product that keeps
        the `inner` dims (attention's v), read whole once for each row."""
        loads = [ld for ld in ir.loads(result.expr) if set(inner) & set(self.tree.program.buffer_dims(ld.buffer))]
        return max((math.prod(self.tree.program.buffer_shape(ld.buffer)) * templates.ITEM_BYTES[ld.dtype]
                    for ld in loads), default=0)

    def rows_then_product(self, result: ir.Stage, group, row: str, shared: list[str], walk: int) -> LoopTree | None:
        """Two kernels where a weighted walk in the rows would read too much (`walk` bytes over all rows): the
        factor of the product that leaves out its other dims (attention's softmax) computed whole by rows, a
        block a row, then the product summed over `row` as a contraction on its template. None where the
        product has no such factor."""
        factor = self.hoisted_factor(result.name)
        if factor is None:
            return None
        self.tree = self.tree.place(factor, None)
        self.rows_by_block(self.tree.program.stage(factor), group, row, shared, [])
        self.note(result.name, f"not walked in {factor}'s rows: blocks of a row would read {walk >> 20} MiB besides "
                               f"their rows, over {WALK_BYTES_PER_SM >> 20} MiB an SM; {factor} is written whole first")
        return self.tree if self.contraction_template(result.name) else None

    def hoisted_factor(self, stage: str) -> str | None:
        """`hoist` the factor of the stage's product that leaves out some of its dims; its new stage's
        name, or None where it has none."""
        try:
            self.tree = self.tree.hoist(stage)
        except ValueError:
            return None
        return f"{stage}.f"

    def row_in_shared(self, stages: list[ir.Stage], row: str, shared: list[str], depth: int,
                      threads: int) -> str | None:
        """Copy the row of the input every pass reads (one of the result's size along `row` and the
        block's dims) into shared memory once, where it takes at most ROW_SHARED_SHARE of what a
        block may use; the name of the input, or None. `stages`: the result, then the passes in its rows."""
        program, name = self.tree.program, stages[0].name
        own = {st.name for st in stages}
        loads = [ld for st in stages for ld in ir.loads(st.expr) if ld.buffer not in own]
        for load in sorted(loads, key=lambda ld: -math.prod(program.buffer_shape(ld.buffer))):
            dims = program.buffer_dims(load.buffer)
            readers = [st.name for st in stages if load.buffer in ir.loaded_buffers(st.expr)]
            row_bytes = self.size(row) * templates.ITEM_BYTES[load.dtype]
            if set(dims) != set(shared) | {row} or len(readers) < 2 or load.index != ir.Affine.identity(dims) \
                    or row_bytes > self.gpu.shared_per_block * ROW_SHARED_SHARE:
                continue
            copy = f"{load.buffer}.{readers[0]}"
            self.tree = self.tree.cache(load.buffer, stage=readers[0], readers=readers[1:]).place(copy, name, depth)
            self.strided(copy, row, threads)
            return load.buffer
        return None

    def rows_by_thread(self, result: ir.Stage, group, row: str, outer: list[str]) -> LoopTree:
        x = result.dims[-1] if result.dims[-1] != row else outer[-1]
        staged = self.staged_inputs(result, group, row, x)
        if staged:
            return self.rows_staged(result, group, row, outer, x, staged)
        threads = min(BLOCK_THREADS, _pow2_at_least(self.size(x)))
        self.tree = self.tree.split(x, threads, stage=result.name)
        rest = [d for d in outer if d != x]
        self.tree = self.tree.reorder(*rest, f"{x}.0", f"{x}.1", row, stage=result.name)
        depth = self.bind_grid(result.name, rest + [f"{x}.0"])
        self.tree = self.tree.bind(f"{x}.1", "thread.x", stage=result.name)
        for st in group:
            self.tree = self.tree.place(st.name, result.name, depth + 1)
        short = self.size(row) < THREAD_ROWS_BELOW
        if short:                          # the row's values stay in the thread's registers
            for st in [result, *group]:
                self.tree = self.tree.unroll(row, stage=st.name)
        why = f"{row} is {self.size(row)} long" if short else f"{row} is not contiguous"
        how = self.row_vectors(result, group, row) if short else ""
        self.note(result.name, f"one kernel: {', '.join(st.name for st in group)} placed in its rows; {why}, so a "
                               f"thread takes one {x} ({threads} a block) and walks {row}{how}")
        return self.tree

    def staged_inputs(self, result: ir.Stage, group: list[ir.Stage], row: str, x: str) -> list[str]:
        """The inputs a thread-a-row kernel reads through shared memory (`rows_staged`): where the short `row`
        is the result's contiguous dim and holds no whole vectors (`row_vectors` does better where it does)
        and the block's STAGED_ROWS rows of the result and of each input laid out [.., x, row] fit in
        STAGED_SHARED_SHARE of a block's shared memory; those inputs, or [] where it is not done."""
        program = self.tree.program
        item = templates.ITEM_BYTES[result.dtype]
        if not STAGED_ROWS or self.size(row) >= THREAD_ROWS_BELOW or contiguous_dim(program, result) != row \
                or result.dims[-2:] != (x, row) or self.row_width(result, row) > 1:
            return []
        given = {buffer.name for buffer in program.inputs}
        inputs = {ld.buffer: ld.dtype for st in [*group, result] for ld in ir.loads(st.expr) if ld.buffer in given
                  and program.buffer_dims(ld.buffer) == result.dims and ld.index == ir.Affine.identity(result.dims)}
        taken = STAGED_ROWS * self.size(row) * (item + sum(templates.ITEM_BYTES[dtype] for dtype in inputs.values()))
        return sorted(inputs) if inputs and taken <= self.gpu.shared_per_block * STAGED_SHARED_SHARE else []

    def rows_staged(self, result: ir.Stage, group: list[ir.Stage], row: str, outer: list[str], x: str,
                    inputs: list[str]) -> LoopTree:
        """A thread a row, STAGED_ROWS rows a block, the block's rows of `inputs` copied into shared memory and
        its results written there first: the copies in and out go a warp a row in turn, a lane an element, so
        their accesses are coalesced where a thread walking its own row reads and writes a row apart (softmax
        100000x31 on an H100: 0.30 -> 1.14x torch)."""
        name, acc, copies = result.name, f"{result.name}.acc", []
        for buffer in inputs:
            readers = [st.name for st in [result, *group] if buffer in ir.loaded_buffers(st.expr)]
            self.tree = self.tree.cache(buffer, stage=readers[0], readers=readers[1:])
            copies.append(f"{buffer}.{readers[0]}")
        self.tree = self.tree.cache_write(name)
        rest = [d for d in outer if d != x]
        self.tree = self.tree.split(x, STAGED_ROWS, stage=name).split(f"{x}.1", WARP_LANES, stage=name) \
            .reorder(*rest, f"{x}.0", f"{x}.1.0", f"{x}.1.1", row, stage=name)
        depth = self.bind_grid(name, rest + [f"{x}.0"])
        self.tree = self.tree.place(acc, name, depth).bind(f"{x}.1.0", "thread.y", stage=acc) \
            .bind(f"{x}.1.1", "thread.x", stage=acc).unroll(row, stage=acc)
        for st in group:
            self.tree = self.tree.place(st.name, acc, depth + 2).unroll(row, stage=st.name)
        for stage in [*copies, name]:
            if stage != name:
                self.tree = self.tree.place(stage, name, depth)
            self.tree = self.tree.bind(f"{x}.1.0", "thread.y", stage=stage).bind(row, "thread.x", stage=stage)
        self.note(name, f"one kernel: {', '.join(st.name for st in group)} placed in its rows; {row} is "
                        f"{self.size(row)} long and holds no whole vectors, so a thread takes one {x} ({STAGED_ROWS} "
                        f"a block) and walks {row} in shared memory, where {', '.join(inputs)} and the results are "
                        f"copied a warp a row")
        return self.tree

    def row_width(self, result: ir.Stage, row: str) -> int:
        """Elements of the widest vector of at most VECTOR_BYTES (or a pair) that the result's `row` holds whole."""
        return next(w for w in (templates.VECTOR_BYTES // templates.ITEM_BYTES[result.dtype], 2, 1)
                    if self.size(row) % w == 0)

    def row_vectors(self, result: ir.Stage, group: list[ir.Stage], row: str) -> str:
        """A thread's short row of the result written, and read by it and the `group`, in the widest vectors of
        at most VECTOR_BYTES that its length holds whole, where `row` is the result's contiguous dim: a warp's
        scalar stores, a row apart, each wrote a sector a lane (softmax 100000x10 on an H100: 14.6 us, 9.0 in
        pairs); how, for `explain` ('' where the row holds no vectors)."""
        item, width = templates.ITEM_BYTES[result.dtype], self.row_width(result, row)
        if not ROW_VECTORS or contiguous_dim(self.tree.program, result) != row or width == 1:
            return ""
        for st in [result, *group]:
            self.tree = self.tree.split(row, width, stage=st.name).unroll(f"{row}.0", stage=st.name) \
                .vectorize(f"{row}.1", stage=st.name)
        return f", {width * item} bytes at a time"

    def row_threads(self, row: str, elements: int = ROW_ELEMENTS_PER_THREAD) -> int:
        """Threads that share a row: about `elements` elements each, whole warps."""
        wanted = _pow2_at_least(-(-self.size(row) // elements))
        return max(WARP_LANES, min(MAX_BLOCK_THREADS, wanted))

    def strided(self, stage: str, dim: str, threads: int, unroll: int | None = None):
        """`threads` threads along `dim` of `stage`, each taking every `threads`-th element (coalesced);
        where that is at most STRIDED_UNROLL elements a thread, unrolled (a row a thread keeps to itself
        then lives in registers, not local memory), else `unroll` (LONG_ROW_UNROLL) at a time."""
        unroll = LONG_ROW_UNROLL if unroll is None else unroll
        self.tree = self.tree.split(dim, threads, stage=stage).reorder(f"{dim}.1", f"{dim}.0", stage=stage) \
            .bind(f"{dim}.1", "thread.x", stage=stage)
        if self.extent(stage, f"{dim}.0") <= STRIDED_UNROLL:
            self.tree = self.tree.unroll(f"{dim}.0", stage=stage)
        elif unroll > 1:
            self.tree = self.tree.split(f"{dim}.0", unroll, stage=stage).unroll(f"{dim}.0.1", stage=stage)

    def walked(self, stage: str, dims: list[str], unroll: int = WALK_UNROLL):
        """Reduction loops a thread walks alone (outer to inner): where the inner ones are short (a
        window's taps) they are unrolled whole, else the innermost is unrolled `unroll` times (halved
        until it divides the loop), so several loads are in flight; either way the outermost loop's body is
        unrolled code around the updates, whose results then stay in registers across it."""
        inner = dims[1:]
        if inner and all(self.size(d) <= UNROLL_WHOLE for d in inner):
            for dim in inner:
                self.tree = self.tree.unroll(dim, stage=stage)
            return
        dim = dims[-1]
        while unroll > 1 and (self.size(dim) % unroll or self.size(dim) <= unroll):
            unroll //= 2
        if unroll > 1:
            self.tree = self.tree.split(dim, unroll, stage=stage).unroll(f"{dim}.1", stage=stage)

    def bind_grid(self, stage: str, loops: list[str]) -> int:
        """Bind the three widest of the stage's outermost `loops` (outer to inner) of more than one iteration
        to block.x (the innermost of them), block.y and block.z within their limits; loops left over (a
        window's taps beside its channels) stay serial around them. Returns how many
        loops of the stage enclose its block-bound ones (its depth below the grid)."""
        axes = ["block.x", "block.y", "block.z"]
        widest = sorted((lp for lp in loops if self.extent(stage, lp) > 1),
                        key=lambda lp: (-self.extent(stage, lp), -loops.index(lp)))[:len(axes)]
        bound = []
        for loop in reversed(loops):
            extent = self.extent(stage, loop)
            if axes and loop in widest and extent <= templates.GRID_LIMITS[axes[0]]:      # a loop of one needs no axis
                self.tree = self.tree.bind(loop, axes.pop(0), stage=stage)
                bound.append(loop)
        serial = [lp for lp in loops if lp not in bound]
        self.tree = self.tree.reorder(*serial, *reversed(bound), stage=stage)
        return len(loops)

    def extent(self, stage: str, loop: str) -> int:
        return next(lp.extent for lp in self.tree.schedule.of(stage).loops if lp.name == loop)

    # Stage by stage ----------------------------------------------------------------------------------
    def schedule_stage(self, name: str):
        stage = self.tree.program.stage(name)
        if name in self.scheduled or self.contraction_template(name):
            return
        if not stage.reduce_dims and self.fused_epilogue(name):
            return
        if not stage.reduce_dims:
            self.pointwise(stage)
        elif not self.summed_in_reader(stage):
            self.reduction(stage, split=True)

    def summed_in_reader(self, stage: ir.Stage) -> bool:
        """A short reduction (at most FUSED_SUM_TERMS terms an output, not along the contiguous dim: the
        parts of a split-k sum) read only by a pointwise stage over the same dims (its epilogue: a bias,
        relu, a cast) is computed in that stage's threads, each summing the outputs it then writes (one
        kernel, no buffer between); the reader is scheduled first, as a pointwise stage. False where it
        does not apply or the legality check refuses it."""
        program = self.tree.program
        readers = [st for st in program.stages if stage.name in ir.loaded_buffers(st.expr)]
        if len(readers) != 1 or stage is program.output or math.prod(self.size(d) for d in stage.reduce_dims) \
                > FUSED_SUM_TERMS or contiguous_dim(program, stage) in stage.reduce_dims:
            return False
        reader = readers[0]
        if reader.reduce_dims or reader.dims != stage.dims or any(
                ld.index != ir.Affine.identity(stage.dims) for ld in ir.loads(reader.expr) if ld.buffer == stage.name):
            return False
        kept = self.tree, list(self.reasons)
        self.pointwise(reader)
        loops = self.tree.schedule.of(reader.name).loops
        depth = 1 + max(i for i, lp in enumerate(loops) if lp.annotation.startswith("thread."))
        tree = self.tree.place(stage.name, reader.name, depth)
        own = [lp for lp in tree.schedule.of(stage.name).loops if lp.dim not in stage.reduce_dims]
        tree = tree.reorder(*stage.reduce_dims, *(lp.name for lp in own), stage=stage.name)
        for dim in stage.reduce_dims:
            tree = tree.unroll(dim, stage=stage.name)
        for lp in own:
            vector = lp is own[-1] and loops[-1].annotation == "vectorize"
            tree = tree.vectorize(lp.name, stage=stage.name) if vector else tree.unroll(lp.name, stage=stage.name)
        if tree.check()[0]:
            self.tree = tree
            self.scheduled.add(reader.name)
            self.note(stage.name, f"its {', '.join(stage.reduce_dims)} terms summed in {reader.name}'s threads, "
                                  f"each for the outputs it writes: one kernel, no buffer between")
            return True
        self.tree, self.reasons = kept
        return False

    def fused_epilogue(self, name: str) -> bool:
        """Compute a pointwise stage that reads a contraction's results in the contraction's write-back
        (`epilogue`: a bias, relu, scale or cast applied to the register or tensor-core tile, no kernel
        of its own), where the legality check accepts it."""
        try:
            fused = self.tree.epilogue(name)
        except ValueError:
            return False
        legal, why = fused.check()
        if not legal:
            self.note(name, f"not fused into the contraction's write-back ({why})")
            return False
        self.tree = fused
        self.note(name, "fused into the contraction's write-back: computed on its tile of results, no kernel of its own")
        return True

    def contraction_template(self, name: str) -> bool:
        """Put a contraction stage on the first template of `autoschedule.gpu` that the legality check
        accepts; a half-precision one off the tensor cores' grid (on Hopper, or short: `templates.short_half`,
        whose rows wgmma's 64-row tiles pad) first on zero-padded operands
        (`padded_on_tensor_cores`), or, where `WGMMA_EDGE_TILES` says so, first as one wgmma kernel with
        guarded edge tiles (`wgmma_with_edges`). False where none fits, and for half precision with dynamic
        dims."""
        program, hopper = self.tree.program, self.gpu.tensor_cores == "wgmma"
        half = templates.contraction_dtype(program, name) in ("bfloat16", "float16")
        tries = (self.wgmma_with_edges, self.padded_on_tensor_cores)
        off_grid = not templates.tensor_tiles_fit(program, name) or hopper and templates.short_half(program, name)
        if half and self.gpu.tensor_cores and off_grid:
            small = templates.small_contraction(program, name)
            if any(fits(name) for fits in (tries if templates.WGMMA_EDGE_TILES else tries[::-1])
                   if not (small and fits == self.padded_on_tensor_cores)):
                return True
            if small:
                self.note(name, f"off the tensor cores' grid and too small to pad (at most "
                                f"{templates.SMALL_CONTRACTION_MACS} multiply-adds): four kernels would take longer "
                                f"than the rules below")
        if self.padded_float32(name) or self.parts_added_atomically(name):
            return True
        refused = []
        for described, tree in templates.contraction_candidates(self.tree, name, hopper, self.gpu):
            legal, why = tree.check()
            if legal:
                self.note(name, f"a contraction: {described}" + "".join(f"; not {r}" for r in refused))
                self.tree = tree
                return True
            refused.append(f"{described.split(' (')[0]} ({why})")
        if refused:
            self.note(name, "no contraction template: " + "; ".join(refused))
        return False

    def parts_added_atomically(self, name: str) -> bool:
        """Split-k's float32 parts (`ir.split_k`: `name` over [parts, m, n], summed into the result) on register
        tiles whose blocks add their tiles into the result by atomic adds, the parts on block.z
        (`templates.float32_parts_tree`), where the sum is the program's result and the legality check
        accepts it: a kernel zeroes the result first, and no partial result is written and read back by a
        second kernel. False (tree unchanged) elsewhere (`templates.atomic_parts_total`)."""
        program = self.tree.program
        total = templates.atomic_parts_total(program, name)
        if total is None:
            return False
        block = templates.float32_block(program, name, self.gpu.sms)
        try:
            plan = templates.float32_plan(self.tree, name, block, self.gpu)
            tree = templates.float32_parts_tree(self.tree, name, total, block, plan)
        except ValueError:
            return False
        if not tree.check()[0]:
            return False
        self.tree = tree
        self.scheduled.add(total)
        stage = program.stage(name)
        parts, run = program.size(stage.dims[0]), program.size(stage.reduce_dims[0])
        blocks = templates.block_count(program, name, block)
        why = "the block of least modelled time for these parts, `float32_cost`"
        if templates.short_rows(program, name):
            why = (f"its {self.size(templates.tile_dims(stage)[1])} rows short: the most rows of FLOAT32_SHORT_BLOCKS "
                   f"they hold, parts for {templates.SHORT_SPLIT_K_BLOCKS} blocks an SM")
        self.note(name, f"split-k's {parts} parts of {run} on register tiles, {block[0]}x{block[1]} a block ({why}: "
                        f"{blocks} blocks, at most {-(-blocks // self.gpu.sms)} an SM in turn), cp.async k tiles of "
                        f"{plan['k_tile']}; the parts ({stage.dims[0]}) "
                        f"on block.z, each block adding its tile into {total} by atomic adds ({total} zeroed by a "
                        f"kernel first): no partial results in memory, no kernel adding them")
        return True

    def wgmma_with_edges(self, name: str) -> bool:
        """On Hopper, a half-precision contraction off the tensor cores' grid as one kernel: k padded with
        zeros to the wgmma template's k tile (by TMA's out-of-bounds fill where TMA can address the
        operands: no copy), the block tiles (`templates.wgmma_start`) cut at the ends of m and n (computed
        whole, each result element stored under the tail's guard), and the copy of the padded result fused into the write-back
        (`epilogue`). False (tree unchanged) where the legality check refuses it."""
        if self.gpu.tensor_cores != "wgmma":
            return False
        program = self.tree.program
        dims = templates.contraction_dims(program, name)
        if dims is None:
            return False
        k = dims[2]
        k_tile = templates.TENSOR_START["wgmma"][2]
        padded = program.size(k) % k_tile != 0
        stage = f"{name}.pad" if padded else name
        try:
            tree, relaid = self.tree.pad({k: k_tile}, stage=name) if padded else self.tree, {}
            copier = "tma" if padded else templates.wgmma_start(tree.program, stage, self.gpu)[4]
            if copier == "tma":
                tree, relaid = k_last_where_unaligned(tree, stage)
            block, teams, k_tile, stages, _ = templates.wgmma_start(tree.program, stage, self.gpu)
            persistent = templates.persistent_grid(tree.program, stage, self.gpu, block, k_tile, stages, copier)
            tree = templates.wgmma_tiled(tree, stage, block, teams, k_tile, stages, copier, persistent)
            tree, filled = self.zero_filled_by_tma(tree, name)
            tree = tree.epilogue(name) if padded else tree
        except ValueError:
            return False
        if not tree.check()[0]:
            return False
        self.tree = tree
        self.note(name, f"a contraction off the tensor cores' grid: wgmma tensor-core tiles {block[0]}x{block[1]}x"
                        f"{k_tile}, {stages} stages by {copier}, whose edge tiles are computed whole and stored under guards"
                        + (f"; {k} padded with zeros to a multiple of {k_tile}" if padded else "")
                        + (f" by TMA's zero fill ({', '.join(filled)}, no copy)" if filled else "")
                        + "".join(f"; {source} copied ahead with {k} last (its rows are not whole "
                                  f"{templates.VECTOR_BYTES}-byte vectors, which TMA cannot address)" for source in relaid)
                        + templates.persistent_note(persistent)
                        + ("; the padded result written straight into the result" if padded else ""))
        self.pad_copies_pointwise(name)
        for copy in relaid.values():
            self.pointwise(self.tree.program.stage(copy))
        return True

    def padded_on_tensor_cores(self, name: str) -> bool:
        """Pad the contraction's m, n and k with zeros to the multiples of `templates.TENSOR_PADS` in
        turn until a tensor-core template takes it; the pad copies and the copy of the result run as
        pointwise kernels. False (tree unchanged) where none does."""
        dims = templates.contraction_dims(self.tree.program, name)
        if dims is None:
            return False
        kept, hopper = self.tree, self.gpu.tensor_cores == "wgmma"
        for multiples in templates.TENSOR_PADS:
            try:
                self.tree = kept.pad(dict(zip(dims, multiples)), stage=name)
            except ValueError:
                return False
            padded = f"{name}.pad"
            family = "wgmma" if hopper and multiples != templates.TENSOR_PADS[-1] else ""
            candidates = [(d, t) for d, t in templates.contraction_candidates(self.tree, padded, hopper, self.gpu)
                          if "tensor-core" in d and d.startswith(family)]
            for described, tree in candidates:
                if tree.check()[0]:
                    tree, filled = self.zero_filled_by_tma(tree, name) if "by tma" in described else (tree, [])
                    self.note(name, f"a contraction off the tensor cores' grid: operands padded with zeros to "
                                    f"multiples of {multiples} (m, n, k), then {described}"
                                    + (f"; {', '.join(filled)} padded by TMA's zero fill, not copied" if filled else ""))
                    self.tree = tree
                    self.pad_copies_pointwise(name, result_copy=not self.result_copy_inlined(name))
                    return True
        self.tree = kept
        return False

    def padded_float32(self, name: str) -> bool:
        """A float32 contraction with a dim whose rows are not whole 16-byte vectors, on register tiles over
        operands padded with zeros to whole block tiles (m, n) and k tiles: a row of 1003 floats starts
        unaligned, so its tiles load word by word, without cp.async, and edge tiles run guarded (H100,
        session 21: 997 x 1001 x 1003 took 2.2x the time of 1024^3). A's pad is computed in its copy
        ahead (`inline`); B's pad and the copy of the padded result are pointwise kernels. Only products of
        two matrices (no batch dims, not split-k's parts: their extra kernels lost, 1000 x 1500 x 777 in 5
        parts 0.82 -> 0.76x torch) at least one block tile in each dim (smaller ones, 100 x 333 x 77, are
        faster on the reduction rules: 1.43 against 0.67x torch). False (tree unchanged) where the dims
        are whole vectors, a dim is dynamic, or the legality check refuses it."""
        program = self.tree.program
        dims = templates.contraction_dims(program, name)
        if templates.contraction_dtype(program, name) != "float32" or dims is None or program.dynamic \
                or templates.tile_dims(program.stage(name))[2] or templates.whole_rows(program, name):
            return False
        block = templates.float32_block(program, name, self.gpu.sms)
        multiples = dict(zip(dims, (*block, templates.FLOAT32_TILES["k_tile"])))
        if any(self.size(d) < multiple for d, multiple in multiples.items()):
            return False
        try:
            tree = self.tree.pad(multiples, stage=name)
            described, tree = next((d, t) for d, t in templates.contraction_candidates(
                tree, f"{name}.pad", self.gpu.tensor_cores == "wgmma", self.gpu) if "register tiles" in d)
            stages = {st.name for st in tree.program.stages}
            for copy in [st for st in stages if st.endswith(f".{name}.pad") and f"{st}.{name}.pad" in stages]:
                tree = tree.inline(copy)                     # (copied ahead, transposed: padded there)
        except (ValueError, StopIteration):
            return False
        if not tree.check()[0]:
            return False
        self.tree = tree
        self.note(name, f"a contraction of rows that are not whole {templates.VECTOR_BYTES}-byte vectors: operands padded with "
                        f"zeros to multiples of {tuple(multiples.values())} ({', '.join(dims)}), then {described}")
        self.pad_copies_pointwise(name, result_copy=True)
        return True

    def result_copy_inlined(self, name: str) -> bool:
        """Inline the copy of padded contraction `name`'s result into the stages that read it, where it is not
        the program's result (split-k's parts, summed by a later stage, read the padded parts in place: one
        kernel fewer). False (tree unchanged) where it is, or where `inline` refuses."""
        if name == self.tree.program.output.name:
            return False
        try:
            self.tree = self.tree.inline(name)
        except ValueError:
            return False
        self.note(name, "its readers read the padded result in place (no copy of it)")
        return True

    def pad_copies_pointwise(self, name: str, result_copy: bool = False):
        """Schedule as pointwise kernels the pad copies of contraction `name`'s operands that are still
        stages (TMA did not take them; not a copy ahead of one, which its template scheduled), and with
        `result_copy` the copy of the padded result into `name`."""
        for stage in self.tree.program.stages:
            pad_copy = stage.name.endswith(f".{name}.pad") and not stage.name.endswith(f".{name}.pad.{name}.pad")
            if pad_copy or (result_copy and stage.name == name):
                self.pointwise(stage)

    def zero_filled_by_tma(self, tree: LoopTree, name: str) -> tuple[LoopTree, list[str]]:
        """`tree` with each operand pad copy of contraction `name` inlined (`inline`) into the TMA copy of
        its tiles, where the legality check accepts it: TMA fills the boxes outside the operand with
        zeros, so the pad needs no kernel. Also the operands so padded."""
        filled = []
        for stage in [st.name for st in tree.program.stages if st.name.endswith(f".{name}.pad")]:
            try:
                inlined = tree.inline(stage)
            except ValueError:
                continue
            if inlined.check()[0]:
                tree = inlined
                filled.append(stage.split(".")[0])
        return tree, filled

    def pointwise(self, stage: ir.Stage):
        """16-byte vectors along the contiguous dim where rows hold whole vectors, else SCALAR_RUN
        elements a thread, a block apart (loads in flight); BLOCK_THREADS a block. A stage that reads an
        array across its rows (a transpose) goes through shared memory (`transposed`)."""
        if not stage.dims:
            self.note(stage.name, "a single value: one thread")
            return
        if self.transposed(stage):
            return
        name, x = stage.name, stage.dims[-1]
        width = templates.VECTOR_BYTES // templates.ITEM_BYTES[stage.dtype]
        whole = self.size(x) % width == 0 or (len(stage.dims) == 1 and self.size(x) >= width * BLOCK_THREADS)
        vector = width if whole and self.size(x) >= width else 1
        along = -(-self.size(x) // vector)
        threads_x = min(BLOCK_THREADS, _pow2_at_least(along))
        run = SCALAR_RUN if vector == 1 and along >= SCALAR_RUN * threads_x else 1
        rest = list(stage.dims[:-1])
        tree = self.tree.split(x, threads_x * vector * run, stage=name)
        inner, registers = f"{x}.1", []
        if vector > 1 or run > 1:
            tree = tree.split(inner, vector if vector > 1 else threads_x, stage=name)
            inner, registers = (f"{x}.1.0", [f"{x}.1.1"]) if vector > 1 else (f"{x}.1.1", [f"{x}.1.0"])
        self.tree = tree.bind(inner, "thread.x", stage=name)
        blocks, threads = [f"{x}.0"], [inner]
        threads_y = BLOCK_THREADS // threads_x
        if rest and threads_y > 1:
            y = rest.pop()
            threads_y = min(threads_y, _pow2_at_least(self.size(y)))
            self.tree = self.tree.split(y, threads_y, stage=name).bind(f"{y}.1", "thread.y", stage=name)
            blocks, threads = [f"{y}.0", f"{x}.0"], [f"{y}.1", inner]
        self.tree = self.tree.reorder(*rest, *blocks, *threads, *registers, stage=name)
        self.bind_grid(name, rest + blocks)
        if registers:
            self.tree = self.tree.vectorize(registers[0], stage=name) if vector > 1 \
                else self.tree.unroll(registers[0], stage=name)
        self.note(name, f"pointwise: {vector}-wide vectors along {x}" + (f", {run} a thread" if run > 1 else "")
                  + f", {threads_x * threads_y} threads a block")

    def transposed(self, stage: ir.Stage) -> bool:
        """A pointwise stage that reads an array contiguous along another of its dims `y` than its own
        contiguous `x` (a transpose: neighbouring threads would read a row apart) in TRANSPOSE_TILE x
        TRANSPOSE_TILE tiles, a block a tile: its threads copy the array's tile into shared memory along
        `y`, then write the result along `x` from it (the codegen swizzles the tile so that neither side
        conflicts on banks). False (tree unchanged) where no read is so, a tile dim is shorter than the
        tile, or the legality check refuses it."""
        program, name, x = self.tree.program, stage.name, stage.dims[-1]
        across = {}                          # load -> the dim its array is contiguous along
        for load in dict.fromkeys(ir.loads(stage.expr)):
            dims = program.buffer_dims(load.buffer)
            if set(dims) <= set(stage.dims) and load.index == ir.Affine.identity(dims) and x in dims and dims[-1] != x:
                across[load] = dims[-1]
        if not across or program.dynamic:
            return False
        y = next(iter(across.values()))
        across = [load for load, along in across.items() if along == y]     # (others are read as they are)
        if min(self.size(x), self.size(y)) < TRANSPOSE_TILE:
            return False
        rest = [d for d in stage.dims if d not in (x, y)]
        rows = TRANSPOSE_TILE // TRANSPOSE_ROWS_A_THREAD
        kept = self.tree
        self.tree = self.tree.split(x, TRANSPOSE_TILE, stage=name).split(y, TRANSPOSE_TILE, stage=name) \
            .reorder(*rest, f"{y}.0", f"{x}.0", f"{y}.1", f"{x}.1", stage=name)
        depth = self.bind_grid(name, rest + [f"{y}.0", f"{x}.0"])
        for load in across:
            copy = f"{load.buffer}.{name}"
            self.tree = self.tree.cache(load.buffer, stage=name).place(copy, name, depth)
            self.threads_in_rows(copy, f"{y}.1", f"{x}.1", rows)
        self.threads_in_rows(name, f"{x}.1", f"{y}.1", rows)
        if not self.tree.check()[0]:
            self.tree = kept
            return False
        self.note(name, f"a transpose: reads {', '.join(ld.buffer for ld in across)} along {y}, writes along {x}; "
                        f"{TRANSPOSE_TILE}x{TRANSPOSE_TILE} tiles, a block a tile ({TRANSPOSE_TILE}x{rows} threads, "
                        f"{TRANSPOSE_ROWS_A_THREAD} rows each), copied along {y} into shared memory and written "
                        f"along {x} from it")
        return True

    def threads_in_rows(self, stage: str, along: str, across: str, rows: int):
        """Threads of a tile: `along` on thread.x, `rows` of them on thread.y along `across`, each taking
        its rows `rows` apart (unrolled)."""
        self.tree = self.tree.split(across, rows, stage=stage).reorder(f"{across}.1", along, f"{across}.0", stage=stage) \
            .bind(f"{across}.1", "thread.y", stage=stage).bind(along, "thread.x", stage=stage) \
            .unroll(f"{across}.0", stage=stage)

    def reduction(self, stage: ir.Stage, split: bool):
        """A warp an output where the reduction runs along contiguous rows a warp takes alone (`summed_by_warps`);
        a block an output where it runs along the contiguous dim of what it reads, at least LONG_ROW long, and no
        read is contiguous along the output's own last dim; else a thread an output (a convolution's 3-wide
        window rows, a matmul too small for its template). The last two are split first (`split_reduction`)
        where they would leave the GPU idle."""
        pure = [d for d in stage.loop_dims if d not in stage.reduce_dims]
        outputs = math.prod(self.size(d) for d in pure)
        along = contiguous_dim(self.tree.program, stage)
        if self.summed_by_warps(stage, along, pure):
            return
        long_row = along in stage.reduce_dims and self.size(along) >= LONG_ROW
        if not pure or (long_row and not self.read_along(stage, stage.dims[-1])):
            along = along if along in stage.reduce_dims else max(stage.reduce_dims, key=self.size)
            across = self.split_across_blocks(stage, along, outputs) if split else None
            if across:
                self.split_reduction(stage, across, blocks_wanted=4 * self.gpu.sms, per_output_blocks=True)
                return
            self.reduce_in_block(stage, along, pure)
        else:
            longest = max(stage.reduce_dims, key=self.size)
            if split and self.threads_too_few(outputs, self.size(longest)):
                self.split_reduction(stage, longest, blocks_wanted=self.gpu.resident_threads // 2, per_output_blocks=False)
                return
            self.reduce_in_thread(stage, pure)

    def summed_by_warps(self, stage: ir.Stage, row: str, pure: list[str]) -> bool:
        """A reduction along contiguous rows of WARP_LANES up to WARP_ROWS_BELOW where no read is contiguous along
        the output's last dim (threads along it would read it coalesced: a small matmul's B): a warp a row, several
        a block (`rows_by_warp`), its total combined by shuffles into a copy in each lane's registers (`cache_write`),
        then stored. False (tree unchanged) elsewhere, or where the legality check refuses it. (H100, session 33,
        x torch against a thread a row, or a block of one warp a row from 128: row sum 2000x50 0.70 -> 1.46, 65536x64
        0.63 -> 1.91, 100000x77 1.39 -> 1.99, 100000x127 0.94 -> 1.55.)"""
        if stage.reduce_dims != (row,) or not pure or not WARP_LANES <= self.size(row) < WARP_ROWS_BELOW \
                or self.read_along(stage, stage.dims[-1]):
            return False
        kept = self.tree, list(self.reasons)
        self.note(stage.name, f"a {stage.reduce_op} along contiguous rows of {self.size(row)} ({row}): the row's total "
                              f"kept in each lane's registers ({stage.name}.acc), then stored")
        self.tree = self.tree.cache_write(stage.name)
        program = self.tree.program
        tree = self.rows_by_warp(program.stage(stage.name), [program.stage(f"{stage.name}.acc")], row, pure)
        if not tree.check()[0]:
            self.tree, self.reasons = kept
            return False
        return True

    def split_across_blocks(self, stage: ir.Stage, along: str, outputs: int) -> str | None:
        """The reduced dim a block-an-output reduction along `along` is split along across blocks where it would
        leave the GPU idle: `along` itself where there are fewer outputs than twice the SMs and it is at least two
        BLOCK_CHUNKs long; else, where there are outputs but fewer than half the SMs, the longest other reduced dim
        (a batch norm's means of 128x16x32x32 over (b, h, w) ran 16 blocks of 32 threads, each walking 131072
        values: session 34, found by `bench.gpu_plan_audit`; not yet timed). None elsewhere."""
        if outputs < 2 * self.gpu.sms and self.size(along) >= 2 * BLOCK_CHUNK:
            return along
        others = [d for d in stage.reduce_dims if d != along]
        if not others or not stage.dims or outputs >= self.gpu.sms // 2:
            return None
        outer = max(others, key=self.size)
        walk = math.prod(self.size(d) for d in stage.reduce_dims)
        return outer if walk >= 2 * BLOCK_CHUNK and self.size(outer) >= 2 else None

    def threads_too_few(self, outputs: int, walk: int) -> bool:
        """Whether a thread an output, each walking `walk` values alone, would leave the GPU idle: fewer outputs
        than an eighth of the threads it keeps in flight, on walks of at least 64 (the walk is then split across
        blocks, `split_reduction`; a softmax over a matrix's columns runs stage by stage so its reductions are)."""
        return outputs < self.gpu.resident_threads // 8 and walk >= 64

    def read_along(self, stage: ir.Stage, dim: str) -> bool:
        """Whether some read of the stage that moves along its reduction is contiguous along `dim`
        (neighbouring threads then read neighbouring elements; a value read once an output, a softmax's
        row max, does not count)."""
        program = self.tree.program
        return any(abs(strides.get(dim, 0)) == 1 and set(strides) & set(stage.reduce_dims)
                   for strides in (load_strides(program, load) for load in ir.loads(stage.expr)))

    def split_reduction(self, stage: ir.Stage, dim: str, blocks_wanted: int, per_output_blocks: bool):
        """rfactor `dim` into enough independent partial results to fill the GPU, then schedule the
        partials and their final reduction as reductions of their own (not split again): a block an output
        where fewer outputs than a warp's lanes have many partials each (a column sum of a 10^7 x 3 matrix
        has 40000: summed by 3 threads alone they took 1.8 ms on an H200, 36x torch). Where a thread takes a
        vector of outputs, the partials are counted by vectors, not outputs, as long as the final sum keeps
        at least as many threads as each of them adds partials (H200, session 23: column sum 8192^2 in 64
        partials 0.87 -> 1.05x torch; 3001x1000 would take 376 for 250 final threads, 0.54-0.60x against 0.83-0.89
        in 131). Partials along a dim that is not contiguous are interleaved (`rfactor`), and a thread's walk
        is a whole number of unrolled steps where a divisor allows (10^7 x 3: 0.55 -> 0.77-0.81x)."""
        pure = [d for d in stage.loop_dims if d not in stage.reduce_dims]
        outputs = math.prod(self.size(d) for d in pure)
        smallest = BLOCK_CHUNK if per_output_blocks else THREAD_CHUNK
        along = contiguous_dim(self.tree.program, stage)
        step = self.size(along) if per_output_blocks and along in stage.reduce_dims and along != dim else 1
        most = -(-self.size(dim) * step // smallest)        # (a step of an outer dim: a row of `along`)
        parts = max(2, min(-(-blocks_wanted // outputs), most))
        if not per_output_blocks:
            vectors = outputs // self.thread_vector(stage, pure)
            by_vectors = -(-blocks_wanted // vectors)
            if by_vectors <= vectors:          # the final sum keeps as many threads as each adds partials
                parts = max(parts, min(by_vectors, most))
        factor = _dividing(self.size(dim), -(-self.size(dim) // parts), 1 if per_output_blocks else WALK_UNROLL)
        parts = -(-self.size(dim) // factor)
        interleaved = not per_output_blocks and not self.read_along(stage, dim)
        self.tree = self.tree.rfactor(dim, factor, stage=stage.name, interleaved=interleaved)
        taken = f"partial p of {dim} = p, p + {parts}, ..., so that neighbouring threads read neighbouring rows" \
            if interleaved else f"each of {factor} consecutive values"
        self.note(stage.name, f"{outputs} outputs leave the GPU idle: {dim} split into {parts} partial results "
                              f"of {factor} (rfactor, {taken}), reduced again by a second kernel")
        program = self.tree.program
        self.reduction(program.stage(f"{stage.name}.rf"), split=False)
        final = program.stage(stage.name)
        threads = outputs // self.thread_vector(final, pure) if pure else outputs
        if parts >= LONG_ROW and (outputs < WARP_LANES or threads < FINAL_WARPS_AN_SM * WARP_LANES * self.gpu.sms):
            self.reduce_in_block(final, final.reduce_dims[0], pure)
        else:
            self.reduction(final, split=False)

    def reduce_in_block(self, stage: ir.Stage, along: str, pure: list[str]):
        """A block an output (pure dims over the grid), its threads striding along `along` and
        combining their partials; other reduced dims are walked by each thread."""
        name = stage.name
        threads = self.row_threads(along)
        others = [d for d in stage.reduce_dims if d != along]
        self.tree = self.tree.reorder(*pure, along, *others, stage=name)
        self.tree = self.tree.split(along, threads, stage=name)
        self.tree = self.tree.reorder(f"{along}.1", *others, f"{along}.0", stage=name) \
            .bind(f"{along}.1", "thread.x", stage=name)
        self.bind_grid(name, pure)
        contiguous = "contiguous" if along == contiguous_dim(self.tree.program, stage) else "not contiguous"
        self.note(name, f"reduction along {along} ({contiguous}): a block an output, {threads} threads striding "
                        f"along it, partials combined across the threads")

    def thread_vector(self, stage: ir.Stage, pure: list[str]) -> int:
        """Outputs a thread of `reduce_in_thread` takes as one 16-byte vector along the stage's last dim (1
        where its rows do not hold whole vectors, or too few of them for a warp)."""
        x = stage.dims[-1]
        width = templates.VECTOR_BYTES // templates.ITEM_BYTES[stage.expr.dtype]
        least = width * (WARP_LANES // 2 if self.tile_rows(stage, [d for d in pure if d != x]) > 1 else WARP_LANES)
        return width if self.size(x) % width == 0 and self.size(x) >= least else 1

    def tile_rows(self, stage: ir.Stage, rest: list[str]) -> int:
        """Outputs along the pure dim before the contiguous one that a thread walking the reduction takes
        at once where some read does not move along it, so that read serves them all (a convolution's
        filters): the largest count up to THREAD_TILE_ROWS that divides the dim (no ragged tile: 3 of 33
        rows); else 1."""
        if not rest or all(rest[-1] in ir.index_vars(load) for load in ir.loads(stage.expr)):
            return 1
        return next(rows for rows in range(THREAD_TILE_ROWS, 0, -1) if self.size(rest[-1]) % rows == 0)

    def coalesce_inputs(self, stage: ir.Stage, x: str):
        """Inputs the stage reads along `x` (its threads' dim) with a stride, smaller than its output
        (so each is read many times: a convolution's filters), copied ahead by a kernel of their own
        into a layout with `x` last, so neighbouring threads read neighbouring elements."""
        program = self.tree.program
        outputs = math.prod(self.size(d) for d in stage.dims)
        inputs = {b.name: b for b in program.inputs}
        for load in dict.fromkeys(ir.loads(stage.expr)):
            buffer = inputs.get(load.buffer)
            stride = abs(load_strides(program, load).get(x, 1))
            if buffer is None or stride in (0, 1) or x not in buffer.dims or math.prod(buffer.shape) >= outputs:
                continue
            order = tuple(d for d in buffer.dims if d != x) + (x,)
            self.tree = self.tree.cache(load.buffer, stage=stage.name, order=order)
            copy = f"{load.buffer}.{stage.name}"
            self.note(stage.name, f"{load.buffer} is read with stride {stride} along {x}: copied ahead with {x} last")
            self.pointwise(self.tree.program.stage(copy))

    def reduce_in_thread(self, stage: ir.Stage, pure: list[str]):
        """A thread an output (16-byte vectors of them where rows hold whole vectors), threads along the
        last pure dim (coalesced), the reduction walked in order."""
        name = stage.name
        x = stage.dims[-1]
        self.coalesce_inputs(stage, x)
        rest = [d for d in pure if d != x]
        rows = self.tile_rows(stage, rest)
        vector = self.thread_vector(stage, pure)
        threads = min(BLOCK_THREADS, _pow2_at_least(-(-self.size(x) // vector)))
        self.tree = self.tree.split(x, threads * vector, stage=name)
        thread_x, vector_loop, tile_loop = f"{x}.1", [], []
        if vector > 1:
            self.tree = self.tree.split(f"{x}.1", vector, stage=name)
            thread_x, vector_loop = f"{x}.1.0", [f"{x}.1.1"]
        tiled = rest[-1] if rows > 1 else None
        if tiled:
            self.tree = self.tree.split(tiled, rows, stage=name)
            rest, tile_loop = rest[:-1] + [f"{tiled}.0"], [f"{tiled}.1"]
        blocks, thread_loops, threads_y = [f"{x}.0"], [thread_x], 1
        if rest and threads < BLOCK_THREADS:          # a narrow output: its rows share a block
            y = rest.pop()
            threads_y = min(BLOCK_THREADS // threads, _pow2_at_least(self.extent(name, y)))
            self.tree = self.tree.split(y, threads_y, stage=name).bind(f"{y}.1", "thread.y", stage=name)
            blocks, thread_loops = [f"{y}.0", f"{x}.0"], [f"{y}.1", thread_x]
        self.tree = self.tree.reorder(*rest, *blocks, *thread_loops, *stage.reduce_dims, *tile_loop, *vector_loop,
                                      stage=name)
        self.tree = self.tree.bind(thread_x, "thread.x", stage=name)
        self.walked(name, list(stage.reduce_dims))
        for loop in tile_loop:
            self.tree = self.tree.unroll(loop, stage=name)
        for loop in vector_loop:
            self.tree = self.tree.vectorize(loop, stage=name)
        self.bind_grid(name, rest + blocks)
        tile = f" x {rows} along {tiled} (registers, each read of what does not move along it " \
               f"serving all {rows})" if tiled else ""
        along = contiguous_dim(self.tree.program, stage)
        why = f"rows of {self.size(along)}, shorter than {LONG_ROW}" if along in stage.reduce_dims else "not contiguous"
        self.note(name, f"reduction along {', '.join(stage.reduce_dims)} ({why}): a thread "
                        f"{'an output' if vector == 1 else f'{vector} outputs (a vector)'}{tile}, {threads * threads_y} "
                        f"threads a block along {x}" + (f" and {y}" if threads_y > 1 else ""))
