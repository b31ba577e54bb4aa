"""The analytical model: register tiles, cache blocks, vector widths and thread counts, from the
target's facts alone (after Low et al. 2016, "Analytical Modeling Is Enough for High-Performance
BLIS").  Nothing here knows a CPU by name; every figure comes from a `Target`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analysis.target import Target

# Independent vectors in flight in a loop with no reuse: an add or FMA has a latency of about
# four issue slots on current x86 and Arm cores, so four accumulators (or four loads) keep a
# pipe busy.  A fact of pipelines in general, the same for every target the model sees.
INDEPENDENT_VECTORS = 4
# ... times this for a reduction whose combining step is a chain of several instructions (a max or
# min propagates NaN, `llvm.maximum`, which x86 computes as a max, a compare and a blend), where the
# loop gives each vector at least INDEPENDENT_VECTORS steps (each vector more is one more combine at
# the end). Session 26, Xeon, one thread, interleaved: max over rows of 1024 in AVX2 code 11 % faster
# (8 % on two threads), softmax 2 %; AVX-512 code even, but for rows of 256 (attention 8x256x64) 1.7 %
# slower at 8 vectors, which this keeps at 4
CHAINED_REDUCTIONS = {"max": 2, "min": 2}
# A thread start and join costs about as much as this many simple loop iterations; a parallel
# loop must give every thread at least this much work.
WORK_PER_THREAD = 1 << 16
# Caches hold the blocks a loop nest re-reads only if they leave room for what streams past:
# blocks are sized to half of the cache level they live in.
CACHE_SHARE = 2


@dataclass(frozen=True)
class RegisterTile:
    """`rows` x `vectors` vectors of `lanes` accumulators, in registers across the reduction."""

    rows: int
    vectors: int
    lanes: int

    @property
    def columns(self) -> int:
        return self.vectors * self.lanes

    @property
    def registers(self) -> int:
        """Accumulators, one register per loaded vector of the reused operand, one broadcast."""
        return self.rows * self.vectors + self.vectors + 1

    def reason(self, target: Target) -> str:
        return (f"register tile {self.rows}x{self.columns}: {self.rows * self.vectors} accumulators of "
                f"{self.lanes} lanes + {self.vectors} operand vectors + 1 broadcast = {self.registers} "
                f"of {target.vector_registers} registers; {self.rows + self.vectors} loads per "
                f"{self.rows * self.vectors} FMAs")


def register_tile(target: Target, lanes: int, rows: int, columns: int, column_cores: int = 1) -> RegisterTile:
    """The tile that fits the register file with the fewest loads per FMA, counting the work
    wasted in partial tiles at the edges of `rows` x `columns` (BLIS: mr x nr with
    mr*nr/lanes + nr/lanes + 1 <= registers) and, where the column tiles are shared among
    `column_cores` cores (whole tiles each, at least one a core), the time the busiest core adds."""
    best, best_cost = RegisterTile(1, 1, lanes), float("inf")
    for mr in range(1, min(rows, target.vector_registers) + 1):
        for nv in range(1, -(-columns // lanes) + 1):
            tile = RegisterTile(mr, nv, lanes)
            if tile.registers > target.vector_registers:
                break
            loads_per_fma = (mr + nv) / (mr * nv)
            tiles = -(-columns // tile.columns)
            shared = -(-tiles // column_cores) * column_cores if tiles >= column_cores else tiles
            used = (rows / (-(-rows // mr) * mr)) * (columns / (shared * tile.columns))
            cost = loads_per_fma / used
            if cost < best_cost - 1e-12:
                best, best_cost = tile, cost
    return best


def balanced(extent: int, most: int, multiple: int = 1) -> int:
    """A block of at most about `most` (a multiple of `multiple`) that splits `extent` into equal blocks."""
    most = max(multiple, most // multiple * multiple)
    size = -(-extent // -(-extent // most))
    return min(-(-size // multiple) * multiple, extent)


def reduction_block(target: Target, tile: RegisterTile, itemsize: int, traffic=None, extent: int = 0) -> int:
    """kc: the reduction length whose reused micro-panel (kc x columns) fills the L1 ways it gets
    (`panel_ways`), as in BLIS's model (Low et al. 2016, section 3.3); or, where `traffic(kc)` (the bytes a
    core moves through L3 at that kc: `l3_traffic`) is less at it, the one that makes the micro-panel fill one
    of L2's ways, read from L2 (the register tile loads a few vectors of it a k step, within what L2 feeds L1),
    or the whole reduction's `extent`, one pass (its micro-panel read from L2 too); the shorter of equals.
    Xeon, 1000x777x1500 (5x80): 389 -> 777 (42.6 -> 40 MB by this count), 0.89-0.93 -> 0.95-1.01x OpenBLAS."""
    in_l1 = max(1, panel_ways(target, tile) * (target.l1 // max(1, target.l1_ways)) // (tile.columns * itemsize))
    if traffic is None:
        return in_l1
    in_l2 = target.l2 // max(1, target.l2_ways) // (tile.columns * itemsize)
    candidates = [in_l1] + [in_l2] * (in_l2 > in_l1) + [extent] * (extent > max(in_l1, in_l2))
    return min(candidates, key=traffic)


def l3_traffic(target: Target, tile: RegisterTile, kc: int, itemsize: int, extent: int, results: int,
               rows: int, reused: int) -> int:
    """The bytes a core reads and writes in L3 for a contraction at reduction block `kc`, where its `results`
    bytes leave L2 (`results_leave_l2`): each pass over the reduction's `extent` reads and writes the results,
    and each block of the broadcast operand's `rows` (as many as its room in L2 holds, `block_room`, counted as
    read in place: the most blocks) packs the `reused` operand's bytes again. Xeon (rocketlake, 5x80 tile),
    matmul 1024^3 one core: kc 128 -> 342 (72 -> 32 MB by this count), 164 -> 171-182 GFLOP/s; two cores
    292 -> 338-372. A 4x24 tile (AVX2)
    on a 512 KiB L2 keeps 256 (56 MB against 64 for 512: twice the row blocks, so twice the packing;
    measured 110 against 103 on the Xeon held to AVX2)."""
    if not results_leave_l2(target, results):
        return 0
    passes = -(-extent // kc)
    row_blocks = -(-rows // cache_block(block_room(target, tile, kc, itemsize, in_place=True), kc, itemsize))
    return 2 * (passes * results + row_blocks * reused)


def results_leave_l2(target: Target, results: int) -> bool:
    """Whether `results` bytes updated by each pass over a reduction take more than half of L2."""
    return results > target.l2 // CACHE_SHARE


def panel_ways(target: Target, tile: RegisterTile) -> int:
    """Of L1's ways, one is left to the results and whatever else passes through; the reused
    micro-panel and the broadcast operand's slice (rows x kc), read together, share the rest in
    proportion to their widths, the slice rounded up to whole ways.  With fewer than 4 ways
    (or none known) the micro-panel gets half of L1."""
    ways = target.l1_ways
    if ways < 4:
        return max(1, ways // CACHE_SHARE)
    fits = [w for w in range(1, ways) if w + -(-w * tile.rows // tile.columns) <= ways - 1]
    return max(fits, default=1)


def cache_block(room: int, kc: int, itemsize: int) -> int:
    """nc or mc: how many kc-long slices of an operand fit in `room` bytes."""
    return max(1, room // (kc * itemsize))


def panel_room(target: Target) -> int:
    """Bytes for the kc x nc panel of the reused operand (BLIS): half of this thread's share of L3, where
    its micro-panels are re-read once per row block."""
    return target.l3 // target.cores // CACHE_SHARE


def block_ways(target: Target, tile: RegisterTile, kc: int, itemsize: int) -> int:
    """Of L2's ways, those the mc x kc block of the broadcast operand gets (BLIS's model, Low et al. 2016,
    section 3.4, as `panel_ways` for L1): the block is re-read by every column tile while the reused
    operand's kc x nr micro-panels stream through L2 on their way to L1; one way is left to the results,
    the micro-panel gets the ways it fills, the block the rest.  With fewer than 4 ways (or none known) the
    block gets half of L2."""
    ways = target.l2_ways
    if ways < 4:
        return max(1, ways // CACHE_SHARE)
    panel = -(-kc * tile.columns * itemsize // max(1, target.l2 // ways))
    return max(1, ways - 1 - panel)


def block_room(target: Target, tile: RegisterTile, kc: int, itemsize: int, in_place: bool = True) -> int:
    """Bytes for the mc x kc block of the broadcast operand: the L2 ways it gets (`block_ways`), and, for a block
    read in place, no more than half of L2 (CACHE_SHARE). Read in place, each row's kc-long piece starts and
    ends inside a line and L2's streamer, seeing the row read in order, fetches past its end, so the block
    takes more of L2 than its bytes, and an L2 that does not evict its least recently used line first does not
    keep it near full. Xeon (2 MiB 16-way L2 by sysfs: an array read again and again comes from L2 at full speed
    up to 1.1 MiB, at 68 % at 1.5 MiB, 33 % at 2 MiB), 997x1001x1003 (5x80, kc 334, read in place): one block of
    997 rows (14 ways) against two of 500: 0.91 -> 0.96x OpenBLAS. A packed block is contiguous: 1024^3 (packed)
    ran the same or 2-3 % slower at two threads with the half (three blocks of 342 against two of 512)."""
    room = block_ways(target, tile, kc, itemsize) * (target.l2 // max(1, target.l2_ways))
    return min(room, target.l2 // CACHE_SHARE) if in_place else room


def set_load(target: Target, offsets: np.ndarray) -> int:
    """The most lines of L2 that data at byte `offsets` (from a line's start) puts in one set of L2 (a
    line's set is its number modulo L2 / ways / line): the ways it needs to stay in L2 as it lies."""
    sets = max(1, target.l2 // max(1, target.l2_ways) // target.line)
    lines = np.unique(np.asarray(offsets, dtype=np.int64).ravel() // target.line)
    return int(np.bincount(lines % sets).max())


def vector_width(target: Target, dtype: str, extent: int, reduce_op: str | None = None) -> int:
    """Lanes of one vectorized loop with no register reuse: INDEPENDENT_VECTORS vectors (more for the
    partial results of a max or min over a long loop: CHAINED_REDUCTIONS), no wider than the loop (a
    short loop is one short vector)."""
    lanes = target.lanes(dtype)
    if extent <= lanes:
        return extent
    vectors = INDEPENDENT_VECTORS * CHAINED_REDUCTIONS.get(reduce_op, 1)
    if extent < lanes * vectors * INDEPENDENT_VECTORS:
        vectors = INDEPENDENT_VECTORS
    return min(lanes * vectors, extent // lanes * lanes)


def accumulator_block(target: Target, itemsize: int, extent: int, width: int) -> int:
    """Columns per pass of a reduction over an outer dim (vectorized along a kept dim): as many
    accumulators as fit in the share of L1 the model allows, so that each pass reads whole stretches
    of rows and its accumulators stay in L1; a multiple of the vector `width`, and no more than
    extent / cores, so that every core gets a block."""
    most = target.l1 // CACHE_SHARE // itemsize
    if target.cores > 1:
        most = min(most, -(-extent // target.cores))
    return balanced(extent, most, width)


def worth_threads(target: Target, iterations: int, work: int) -> bool:
    """Whether a loop of `iterations` over `work` scalar iterations in all gives every core an iteration
    and work enough to pay for its thread."""
    return target.cores >= 2 and iterations >= target.cores and work >= WORK_PER_THREAD * target.cores


def threaded_time(target: Target, iterations: int, work: int, regions: int = 1) -> float:
    """The work the busiest core does when a loop of `iterations` (over `work` in all) runs on the cores,
    opened as a parallel region `regions` times a call (once per iteration of the loops around it): its
    whole iterations' share of the work, and a thread start and join (WORK_PER_THREAD) per region."""
    return -(-iterations // target.cores) / iterations * work + regions * WORK_PER_THREAD
