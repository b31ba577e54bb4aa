"""GPU schedule templates: register tiles on CUDA cores (`register_tiled`, with inputs staged in
shared memory and `transposed_ahead`), tensor-core tiles (`mma_tiled`, `wgmma_tiled`), and the
templates a contraction stage is offered when no schedule is given (`contraction_candidates`, which
the automatic scheduler `gpu_rules` tries in turn), built from the fastest configurations
`python -m bench.gpu` measured (`FLOAT32_TILES`, `TENSOR_START`).
The GPU tuner draws the same templates' parameters (tuner.space)."""
from __future__ import annotations

import functools
import logging
import math

from .. import ir
from ..analysis.gpu_target import WARP_LANES, GpuTarget
from ..frontend.dtypes import ITEM_BYTES
from ..schedule import TENSOR_INSTRUCTIONS, LoopTree

LOG = logging.getLogger(__name__)
UNROLL_LIMIT = 8
GRID_LIMITS = {"block.x": 2 ** 31 - 1, "block.y": 65535, "block.z": 65535}     # blocks a grid may have an axis
VECTOR_BYTES = 16            # the widest global load and store (ld.global.v4.f32)
# bench.gpu's fastest float32 schedule on an H100 (0.97-1.00x cuBLAS at 4096^3): A transposed ahead,
# 128 x 128 block tiles of 8 x 8 a thread (rows in 2 runs of 4), k tiles of 32 of both inputs copied
# by cp.async one k tile ahead
FLOAT32_TILES = {"x_threads": 16, "x_groups": 2, "vector": 4, "y_threads": 16, "y_tile": 8, "y_groups": 2,
                 "k_tile": 32, "stages": 2}
# ... but an input with k last is transposed ahead (a kernel of its own) only where a block walks at least this
# much of k; on shorter runs (split-k parts, small products) its k tiles are copied as stored. H100, session 24,
# kernels' ms ahead / as stored (run of k): bf16 100^3 0.0193 / 0.0149 (100), f32 64x8192x64 0.0286 / 0.0192
# (64), 333x444x555 0.0376 / 0.0314 (74), 200x300x500 0.026 / 0.020 (75), 257x511x129 0.0257 / 0.0183 (73),
# 512^3 0.0274 / 0.0243 (64), 128^3 0.0293 / 0.0207 (64), 768x3072x768 0.138 / 0.126 (512), 1000x1500x777
# 0.104 / 0.101 (300); 1024^3 0.0675 / 0.0768 (1024). The columns' input (B stored n-major: an attention
# head's k, a convolution's weights) from a run of TRANSPOSE_COLUMNS_AHEAD_RUN: its tiles read as stored slowed
# the conv f32 8x64x56x56's product (k 576) by 17 %, but sped the attention heads' q.k^T (k 64) with A's
# (1024x64 0.044 -> 0.035 ms, 4096x64 0.230 -> 0.193)
TRANSPOSE_AHEAD_RUN = 1024
# ... and the k tile is the longest of these that the run of k fills FLOAT32_TILES' stages of and whose pipeline
# leaves an SM's shared memory room for as many blocks as its registers hold (FLOAT32_THREAD_REGISTERS a thread:
# what ptxas gives the 8 x 4 and 8 x 8 tiles): a tile of 64 halves the tile loop's barriers and copy set-up, and
# a row of an input with k last copied as stored is 16 16-byte vectors, one for each of the 16 x threads (at 32,
# half of them copy it while the rest wait). H100, session 30, kernels' ms at 32 / 64: 128 x 64 blocks (2 of 97 KiB
# an SM; an A100's 164 KiB holds one) 1000x1500x777 (5 parts) 0.0902 / 0.0889, 1024^3 0.0669 / 0.0654, 333x444x555
# 0.0271 / 0.0250, 257x511x129 even; where 64 leaves fewer blocks an SM: 512^3 (64 x 64, 4 -> 3 an SM) 0.0241 /
# 0.0277, 8192x8192x32 (128 x 32, 4 -> 2) 0.152 / 0.258, 128 x 128 (2 -> 1) 4096^3 2.655 / 2.72, 2048^3 0.355 /
# 0.379, 1024x4096x1024 0.2028 / 0.2125, 768x3072x768 0.1085 / 0.1111, but with A copied as stored 1536^3
# (6 parts) 0.1959 / 0.1889, 640x8192x640 0.1926 / 0.1878
FLOAT32_K_TILES = (64, 32)
FLOAT32_THREAD_REGISTERS = 128
# a thread's rows come in FLOAT32_TILES' y_groups runs so that A's tile, stored along m, is copied in vectors of a
# run; where A is copied as stored (k last) in this many, but on FLOAT32_NARROW_BLOCK. H100, session 30, kernels'
# ms in 2 runs / 1 (one process): 1000x1500x777 0.0879 / 0.0849, 1536^3 0.1946 / 0.1916, 640x8192x640 0.1912 /
# 0.1884, 257x511x129 0.0175 / 0.0171, 1000x300x777 0.0411 / 0.0399, 512^3 0.0217 / 0.0198, 200x300x500 0.0156 /
# 0.0150; 333x444x555, 1024x64x1024, 331x277x413, 997x1001x1003 even; slower on the narrow block (8192x8192x32
# 0.1485 / 0.1550) and with A transposed ahead (1024^3 0.0673 / 0.0740, 4096^3 2.653 / 2.916)
STORED_ROWS_GROUPS = 1
# a register tile takes the k steps of a tile copied as stored (an input with k last: split-k's parts, short
# runs of k) in runs of this many, row by row, so each row's run is one 16-byte shared load where it was a word
# a step (LLVM's load-store vectorizer does not pair words 8 rows apart). Only where k is whole runs: its
# tail then tests whole runs, with no tail inside one. H100, session 29, kernels' ms a step at a time / in runs
# of 4 (bench.gpu_rules_variants --knob stored_k_run): 1000x1500x777 (5 parts) 0.0970 / 0.0912, 1536^3
# (6 parts) 0.2067 / 0.1960, 640x8192x640 0.2022 / 0.1912, 1024x512x1024 0.0406 / 0.0360, 200x300x500 0.0190 /
# 0.0163, 8192x8192x32 0.1604 / 0.1519, attention 4096x64 0.2858 / 0.2735; slower: 1000x300x777 0.0429 / 0.0451
# (its 64 x 64 tile's registers 128 -> 216), attention 1000x64 0.0429 / 0.0462; 8 others within 3 %
STORED_K_RUN = 4
TRANSPOSE_COLUMNS_AHEAD_RUN = 256
# a float32 contraction with fewer register-tile blocks than SMs has its k cut into the most parts (split-k)
# whose blocks still fit in one wave of this many blocks an SM, each part at least SPLIT_K_RUN long
# (bench.gpu_rules_variants --knob split_k_blocks, session 12 on an H200: 1000x1500x777 0.122 ms unsplit,
# 0.133 / 0.115 / 0.101 ms at 2 / 3 / 4 blocks an SM; 512^3 0.039 -> 0.032; 1024^3 0.066 either way).
# Session 21, H100, --knob split_k_run, kernels' ms at runs of at least 64 / 256 (then: the fewest parts
# reaching 4 blocks an SM): 64x8192x64 0.028 / 0.058, 333x444x555 0.034 / 0.049, 784x288x64 (a conv's
# product) 0.025 / 0.030, 200x300x500 0.028 / 0.034, 512^3 0.030 / 0.033; 1000x1500x777 in 6 parts (624
# blocks: a second wave 18 % full) took 0.124 against 0.103 in 5 (520: one wave)
SPLIT_K_BLOCKS = 4
SPLIT_K_RUN = 64
# ... preferring parts whose runs of k are whole 16-byte vectors (`aligned_first`; H100, session 26, kernels' ms
# and registers a thread: 333x444x555 in 128 x 64 blocks, 2 / 3 / 4 parts (runs of 222 / 148 / 111) 0.0395 (235)
# / 0.0287 (128) / 0.0303 (233); in 64 x 64 blocks the automatic 6 parts of 74 0.0331, 3 of 148 0.0285-0.0297;
# 1000x1500x777 in 128 x 64 blocks, 2 to 6 parts: 0.153 (225) / 0.118 (128) / 0.166 (225) / 0.100 (128) / 0.158 (225))
SPLIT_K_ALIGN = 16
# ... but over a dynamic dim, planned at the least size of its class, the fewest parts reaching those blocks,
# each at least this long: the parts' partial results grow with the rows a call brings (relu(x @ w), k = n =
# 1024, planned at 256 rows, in 16 parts of 64: at 1000 rows 99.9 us against 59.3 in 4 parts of 256, H100)
DYNAMIC_SPLIT_K_RUN = 256
# ... and only where its blocks leave more than this share of the SMs idle (H100, session 17: relu(x @ w)
# over 1000 x 1024 x 1024, 128 blocks on 132 SMs, 57 us unsplit against 63 split in 4 with its relu a
# kernel of its own; 1024^3 alone was even, 0.066 ms either way)
SPLIT_K_IDLE = 0.1
# float32 parts add their tiles into the result by atomic adds, no kernel adding them (`atomic_parts_total`)
SPLIT_K_ATOMIC = True
# ... and where they are (no epilogue), the parts and the block tile are the pair of least modelled time
# (`float32_cost`), one part included: whether the SMs are idle or their last wave part-full (H100, session 28,
# kernels' ms against the rule above: 1536^3 0.2461 whole on 128 x 64 (288 blocks, 2.2 an SM) against 0.1973 in
# 4 parts, 0.2018 in 6 on 128 x 128; 1024x4096x1024 0.2261 against 0.1984 in 4 parts on 128 x 128;
# 2048^3 and 4096^3 fastest whole on 128 x 128, 1024^3 on 128 x 64).
# The model: an SM runs ceil(blocks / SMs) blocks in turn, each costing its tile's outputs, plus
# TILE_LOAD_COST x (rows + columns) for the operand values a k step loads for them, times its run of k plus
# BLOCK_START_RUN (the steps its start and write-back take). Fitted to the same run: 128 x 64 tiles took 1.09x
# the time of 128 x 128 per output (1024x4096x1024 in 4 parts: 0.217 / 0.198), 64 x 64 1.28x (1000x1500x777
# in 5: 0.1253 / 0.0980 on 128 x 64, 256 threads of 4 x 4 then: `float32_tiles`); 1000x1500x777 on 128 x 64 in 15
# parts of 100 0.1205, in 5 of 300 0.0980. With 64 x 64 on 128 threads of 8 x 4 (a second run, 12 products, 70
# variants), its choice was 4 % slower than the best measured on the geometric mean, at most 15 % (640x8192x640:
# 128 x 128 in 32 parts 0.1996 ms, 64 x 64 in 32 0.1739; 1536^3 0.2070 against 0.1884 on 64 x 64 in 4): it does
# not count the blocks an SM holds at once (several of 64 x 64, one of 128 x 128)
TILE_LOAD_COST = 16
BLOCK_START_RUN = 40
# ... a split where that is at least SPLIT_K_GAIN less than whole's (its zeroing kernel and atomic adds are not
# modelled: 1024^3 whole on 128 x 64 0.0692 ms, in 2 parts on 128 x 128 0.0713, modelled 6 % less; 8192^3 21.12
# whole, 21.39 in 2, modelled 1 % less; 1024x2048x1024 0.1212 whole, 0.1114 in 2, modelled 7.3 % less), and
# wherever a dim's rows are not whole 16-byte vectors and the parts' are: whole, such a product is padded
# (three kernels more, not modelled), its parts are not (1000x300x777 0.0492 whole and padded, 0.0469 in 3
# parts, modelled 19 % more)
SPLIT_K_GAIN = 0.07
# and a half-precision one on tensor cores (whose blocks fill an SM alone): parts that give one block an
# SM, each at least HALF_SPLIT_K_RUN long and a whole number of the template's k tiles (H100, session 17,
# bench.gpu_rules_variants --knob half_split_k, kernels' ms unsplit / runs of 512 / 1024: bf16
# 256x16384x256 0.115 / 0.024 / 0.025, 512x8192x1024 0.067 / 0.047 / 0.036, 768x3072x768 0.032 / 0.028 /
# 0.024, 1024^3 0.017 / 0.022 / unsplit), only where its unsplit blocks keep less than HALF_SPLIT_K_BUSY of
# the SMs busy over their waves (`busy_share`: those three 3 to 27 %): the partial sums' round trip, a
# kernel more and the narrower tiles of the parts cost more than a grid nearer full gains (session 20,
# H200: 3072x2048x1024, 96 blocks on 132 SMs, 73 % busy, in 2 parts 52.6 us against 36.9 for
# 3072x2000x1024, which k did not let split)
HALF_SPLIT_K_BLOCKS = 1
HALF_SPLIT_K_BUSY = 0.5
HALF_SPLIT_K_RUN = 1024
# the block tiles (rows, columns) that template takes, largest first, for problems too small to fill
# the GPU with 128 x 128 (bench.gpu_rules_variants --knob float32_blocks: 1024^3 0.61 -> 0.87x torch).
# 64 x 64 (session 22, H200, --knob float32_block_sets, x torch without / with it): 331x277x413 0.70 / 0.78,
# 200x300x500 0.99 / 1.11, 257x511x129 1.04 / 1.13, 257x129x511 0.73 / 0.78; the larger ones keep their
# blocks. (Sessions 12-21 measured 64-row blocks 4x slower per output: their rows ran in runs of 2,
# which made A's copy scalar: `float32_tiles`.)
FLOAT32_BLOCKS = ((128, 128), (128, 64), (64, 64))
# the block tile of a contraction narrower than those (n < 64: an attention head's p . v with a 32-wide v),
# its 256 threads 8 x 32 (H200, session 22: 8192 x 8192 x 32 took 857 us on the reduction rules, torch 139)
FLOAT32_NARROW_BLOCK = (128, 32)
# the block tiles of a float32 contraction shorter than those (8 <= m < 64: a linear layer on a few rows,
# whose B is read once and whose A is small), the most rows first: it takes the first its rows hold (H100,
# session 34, x torch on the reduction rules / 32 x 128 / 16 x 128, each in its best parts: 32x4096x4096
# 0.08 / 1.42 / 1.00, 32x1024x8192 0.12 / 1.57 / 1.18, 40x2000x3000 0.33 / 1.19 / 1.10; 16x4096x4096 0.12 /
# - / 2.25; 8x4096x4096 0.07, on 8 x 128 1.42). Fewer rows keep the reduction rules (1x4096x4096 0.87x, 0.55
# split for these blocks' SMs). Half precision keeps its tensor-core tiles: on these register tiles (CUDA
# cores) bfloat16 24x4096x4096 went 0.45 -> 0.24x torch
FLOAT32_SHORT_BLOCKS = ((32, 128), (16, 128), (8, 128))
# ... cut into the fewest parts (runs of at least SPLIT_K_RUN) giving this many blocks an SM: the blocks are
# small, several run on an SM at once (H100, 32x4096x4096 in 2 / 4 / 8 / 16 parts: 179 / 98 / 59 / 42 us;
# 40x2000x3000 in 5 / 10 / 20 / 40: 55 / 36 / 39 / 46 us)
SHORT_SPLIT_K_BLOCKS = 3
# the multiples (m, n, k) a half-precision contraction off the mma grid is padded to, tried in turn: the
# wgmma template's warpgroup tiles (64 rows, its 64-deep k tiles) with any multiple of 8 columns (wgmma
# takes N = 8..256 where B is k-major), then with its 256 columns (where B is n-major, its rows must be
# multiples of 64), then mma's 16 x 8 x 16; on Hopper all but the last take wgmma only
TENSOR_PADS = ((64, 8, 64), (64, 256, 64), (16, 8, 16))
# and its fastest half-precision schedules: (block, teams, k tile, stages, copier) of each tensor-core family
# (wgmma: 4 stages of 48 KiB for 128 x 256, one spare: `codegen.gpu_copies.TMA_SPARE_STAGE`)
TENSOR_START = {"wgmma": ((128, 256), (2, 1), 64, 4, "tma"), "mma": ((128, 256), (2, 4), 64, 2, "cp.async")}
# and the wgmma template where k is one k tile (nothing to pipeline): 64 x 128 blocks of one warpgroup,
# several resident an SM so one's write-back overlaps another's loads, copied by cp.async (TMA's barriers
# are not paid back by one tile). The H100's GPU study of batched bf16 16x1024x64x1024 (session 13,
# bench.gpu_tuned, 64 trials): this 32.0 us, its TMA twin 34.7, the 128 x 256 default 38.9
WGMMA_ONE_K_TILE = ((64, 128), (1, 1), 64, 2, "cp.async")
# ... and where m is at most 64 rows (a linear layer on a few tokens; fewer rows padded to 64, by TMA's zero
# fill), 64 x 128 blocks of one warpgroup: a 128-row block would compute as many zero rows as real ones
WGMMA_SHORT_START = ((64, 128), (1, 1), 64, 4, "tma")
# ... products of fewer rows (not small: `small_contraction`) split into parts (`short_half`, as `_half_parts`
# splits others) before they are padded, on Hopper on the mma grid too, the parts' sum reading the padded parts
# in place (H100, session 34, bfloat16 kernels' us before / after, bench.gpu_rules_variants --knob wgmma_short:
# 8x4096x4096 51.1 / 22.6, 24x4096x4096 51.5 / 22.0, 32x4096x4096 24.9 / 22.7 (mma tiles 128 x 256 before),
# 63x4096x4096 53.3 / 24.8, 40x2000x3000 36.0 / 25.1, 32x11008x4096 62.6 / 48.5, 16x8192x1024 21.4 / 23.9;
# runs of 256 or two blocks an SM were slower); small ones keep the reduction rules' dot products
# (1x4096x4096: 1.24x torch whole, 1.07 in parts)
# half-precision contractions of at most this many multiply-adds off the mma grid are not padded
# (`small_contraction`; H100, session 22, x torch padded / not: bf16 100^3 0.61 / 0.99, 64x100x72 0.68 / 0.93,
# 200x300x100 0.66 / 0.84; 100x1000x100 0.68 / 0.64; 130x64x200 keeps its one wgmma kernel with guarded edges, 1.50)
SMALL_CONTRACTION_MACS = 1 << 25
# the wgmma template's block tiles, largest first, for problems its 128 x 256 leaves SMs idle on; 128 x 64
# only for products at most 64 columns wide (a convolution's 64 output channels): wider ones ran slower
# on it than its fewer waves suggest (H100, session 13, bench.gpu_rules_variants --knob wgmma_blocks:
# 3000x2000x1000 64.5 us against 52.2 for 128 x 256, 1000^3 25.0 against 23.7 for 128 x 128)
WGMMA_BLOCKS = ((128, 256), (128, 128))
WGMMA_NARROW_BLOCK = (128, 64)
# ... and where 128 x 256 blocks take more than one wave, 128 x 128 blocks two an SM (pipelined in as many
# stages as leave two blocks room in an SM's shared memory: 3 on Hopper), one's write-back and a last part-full
# wave running beside the other's products, where an SM's tiles of them (ceil(blocks / SMs)) times
# PAIRED_TILE_SHARE (a 128 x 128 tile's time two an SM against a 128 x 256 tile's alone) come to less than its
# 128 x 256 tiles. H100, session 24 (scratch variants, kernels' ms, 128 x 256 in 4 stages / 128 x 128 in 3;
# share per tile): 8192x768x768 0.0369 / 0.0326 (0.59), 4096^3 0.2008 / 0.2307 (0.57), 2048x4096x4096 0.109 /
# 0.121 (0.55), 2048x11008x4096 0.258 / 0.335 (0.65), 2048x512x8192 0.054 / 0.056 (0.52); k of at most
# PAIRED_SHORT_K k tiles (a write-back as long as the products): 32x2048x128x2048 (batched) 0.245 / 0.212
# (0.44), with a bf16 result 0.253 / 0.203, 16x1024x256x1024 0.051 / 0.047 (0.46), 4096x256x4096 0.047 /
# 0.046 (0.49)
PAIRED_BLOCK = (128, 128)
PAIRED_TILE_SHARE = 0.55
PAIRED_SHORT_K = 4
PAIRED_SHORT_K_SHARE = 0.45
BLOCK_RESERVED_SHARED = 1024    # bytes of an SM's shared memory the driver keeps for each resident block
# Persistent wgmma kernels: as many blocks as fit the SMs at once run every tile in turn (in groups of rows:
# codegen.gpu_copies.TILE_GROUP_ROWS), each issuing its next tile's first TMA copies while it finishes the current
# one (its copies' latency and write-back then overlap). Where products take at least PERSISTENT_WAVES waves of
# blocks of whole tiles and the write-back is at most PERSISTENT_STORE_SHARE of a tile's loads. H100, session 25
# (kernels' ms, a block a tile / persistent in rows of tiles / persistent in groups of 8 rows): 4096x512x4096
# 0.0575 / 0.0541, 2048x512x8192 0.0548 / 0.0505, 8192x512x4096 0.0968 / 0.088 / 0.084, 4096^3 0.2015 / 0.2025 /
# 0.1976, 8192^3 1.590 / 1.721 / 1.571, 2048x4096x11008 0.3358 / 0.3466 / 0.2992, batched 32x2048x128x2048 with a
# bf16 result 0.2041 / 0.1747; slower with a float32 result as heavy as the loads (the same batched product)
# 0.213 / 0.236, at 1.45 waves (2048x768x3072, 8192x768x768) 5-9 %, and with edge tiles: 6000^3 0.852 / 0.946 /
# 0.970, 6000x4096x6000 0.508 / 0.592 / 0.672, 3000x2000x1000 0.0439 / 0.0465 / 0.0475, 3000x256x5000 0.0483 / 0.0505.
PERSISTENT_WAVES = 2
PERSISTENT_STORE_SHARE = 0.5
# wgmma tiles cut at the ends of m and n (computed whole, stored under guards) before the tiles of a
# padded copy: on. On the H100 (session 12, bench.gpu_rules_variants --knob wgmma_edges) bf16 1000^3 as
# one such kernel took 22.4 us against 26.1 us for the padded product and its copy back (2 kernels);
# session 11's version, with a branch around each wgmma (which ptxas serializes), had run at 0.49x torch
WGMMA_EDGE_TILES = True
# ... so on Hopper a half-precision product off the mma grid, not small (`small_contraction`: the reduction rules
# take those), is split along k as one on it is (`_half_parts`, where k is whole k tiles), its parts one wgmma
# kernel with such edges: whole, bfloat16 200x4096x200 took 4
# blocks and 1000x4096x200 16 on 132 SMs, each walking all of k (session 34, found by a plan audit on the CPU;
# not yet timed)
HALF_SPLIT_OFF_GRID = True


def contraction_dtype(program: ir.Program, stage: str | None = None) -> str | None:
    """The dtype of both tensors of a stage (default: a one-stage program's only one) that sums the
    product of two buffers (inputs, or results of earlier stages) of one dtype over one dim, or None."""
    if stage is None and len(program.stages) != 1:
        return None
    st = program.stage(stage) if stage else program.output
    if st.reduce_op != "sum" or len(st.reduce_dims) != 1:
        return None
    buffers = {b.name: b.dtype for b in program.inputs} | {s.name: s.dtype for s in program.stages}
    dtypes = [buffers.get(load.buffer) for load in _loads(st)]
    return dtypes[0] if len(dtypes) == 2 and dtypes[0] is not None and dtypes[0] == dtypes[1] else None


def split_k_parts(program: ir.Program, sms: int, hopper: bool = True) -> int:
    """The parts `ir.split_k` cuts a contraction's k into (its first stage's, maybe followed by an epilogue)
    on a GPU of `sms` SMs (`hopper`: with wgmma): float32 on register tiles (`_float32_parts`), half
    precision on tensor cores (`_half_parts`, products of two matrices, not dynamic; off the mma grid only
    on Hopper or with few rows). Else 1."""
    if not ir.splittable(program):
        return 1
    stage = program.stages[0]
    dtype = contraction_dtype(program, stage.name)
    if len(stage.dims) < 2 or dtype is None or (program.dynamic and dtype != "float32"):
        return 1                # (a dot product: the reduction rules; dynamic half precision: not tried)
    if dtype == "float32":
        return _float32_parts(program, stage, sms)
    off_grid = hopper and WGMMA_EDGE_TILES and HALF_SPLIT_OFF_GRID and not small_contraction(program, stage.name)
    if len(stage.dims) == 2 and (tensor_tiles_fit(program, stage.name) or short_half(program, stage.name) or off_grid):
        return _half_parts(program, stage, sms, hopper)     # (a batch: no second batch dim; few rows: padded after)
    return 1


def _dividing_parts(program: ir.Program, stage: ir.Stage, shortest: int, k_tile: int) -> list[int]:
    """The part counts that cut `stage`'s k into runs of at least `shortest`, whole `k_tile`s each, those whose
    parts start on 16-byte boundaries first (`aligned_first`)."""
    size = program.size(stage.reduce_dims[0])
    counts = [parts for parts in range(2, size // shortest + 1) if size % (parts * k_tile) == 0]
    return aligned_first(counts, size, ITEM_BYTES[contraction_dtype(program, stage.name)])


def _float32_parts(program: ir.Program, stage: ir.Stage, sms: int) -> int:
    """`split_k_parts` of a float32 contraction on register tiles: where its rows are short (`short_rows`) and
    its parts would be added into the result atomically (`split_atomically`), the fewest parts giving
    SHORT_SPLIT_K_BLOCKS blocks an SM; elsewhere where they would be added so, the count and block tile of
    least `float32_cost`, each part at least SPLIT_K_RUN long, where that is SPLIT_K_GAIN less than one
    part's or the product whole would be padded and its parts start on 16-byte boundaries (`whole_rows`);
    else only where its blocks
    (`float32_block`) leave more than SPLIT_K_IDLE of the SMs idle: the most, each at least SPLIT_K_RUN long,
    whose blocks fit in one wave of SPLIT_K_BLOCKS an SM (over a dynamic dim: the fewest, each at least
    DYNAMIC_SPLIT_K_RUN long, that reach it, else the most)."""
    dividing = _dividing_parts(program, stage, DYNAMIC_SPLIT_K_RUN if program.dynamic else SPLIT_K_RUN, 1)
    if short_rows(program, stage.name) and dividing and split_atomically(program, dividing[0]):
        whole = block_count(program, stage.name, float32_blocks(program, stage.name)[0])
        wave = SHORT_SPLIT_K_BLOCKS * sms
        return 1 if whole >= wave else next((parts for parts in dividing if whole * parts >= wave), max(dividing))
    if not program.dynamic and dividing and split_atomically(program, dividing[0]):
        def cost(parts: int) -> float:
            return min(_float32_costs(program, stage.name, sms, parts).values())
        parts = min(dividing, key=lambda parts: (cost(parts), parts))
        size = program.size(stage.reduce_dims[0])
        padded_whole = not whole_rows(program, stage.name) and starts_aligned(parts, size, ITEM_BYTES["float32"])
        return parts if padded_whole or cost(parts) <= (1 - SPLIT_K_GAIN) * cost(1) else 1
    whole = block_count(program, stage.name, float32_block(program, stage.name, sms))
    wave = SPLIT_K_BLOCKS * sms
    if not SPLIT_K_BLOCKS or whole >= (1 - SPLIT_K_IDLE) * sms:
        return 1
    if not program.dynamic:
        return max((parts for parts in dividing if whole * parts <= wave), default=1)
    return next((parts for parts in dividing if whole * parts >= wave), max(dividing, default=1))


def _half_parts(program: ir.Program, stage: ir.Stage, sms: int, hopper: bool) -> int:
    """`split_k_parts` of a half-precision product of two matrices on tensor cores, with its template's block
    (`wgmma_block`, or mma's): where its unsplit blocks keep less than HALF_SPLIT_K_BUSY of the SMs busy, the
    fewest parts in runs of at least HALF_SPLIT_K_RUN in whole k tiles that give HALF_SPLIT_K_BLOCKS blocks an
    SM (where none does, the most)."""
    blocks = _half_blocks(program, sms, hopper)
    wave = HALF_SPLIT_K_BLOCKS * sms
    if not HALF_SPLIT_K_BLOCKS or blocks(1) >= (1 - SPLIT_K_IDLE) * sms or busy_share(blocks(1), wave) >= HALF_SPLIT_K_BUSY:
        return 1
    dividing = _dividing_parts(program, stage, HALF_SPLIT_K_RUN, TENSOR_START["wgmma" if hopper else "mma"][2])
    return next((parts for parts in dividing if blocks(parts) >= wave), max(dividing, default=1))


def split_atomically(program: ir.Program, parts: int) -> bool:
    """Whether `program` cut into `parts` (`ir.split_k`) has its parts added into the result atomically
    (`atomic_parts_total`)."""
    split = ir.split_k(program, parts)
    return split is not None and atomic_parts_total(split, split.stages[0].name) is not None


def float32_cost(blocks: int, block: tuple[int, int], run: int, sms: int) -> float:
    """The modelled time of `blocks` register-tile blocks of `block` (rows, columns), each summing a run of k
    of `run`, on `sms` SMs (see TILE_LOAD_COST): an SM runs ceil(blocks / sms) of them in turn."""
    rows, columns = block
    return -(-blocks // sms) * (rows * columns + TILE_LOAD_COST * (rows + columns)) * (run + BLOCK_START_RUN)


def _float32_costs(program: ir.Program, stage: str, sms: int, parts: int = 1) -> dict[tuple[int, int], float]:
    """The `float32_cost` of each register-tile block of `float32_blocks` for contraction `stage`, its k cut
    into `parts` more."""
    run = program.size(program.stage(stage).reduce_dims[0]) // parts
    return {block: float32_cost(block_count(program, stage, block) * parts, block, run, sms)
            for block in float32_blocks(program, stage)}


def aligned_first(parts: list[int], size: int, item: int) -> list[int]:
    """Of the part counts `parts` of a k of `size`, those whose parts start on SPLIT_K_ALIGN-byte boundaries
    (where any do), else all: a part off them loads its k-last rows in scalars, which doubled the register
    tile's registers and halved the blocks an SM holds."""
    return [p for p in parts if starts_aligned(p, size, item)] or parts


def starts_aligned(parts: int, size: int, item: int) -> bool:
    """Whether each of `parts` parts of a k of `size` (items of `item` bytes) starts on an SPLIT_K_ALIGN-byte
    boundary."""
    return size // parts * item % SPLIT_K_ALIGN == 0


def busy_share(blocks: int, slots: int) -> float:
    """The share of `slots` (blocks resident at once) that `blocks` keep busy over the waves they take."""
    return blocks / (-(-blocks // slots) * slots)


def _half_blocks(program: ir.Program, sms: int, hopper: bool):
    """A function of the parts giving the blocks a half-precision contraction cut into them takes on its
    tensor-core template (whose block the parts' program chooses again: `wgmma_block`, WGMMA_SHORT_START's where
    its rows are short, or mma's)."""
    def blocks(parts: int) -> int:
        split = ir.split_k(program, parts) if parts > 1 else program
        stage = split.stages[0].name
        if not hopper:
            return block_count(split, stage, TENSOR_START["mma"][0])
        short = short_half(split, stage)
        block = narrowed(split, stage, WGMMA_SHORT_START[0]) if short else wgmma_block(split, stage, sms)
        return block_count(split, stage, block)
    return blocks


def contraction_candidates(tree: LoopTree, stage: str, hopper: bool, gpu: GpuTarget | None = None) \
        -> list[tuple[str, LoopTree]]:
    """(description, tree) for each template that fits the contraction `stage`, best first: half
    precision on tensor cores (`TENSOR_START`: wgmma on a Hopper GPU, `WGMMA_ONE_K_TILE` where k is one
    k tile, then mma, which takes narrower edges) where its sizes are whole mma tiles; then register tiles on CUDA cores (`FLOAT32_TILES`, 2-D inputs with k last
    transposed ahead, dynamic rows kept in blocks of the block tile's), where its matrices hold a block tile, the tile chosen for a GPU of `sms` SMs
    (`float32_block`; so is the wgmma template's: `wgmma_start`). The legality check still has the last word (wgmma's wide tiles, for one, take no tail)."""
    dtype = contraction_dtype(tree.program, stage)
    sms = gpu and gpu.sms
    candidates = []
    if dtype in ("bfloat16", "float16") and tensor_tiles_fit(tree.program, stage):
        for family, build in (("wgmma", wgmma_tiled), ("mma", mma_tiled))[0 if hopper else 1:]:
            block, teams, k_tile, stages, copier = TENSOR_START[family]
            persistent = 0
            if family == "wgmma":
                block, teams, k_tile, stages, copier = wgmma_start(tree.program, stage, gpu)
                if not WGMMA_EDGE_TILES and not wgmma_whole_tiles(tree.program, stage, block, teams):
                    continue
                persistent = persistent_grid(tree.program, stage, gpu, block, k_tile, stages, copier)
                build = functools.partial(wgmma_tiled, persistent=persistent)
            try:
                described = f"{family} tensor-core tiles {block[0]}x{block[1]}x{k_tile}, {stages} stages by {copier}" \
                    + (", two blocks an SM (their waves fuller than 128x256 alone)" if family == "wgmma" and
                       (block, stages) == (PAIRED_BLOCK, paired_stages(tree.program, stage, gpu, WGMMA_BLOCKS[0])) else "") \
                    + persistent_note(persistent)
                candidates.append((described, build(tree, stage, block, teams, k_tile, stages, copier)))
            except ValueError as err:
                LOG.debug("no %s template for %s: %s", family, stage, err)
    if dtype in ("float32", "bfloat16", "float16"):
        try:
            block = float32_block(tree.program, stage, sms)
            plan = float32_plan(tree, stage, block, gpu)
            tiled = _float32_tree(tree, stage, block, plan)
            candidates.append((f"register tiles on CUDA cores, {block[0]}x{block[1]} a block (inputs with k last "
                               f"{float32_copy(tree, stage, plan['ahead'])}, dynamic rows in blocks), cp.async k "
                               f"tiles of {plan['k_tile']}", tiled))
        except ValueError as err:
            LOG.debug("no register-tile template for %s: %s", stage, err)
    return candidates


def contraction_dims(program: ir.Program, stage: str) -> tuple[str, str, str] | None:
    """(m, n, k) of a contraction stage: its last two pure dims and its reduction dim."""
    st = program.stage(stage)
    pure = [d for d in st.loop_dims if d not in st.reduce_dims]
    return (*pure[-2:], st.reduce_dims[0]) if len(pure) >= 2 and len(st.reduce_dims) == 1 else None


def tensor_tiles_fit(program: ir.Program, stage: str) -> bool:
    """Whether the contraction's m, n and k are whole mma tiles (16, 8, 16; the tensor-core templates
    skip only whole tiles at the edges)."""
    dims = contraction_dims(program, stage)
    if dims is None:
        return False
    shape = TENSOR_INSTRUCTIONS["mma.m16n8k16"]
    m, n, k = dims
    return program.size(m) % shape["m"] == 0 and program.size(n) % shape["n"] == 0 \
        and program.size(k) % shape["k"] == 0


def wgmma_whole_tiles(program: ir.Program, stage: str, block: tuple[int, int], teams: tuple[int, int]) -> bool:
    """Whether the wgmma template's tiles (64 rows; the widest wgmma N dividing a warpgroup's columns)
    cover the contraction's m and n whole, so that a tail skips only whole tiles."""
    m, n, _ = contraction_dims(program, stage)
    columns = block[1] // teams[1]
    width = max(shape["n"] for shape in TENSOR_INSTRUCTIONS.values()
                if shape["warps"] > 1 and columns % shape["n"] == 0)
    return program.size(m) % TENSOR_INSTRUCTIONS[f"wgmma.m64n{width}k16"]["m"] == 0 and program.size(n) % width == 0


def least_traffic_block(program: ir.Program, stage: str, sms: int | None,
                        blocks: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """The tensor-core block tile (rows, columns) of `blocks`, narrowed to n (`narrowed`), whose SM loads the
    fewest operand rows: a block loads rows + columns of k each k step, and blocks come in waves of one an
    SM. A wgmma tile runs at the pace of those loads (H200, session 20: 128 x 128 took 1.40-1.47x the
    time of 128 x 256 per output at 5952^3 and 6144^3, the (128 + 128) / 128^2 against (128 + 256) / (128 x
    256) of its loads per output). On a tie the larger tile. Without an SM count, the first."""
    shapes = [narrowed(program, stage, block) for block in blocks]
    return _least_per_sm(program, stage, sms, shapes, lambda block: block[0] + block[1])


def _least_per_sm(program: ir.Program, stage: str, sms: int | None, blocks: list[tuple[int, int]], cost) -> tuple[int, int]:
    """The block of `blocks` that leaves an SM the least `cost` (of one block) over its waves of one block an
    SM; on a tie the larger; without an SM count, the first."""
    if sms is None or tile_dims(program.stage(stage))[1] is None:
        return blocks[0]
    return min(blocks, key=lambda block: (-(-block_count(program, stage, block) // sms) * cost(block),
                                          -block[0] * block[1]))


def block_count(program: ir.Program, stage: str, block: tuple[int, int]) -> int:
    """The blocks of `block` (rows, columns) tiles a contraction stage's result takes, batch dims included."""
    x, y, others = tile_dims(program.stage(stage))
    return math.prod(program.size(d) for d in others) * -(-program.size(y) // block[0]) * -(-program.size(x) // block[1])


def wgmma_start(program: ir.Program, stage: str, gpu: GpuTarget | None) -> tuple:
    """(block, teams, k tile, stages, copier) of the wgmma template for a contraction stage on `gpu` (None: not
    known): WGMMA_ONE_K_TILE where its k is one k tile, else TENSOR_START's with the block of `wgmma_block`, or
    PAIRED_BLOCK two an SM in `paired_stages` where those are expected faster; blocks narrowed to n."""
    block, teams, k_tile, stages, copier = TENSOR_START["wgmma"]
    m, _, k = contraction_dims(program, stage)
    if program.size(k) <= k_tile:
        block, teams, k_tile, stages, copier = WGMMA_ONE_K_TILE
        return narrowed(program, stage, block), teams, k_tile, stages, copier
    if program.size(m) <= WGMMA_SHORT_START[0][0]:
        block, teams, k_tile, stages, copier = WGMMA_SHORT_START
        return narrowed(program, stage, block), teams, k_tile, stages, copier
    block = wgmma_block(program, stage, gpu and gpu.sms)
    paired = paired_stages(program, stage, gpu, block)
    return (PAIRED_BLOCK, teams, k_tile, paired, copier) if paired else (block, teams, k_tile, stages, copier)


def persistent_grid(program: ir.Program, stage: str, gpu: GpuTarget | None, block: tuple[int, int], k_tile: int,
                    stages: int, copier: str) -> int:
    """The blocks of a persistent wgmma kernel (as many of its blocks as `gpu`'s SMs hold at once, by shared
    memory) where its pipelined TMA copies run on across tiles to advantage: at least PERSISTENT_WAVES
    waves of blocks, m and n whole tiles, a tile's write-back at most PERSISTENT_STORE_SHARE of its loads;
    else 0 (a block a tile)."""
    if gpu is None or copier != "tma" or stages < 2 or program.dynamic:
        return 0
    item = ITEM_BYTES[contraction_dtype(program, stage)]
    grid = resident_grid(gpu, block, k_tile, stages, item)
    m, n, k = (program.size(d) for d in contraction_dims(program, stage))
    loads = sum(block) * k * item
    stores = block[0] * block[1] * ITEM_BYTES[result_dtype(program, stage)]
    if grid < 1 or block_count(program, stage, block) < PERSISTENT_WAVES * grid \
            or m % block[0] or n % block[1] or stores > PERSISTENT_STORE_SHARE * loads:
        return 0
    return grid


def resident_grid(gpu: GpuTarget, block: tuple[int, int], k_tile: int, stages: int, item: int) -> int:
    """How many blocks of a pipelined tensor-core template (`stages` k tiles of `item`-byte operands) `gpu`'s
    SMs hold at once, by their shared memory: a persistent kernel's grid."""
    per_sm = gpu.shared_per_sm // (stage_bytes(block, k_tile, item) * stages + BLOCK_RESERVED_SHARED)
    return per_sm * gpu.sms


def stage_bytes(block: tuple[int, int], k_tile: int, item: int) -> int:
    """Shared memory one pipeline stage of a tensor-core template takes: a k tile of both operands' tiles."""
    return sum(block) * k_tile * item


def persistent_note(persistent: int) -> str:
    """What `explain` says of a persistent kernel (nothing for 0)."""
    return (f", persistent: {persistent} blocks run the tiles in turn (in groups of rows), each copying its next "
            f"tile's first k tiles while it finishes one") if persistent else ""


def result_dtype(program: ir.Program, stage: str) -> str:
    """The dtype a contraction's tile is written back in: the program's result's where that is the
    contraction's result moved through pointwise stages (a bias, a cast), else the stage's own."""
    out, st = program.output, program.stage(stage)
    pure = [d for d in st.loop_dims if d not in st.reduce_dims]
    return out.dtype if not out.reduce_dims and list(out.dims) == pure else st.dtype


def paired_stages(program: ir.Program, stage: str, gpu: GpuTarget | None, block: tuple[int, int]) -> int:
    """The pipeline stages of PAIRED_BLOCK tiles, two blocks an SM of `gpu`, where a contraction's `block` tiles
    (the widest wgmma block) take more than one wave and its SMs' tiles of the paired blocks, each counted
    PAIRED_TILE_SHARE (PAIRED_SHORT_K_SHARE where k is at most PAIRED_SHORT_K k tiles), come to fewer; else 0."""
    if gpu is None or block != WGMMA_BLOCKS[0]:
        return 0
    whole = block_count(program, stage, block)
    k_tile = TENSOR_START["wgmma"][2]
    one_stage = stage_bytes(PAIRED_BLOCK, k_tile, ITEM_BYTES[contraction_dtype(program, stage)])
    stages = min(TENSOR_START["wgmma"][3], (gpu.shared_per_sm // 2 - BLOCK_RESERVED_SHARED) // one_stage)
    if whole <= gpu.sms or stages < 2:
        return 0
    short = program.size(contraction_dims(program, stage)[2]) <= PAIRED_SHORT_K * k_tile
    share = PAIRED_SHORT_K_SHARE if short else PAIRED_TILE_SHARE
    paired = block_count(program, stage, PAIRED_BLOCK)
    return stages if -(-paired // gpu.sms) * share < -(-whole // gpu.sms) else 0


def wgmma_block(program: ir.Program, stage: str, sms: int | None) -> tuple[int, int]:
    """The wgmma template's block tile: `least_traffic_block` of WGMMA_BLOCKS (and WGMMA_NARROW_BLOCK where n
    is at most its width), its columns narrowed to n (a multiple of 8) where n is narrower: a
    convolution's 40 output channels take one 64 x 40 wgmma tile, not a 64-wide one that the n loop
    cannot fill."""
    narrow = program.size(contraction_dims(program, stage)[1]) <= WGMMA_NARROW_BLOCK[1]
    blocks = WGMMA_BLOCKS + ((WGMMA_NARROW_BLOCK,) if narrow else ())
    return least_traffic_block(program, stage, sms, blocks)


def narrowed(program: ir.Program, stage: str, block: tuple[int, int]) -> tuple[int, int]:
    """A wgmma block tile with its columns cut to the contraction's n, rounded up to a multiple of 8."""
    n = program.size(contraction_dims(program, stage)[1])
    return block[0], min(block[1], -(-n // 8) * 8)


def float32_k_tile(program: ir.Program, stage: str, block: tuple[int, int], gpu: GpuTarget | None) -> int:
    """The k tile of the register-tile template of contraction `stage` on `block` (see FLOAT32_K_TILES): the
    longest that the run of k fills the pipeline's stages of and whose stages leave `gpu`'s SMs room for the
    blocks their registers hold; FLOAT32_TILES' without a GPU or over a dynamic k."""
    tiles = float32_tiles(block)
    run = program.size(program.stage(stage).reduce_dims[0])
    if gpu is None or not isinstance(run, int):
        return tiles["k_tile"]
    by_registers = gpu.registers_per_sm // (tiles["x_threads"] * tiles["y_threads"] * FLOAT32_THREAD_REGISTERS)
    item = ITEM_BYTES[contraction_dtype(program, stage)]

    def fits(k_tile: int) -> bool:
        per_block = tiles["stages"] * stage_bytes(block, k_tile, item) + BLOCK_RESERVED_SHARED
        return run >= tiles["stages"] * k_tile and gpu.shared_per_sm // per_block >= by_registers
    return next((k_tile for k_tile in FLOAT32_K_TILES if fits(k_tile)), tiles["k_tile"])


def float32_tiles(block: tuple[int, int], k_tile: int | None = None) -> dict:
    """FLOAT32_TILES for a block tile of (rows, columns): each thread FLOAT32_TILES' rows (8, in runs of 4: A's
    tile, stored along m, is copied in vectors of a run) and up to its columns, the block as many threads as
    that takes (64 x 64: 128 threads of 8 x 4; before session 28 every block took 256 threads, 64 x 64 then
    4 x 4 a thread, 24 % slower: H100, 1000x1500x777 in 5 parts 0.1215 against 0.0983 ms, 1536^3 in 6 0.1875
    on 64 x 64 against 0.2006 on 128 x 128)."""
    rows, columns = block
    tiles = dict(FLOAT32_TILES, k_tile=k_tile or FLOAT32_TILES["k_tile"])
    x_threads = min(tiles["x_threads"], columns // tiles["vector"])
    y_threads = max(rows // tiles["y_tile"], 1)
    y_tile = rows // y_threads
    tiles.update(x_threads=x_threads, y_threads=y_threads, x_groups=columns // (x_threads * tiles["vector"]),
                 y_tile=y_tile, y_groups=tiles["y_groups"] if y_tile // tiles["y_groups"] >= tiles["vector"] else 1)
    return tiles


def float32_blocks(program: ir.Program, stage: str) -> tuple[tuple[int, int], ...]:
    """The register-tile block tiles a contraction stage may take: FLOAT32_BLOCKS, or FLOAT32_NARROW_BLOCK
    where its n is narrower than all of them, or the first of FLOAT32_SHORT_BLOCKS its rows hold where they are
    fewer (`short_rows`). Over a dynamic dim, only the largest rows (64-row blocks pay
    where a problem leaves SMs idle, which a size known only at the call may not)."""
    x, y, _ = tile_dims(program.stage(stage))
    if program.size(x) < min(cols for _, cols in FLOAT32_BLOCKS):
        return (FLOAT32_NARROW_BLOCK,)
    if short_rows(program, stage):
        return next((block,) for block in FLOAT32_SHORT_BLOCKS if program.size(y) >= block[0])
    rows = max(rows for rows, _ in FLOAT32_BLOCKS)
    blocks = tuple(block for block in FLOAT32_BLOCKS if block[0] == rows) if program.dynamic else FLOAT32_BLOCKS
    held = tuple(block for block in blocks if y is None or program.size(y) >= block[0] and program.size(x) >= block[1])
    return held or blocks


def short_rows(program: ir.Program, stage: str) -> bool:
    """Whether a contraction stage (not over a dynamic dim) has fewer rows than FLOAT32_BLOCKS' blocks, at least
    the fewest of FLOAT32_SHORT_BLOCKS', and columns that fill one of those: it takes FLOAT32_SHORT_BLOCKS."""
    x, y, _ = tile_dims(program.stage(stage))
    return bool(FLOAT32_SHORT_BLOCKS) and y is not None and not program.dynamic \
        and min(rows for rows, _ in FLOAT32_SHORT_BLOCKS) <= program.size(y) < min(rows for rows, _ in FLOAT32_BLOCKS) \
        and program.size(x) >= min(columns for _, columns in FLOAT32_SHORT_BLOCKS)


def short_half(program: ir.Program, stage: str) -> bool:
    """Whether a contraction that is not small (`small_contraction`) has fewer rows than WGMMA_SHORT_START's block:
    a half-precision one is split into parts (`_half_parts`) before it is padded to those rows (on Hopper, on the
    mma grid too)."""
    rows = program.size(contraction_dims(program, stage)[0])
    return rows < WGMMA_SHORT_START[0][0] and not small_contraction(program, stage)


def small_contraction(program: ir.Program, stage: str) -> bool:
    """Whether a contraction stage does at most SMALL_CONTRACTION_MACS multiply-adds."""
    return math.prod(program.size(d) for d in program.stage(stage).loop_dims) <= SMALL_CONTRACTION_MACS


def narrow_float32(program: ir.Program) -> bool:
    """Whether a program's first stage is a float32 contraction that would take FLOAT32_NARROW_BLOCK."""
    stage = program.stages[0].name
    return contraction_dtype(program, stage) == "float32" and tile_dims(program.stages[0])[1] is not None \
        and float32_blocks(program, stage) == (FLOAT32_NARROW_BLOCK,)


def transposes_ahead(program: ir.Program, stage: str) -> bool:
    """Whether the register-tile template transposes an input with k last ahead: where a block walks at least
    TRANSPOSE_AHEAD_RUN of k, or over a dynamic dim (whose temp keeps the rows in blocks: docs/frontend.md)."""
    return program.size(program.stage(stage).reduce_dims[0]) >= TRANSPOSE_AHEAD_RUN or bool(program.dynamic)


def float32_copy(tree: LoopTree, stage: str, ahead: list[str]) -> str:
    """How the register-tile template copies an input with k last (`ahead`: the inputs it transposes ahead,
    `float32_copies`), in words."""
    if ahead:
        return "transposed ahead"
    if transposes_ahead(tree.program, stage):
        return "copied as stored (each of its tiles read by one block: a transposing kernel would read it twice)"
    return (f"copied as stored (a run of k under {TRANSPOSE_AHEAD_RUN}, the columns' under "
            f"{TRANSPOSE_COLUMNS_AHEAD_RUN}, does not pay for a transposing kernel)")


def read_once(program: ir.Program, stage: str, buffer: str, block: tuple[int, int]) -> bool:
    """Whether each tile of input `buffer` of contraction `stage` is read by one block of `block` (rows,
    columns): it has the rows' dim and the columns fit one block, or the columns' dim and the rows do."""
    x, y, _ = tile_dims(program.stage(stage))
    dims = _layout(program, buffer)
    if y is None:
        return False
    if y in dims and x not in dims:
        return program.size(x) <= block[1]
    return x in dims and y not in dims and program.size(y) <= block[0]


def _inputs_transposed_ahead(tree: LoopTree, st: ir.Stage, inputs: list[str]) -> list[str]:
    """Of `inputs`, those `_float32_tree` transposes ahead: the `transposable` ones where a block walks a long
    run of k (`transposes_ahead`), and the columns' input from TRANSPOSE_COLUMNS_AHEAD_RUN."""
    long_run = transposes_ahead(tree.program, st.name)
    columns_run = tree.program.size(st.reduce_dims[0]) >= TRANSPOSE_COLUMNS_AHEAD_RUN
    return [b for b in inputs if transposable(tree, st.name, b)
            and (long_run or columns_run and not rows_k_last(tree, st.name, b))]


def float32_plan(tree: LoopTree, stage: str, block: tuple[int, int], gpu: GpuTarget | None) -> dict:
    """`float32_tiles` of the register-tile template of contraction `stage` on `block` as it runs on `gpu`: its
    k tile (`float32_k_tile`), the inputs it transposes ahead and those it copies as stored (`float32_copies`:
    "ahead", "stored"), and a thread's rows in STORED_ROWS_GROUPS runs where the input holding them is copied as
    stored with k last, but on FLOAT32_NARROW_BLOCK; the tiles alone where the matrices hold no block tile."""
    tiles = float32_tiles(block, float32_k_tile(tree.program, stage, block, gpu))
    if not holds_block_tile(tree.program, stage, tiles):
        return tiles
    tiles["ahead"], tiles["stored"] = float32_copies(tree, stage, block)
    if block != FLOAT32_NARROW_BLOCK and any(rows_k_last(tree, stage, b) for b in tiles["stored"]):
        tiles["y_groups"] = STORED_ROWS_GROUPS
    return tiles


def _float32_tree(tree: LoopTree, stage: str, block: tuple[int, int], plan: dict,
                  summed_by: str | None = None) -> LoopTree:
    """The register-tile template of contraction `stage` on `block` as `float32_plan`'s `plan` has it."""
    st = tree.program.stage(stage)
    if not holds_block_tile(tree.program, stage, plan):
        raise ValueError(f"the matrices of {st.name} are smaller than one block tile")
    inputs = sorted({ld.buffer for ld in _loads(st)})
    ahead, stored = plan["ahead"], plan["stored"]
    for buffer in ahead:
        tree = transposed_ahead(tree, st.name, buffer, block_rows=block[0])
    shared = tuple(f"{b}.{st.name}" if b in ahead else b for b in inputs)
    as_stored = [f"{b}.{st.name}" for b in ahead] + stored
    tree = register_tiled(tree, st.name, plan["x_threads"], plan["x_groups"], plan["vector"], plan["y_threads"],
                          plan["y_tile"], plan["k_tile"], True, shared, tuple(as_stored), y_groups=plan["y_groups"],
                          summed_by=summed_by)
    return tree.pipeline(f"{st.reduce_dims[0]}.0", plan["stages"], stage=accumulator(stage, summed_by))


def holds_block_tile(program: ir.Program, stage: str, tiles: dict) -> bool:
    """Whether the matrices of contraction `stage` hold one block tile of `tiles` (`float32_tiles`) and k one
    k tile."""
    st = program.stage(stage)
    x, y, _ = tile_dims(st)
    return y is not None and program.size(x) >= tiles["x_threads"] * tiles["x_groups"] * tiles["vector"] \
        and program.size(y) >= tiles["y_threads"] * tiles["y_tile"] \
        and program.size(st.reduce_dims[0]) >= tiles["k_tile"]


def accumulator(stage: str, summed_by: str | None = None) -> str:
    """The stage holding `register_tiled`'s register tile of `stage`: its `cache_write` (`<stage>.acc`), or
    `stage` itself where a stage sums it (`summed_by`: split-k's parts)."""
    return stage if summed_by else f"{stage}.acc"


def float32_copies(tree: LoopTree, stage: str, block: tuple[int, int]) -> tuple[list[str], list[str]]:
    """(inputs transposed ahead by a kernel of their own, inputs whose k tiles are copied into shared memory as
    stored) of the register-tile template of `stage` on `block` (`transposes_ahead`, `_inputs_transposed_ahead`;
    never an input each of whose tiles one block reads, `read_once`: the transposing kernel would read it once
    more and write it, H100, session 28: 8192x8192x32 0.35 ms against torch's 0.16): the rest are copied
    transposed, a word at a time."""
    st = tree.program.stage(stage)
    inputs = sorted({ld.buffer for ld in _loads(st)})
    long_run = transposes_ahead(tree.program, stage)
    once = [b for b in inputs if read_once(tree.program, stage, b, block)]
    ahead = [b for b in _inputs_transposed_ahead(tree, st, inputs) if b not in once]
    stored = [b for b in inputs if b not in ahead and (dynamic_rows_k_last(tree, stage, b)
                                                      or (not long_run or b in once) and rows_k_last(tree, stage, b))]
    return ahead, stored


def float32_block(program: ir.Program, stage: str, sms: int | None) -> tuple[int, int]:
    """The register-tile block of `float32_blocks` a float32 contraction `stage` (split-k's parts included:
    their dim counts in the blocks) takes on a GPU of `sms` SMs: the least `float32_cost`, the larger on a
    tie. Without an SM count, the first."""
    if sms is None or tile_dims(program.stage(stage))[1] is None:
        return float32_blocks(program, stage)[0]
    costs = _float32_costs(program, stage, sms)
    return min(costs, key=lambda block: (costs[block], -block[0] * block[1]))


def atomic_parts_total(program: ir.Program, stage: str) -> str | None:
    """The stage whose float32 result sums split-k's parts `stage` ([parts, m, n], `ir.split_k`) where the parts
    may add their tiles into it atomically (SPLIT_K_ATOMIC): it is the program's result, a plain sum of
    `stage` over its parts, two dims (no epilogue, no batch); else None."""
    parts, total = program.stage(stage), program.output
    if not SPLIT_K_ATOMIC or contraction_dtype(program, stage) != "float32" or total is parts \
            or total.reduce_op != "sum" or total.reduce_dims != parts.dims[:1] or len(total.dims) != 2 \
            or total.expr != ir.Load(stage, ir.Affine.identity(parts.dims), parts.dtype):
        return None
    return total.name


def float32_parts_tree(tree: LoopTree, stage: str, total: str, block: tuple[int, int], plan: dict) -> LoopTree:
    """Split-k's parts (`stage`, a float32 contraction over [parts, m, n]) on register tiles (`float32_plan`
    `plan`) whose blocks add their results into `total` (the sum of the parts) atomically, the parts on block.z:
    `total` is zeroed by a kernel of its own first, and no partial result is stored (`register_tiled`'s
    `summed_by`)."""
    return _float32_tree(tree, stage, block, plan, summed_by=total)


def _loads(stage):
    return list(ir.loads(stage.expr))


def _extent(tree: LoopTree, stage: str, loop: str) -> int:
    return next(lp.extent for lp in tree.schedule.of(stage).loops if lp.name == loop)


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
                   as_stored: tuple[str, ...] = (), *, y_groups: int = 1, summed_by: str | None = None) -> LoopTree:
    """Blocks and threads over a stage's last two pure dims (x: contiguous, y): each thread computes
    y_tile x (x_groups * vector) outputs, its x outputs `vector`-wide and x_threads * vector apart,
    its y outputs in `y_groups` runs of consecutive rows, y_threads runs apart (so a tile of an
    input laid out along y is read, and copied, in whole vectors by neighbouring threads); the
    innermost of the other dims (a batch) on block.z.
    A reduction runs in registers over k tiles of `k_tile`; inputs in `shared` are staged in shared
    memory per k tile, those also in `as_stored` in their own layout (see `_stage_in_shared`).
    With `summed_by` (a stage summing `stage` over its first dim: split-k's parts), that stage takes the
    blocks, threads and registers, its sum's loop on block.z (each block adding its tile into the result:
    `across_blocks`), and `stage` is placed in it as the register tile (no `cache_write`)."""
    st = tree.program.stage(stage)
    tiled = summed_by or stage          # the stage whose loops take the blocks, threads and registers
    x, y, others = tile_dims(tree.program.stage(tiled))
    parts = list(tree.program.stage(summed_by).reduce_dims) if summed_by else []
    span = x_threads * vector
    tree = tree.split(x, span * x_groups, stage=tiled).split(f"{x}.1", span, stage=tiled)
    threads = [f"{x}.1.1"]
    registers = [f"{x}.1.0"]
    if vector > 1:
        tree = tree.split(f"{x}.1.1", vector, stage=tiled)
        threads, registers = [f"{x}.1.1.0"], registers + [f"{x}.1.1.1"]
    blocks = [f"{x}.0"]
    if y is not None and y_groups > 1:
        run = y_tile // y_groups
        tree = tree.split(y, y_threads * y_tile, stage=tiled).split(f"{y}.1", y_threads * run, stage=tiled) \
            .split(f"{y}.1.1", run, stage=tiled)
        blocks, threads = [f"{y}.0"] + blocks, [f"{y}.1.1.0"] + threads
        registers = [f"{y}.1.0", f"{y}.1.1.1"] + registers
    elif y is not None:
        tree = tree.split(y, y_threads * y_tile, stage=tiled).split(f"{y}.1", y_tile, stage=tiled)
        blocks, threads, registers = [f"{y}.0"] + blocks, [f"{y}.1.0"] + threads, [f"{y}.1.1"] + registers
    tree = tree.reorder(*parts, *others, *blocks, *threads, *registers, stage=tiled)
    batch = parts or [d for d in others[-1:] if tree.program.size(d) <= GRID_LIMITS["block.z"]]
    tree = _bind_tile(tree, tiled, batch + blocks, threads, registers, vector)
    if not st.reduce_dims:
        return tree
    depth = len(parts) + len(others) + len(blocks)
    k_runs = unroll_k and len(st.reduce_dims) == 1 and STORED_K_RUN > 1 and k_tile % STORED_K_RUN == 0 \
        and whole_vectors(tree.program.size(st.reduce_dims[0]), STORED_K_RUN) \
        and any(rows_k_last(tree, stage, b) for b in as_stored if b in tree.buffers)
    acc = accumulator(stage, summed_by)
    tree = tree.place(acc, summed_by, depth) if summed_by else tree.cache_write(stage).place(acc, stage, depth)
    reduce_outer, reduce_inner = [], []
    for dim in st.reduce_dims:
        tree = tree.split(dim, k_tile, stage=acc)
        reduce_outer.append(f"{dim}.0")
        reduce_inner.append(f"{dim}.1")
    inner = [*reduce_inner, *registers]
    if k_runs:
        tree, reduce_inner, inner = _k_runs_by_row(tree, acc, reduce_inner[0], registers, y)
    tree = tree.reorder(*reduce_outer, *threads, *inner, stage=acc)
    tree = _bind_tile(tree, acc, [], threads, registers, vector, every=True)
    if unroll_k:
        for loop in reduce_inner:
            tree = tree.unroll(loop, stage=acc)
    for buffer in shared:
        tree = _stage_in_shared(tree, acc, buffer, depth + len(reduce_outer), buffer in as_stored)
    return tree


def _k_runs_by_row(tree: LoopTree, acc: str, k_inner: str, registers: list[str], y: str):
    """Split a k tile's steps into runs of STORED_K_RUN taken row by row: (tree, k loops, register loops) in
    the order `k runs, row registers, k steps of a run, column registers`, so a row of an input stored k last
    is read as one vector of a run's k steps (a word a step otherwise; each output still sums its k in order)."""
    tree = tree.split(k_inner, STORED_K_RUN, stage=acc)
    rows = [r for r in registers if r.startswith(f"{y}.")]
    columns = [r for r in registers if r not in rows]
    return tree, [f"{k_inner}.0", f"{k_inner}.1"], [f"{k_inner}.0", *rows, f"{k_inner}.1", *columns]


def transposed_ahead(tree: LoopTree, stage: str, buffer: str, tile: int = 32, block_rows: int | None = None) -> LoopTree:
    """Copy the 2-D input `buffer` that `stage` reads (or a batch of them: one leading dim more, on
    block.z) into a temp laid out reduction dim first, by a kernel of its own that runs before the
    stage's: `tile` x `tile` blocks, each thread loading a 16-byte vector along the input's contiguous
    dim and each warp storing whole rows of the temp.
    The stage then reads the temp (`<buffer>.<stage>`), whose k tiles are copied into shared memory
    as stored, 16 bytes at a time (so cp.async can pipeline them), and read as vectors along the
    tile's rows: the transpose a shared copy would do element by element, done once.
    Given `block_rows` (the stage's block tile's rows), rows of a dynamic dim, or (in a 2-D input) a count of
    them that is not a whole number of 16-byte vectors, are kept in blocks of it (`LoopTree.block`), so the temp's
    strides stay fixed and its tiles aligned: (ceil(B / block_rows), k, block_rows); a dynamic dim needs it."""
    dims = _layout(tree.program, buffer)
    width = 16 // ITEM_BYTES[tree.buffers[buffer].dtype]
    dynamic = len(dims) >= 2 and isinstance(tree.program.size(dims[-2]), ir.Size)
    if not transposable(tree, stage, buffer) or (dynamic and not block_rows):
        raise ValueError(f"transposed_ahead: {buffer} (dims {dims}) is not a 2-D input "
                         f"(or a batch of them) with the reduction dim of {stage} "
                         f"({tree.program.stage(stage).reduce_dims}) last, or its dynamic rows have no block_rows")
    blocked = bool(block_rows) and len(dims) == 2 and not whole_vectors(tree.program.size(dims[-2]), width)
    *batch, rows, k = dims
    copy = f"{buffer}.{stage}"
    tree = tree.cache(buffer, stage=stage, order=(*batch, k, rows)).place(copy, None, 0)
    if blocked:
        tree = tree.block(rows, block_rows, stage=copy).split(rows, block_rows, stage=copy) \
            .split(f"{rows}.1", tile, stage=copy)
        outer, inner = [f"{rows}.0", f"{rows}.1.0"], f"{rows}.1.1"
    else:
        tree = tree.split(rows, tile, stage=copy)
        outer, inner = [f"{rows}.0"], f"{rows}.1"
    tree = tree.split(k, tile, stage=copy).split(f"{k}.1", width, stage=copy)
    tree = tree.reorder(*batch, f"{k}.0", *outer, f"{k}.1.0", inner, f"{k}.1.1", stage=copy)
    axes = zip(outer, ("block.x", "block.z"))
    for loop, axis in ((f"{k}.0", "block.y"), *axes, (f"{k}.1.0", "thread.y"),
                       (inner, "thread.x"), *((dim, "block.z") for dim in batch)):
        tree = tree.bind(loop, axis, stage=copy)
    return tree.vectorize(f"{k}.1.1", stage=copy)


def whole_rows(program: ir.Program, stage: str) -> bool:
    """Whether each dim of contraction `stage` (m, n, k) holds whole 16-byte vectors (`whole_vectors`): where one
    does not, its register tiles run on operands padded with zeros (`gpu_rules.padded_float32`)."""
    width = VECTOR_BYTES // ITEM_BYTES[contraction_dtype(program, stage)]
    return all(whole_vectors(program.size(d), width) for d in contraction_dims(program, stage))


def whole_vectors(size, width: int) -> bool:
    """Whether rows of `size` elements (an int, or an `ir.Size` known at run time) are a whole number of
    `width`-wide vectors, so that every row starts 16-byte aligned."""
    return not isinstance(size, ir.Size) and size % width == 0


def transposable(tree: LoopTree, stage: str, buffer: str) -> bool:
    """Whether `transposed_ahead` applies: an input whose last dim is the stage's reduction dim and whose
    one before (its rows) is a dim of the stage's tiles (not a batch's), 2-D or with one leading pure dim (a
    batch, within the grid's z limit); rows of a dynamic dim only in a 2-D input (the copy keeps them in blocks)."""
    dims = _layout(tree.program, buffer)
    st = tree.program.stage(stage)
    batch_fits = len(dims) == 2 or (len(dims) == 3 and dims[0] not in st.reduce_dims
                                    and tree.program.size(dims[0]) <= GRID_LIMITS["block.z"])
    dynamic_rows = isinstance(tree.program.size(dims[-2]), ir.Size)
    return batch_fits and dims[-2] in tile_dims(st)[:2] and dims[-1] in st.reduce_dims \
        and not (dynamic_rows and len(dims) != 2)


def dynamic_rows_k_last(tree: LoopTree, stage: str, buffer: str) -> bool:
    """Whether `buffer` is an input laid out (..., k) that holds the rows of the stage's tiles (`rows_k_last`),
    a dynamic dim, so not transposed ahead: its k tiles are copied into shared memory as stored (16 bytes at a
    time, pipelined by cp.async) and the register tile reads them along k, not transposed word by word on the way."""
    return rows_k_last(tree, stage, buffer) and isinstance(tree.program.size(tile_dims(tree.program.stage(stage))[1]),
                                                           ir.Size)


def rows_k_last(tree: LoopTree, stage: str, buffer: str) -> bool:
    """Whether `buffer` is an input laid out (..., k) that holds the rows of the stage's tiles (before k, or
    first with a split's parts between)."""
    dims = _layout(tree.program, buffer)
    st = tree.program.stage(stage)
    return len(dims) >= 2 and dims[-1] in st.reduce_dims and tile_dims(st)[1] in dims


def tile_dims(stage) -> tuple[str, str | None, list[str]]:
    """(x: the contiguous output dim, y: the pure dim before it or None, the other pure dims); a
    ValueError for a stage whose result is a single value."""
    if not stage.dims:
        raise ValueError(f"stage {stage.name} computes a single value: it has no output dims to tile")
    pure = [d for d in stage.loop_dims if d not in stage.reduce_dims]
    x = stage.dims[-1]
    y = next((d for d in reversed(pure) if d != x), None)
    return x, y, [d for d in pure if d not in (x, y)]


def _bind_tile(tree, stage, blocks, threads, registers, vector, every=False):
    for loop, axis in zip(reversed(blocks), ("block.x", "block.y", "block.z")):
        tree = tree.bind(loop, axis, stage=stage)
    for loop, axis in zip(reversed(threads), ("thread.x", "thread.y")):
        tree = tree.bind(loop, axis, stage=stage)
    for loop in registers:
        if loop == registers[-1] and vector > 1:
            tree = tree.vectorize(loop, stage=stage)
        elif _extent(tree, stage, loop) > 1 or every:    # `every`: a loop of one too (left a loop, it cuts
            tree = tree.unroll(loop, stage=stage)          # an unrolled k step into tiny loops LLVM is slow on)
    return tree


def _layout(program, buffer: str) -> tuple[str, ...]:
    """The dims of an input, or of a stage's buffer, in the order it is laid out."""
    return next((b.dims for b in program.inputs if b.name == buffer), None) or program.stage(buffer).dims


def _stage_in_shared(tree: LoopTree, acc: str, buffer: str, depth: int, as_stored: bool = False) -> LoopTree:
    """Copy the tile of `buffer` one k step uses into shared memory, read 128 bits at a time along the
    source's contiguous dim, with the copy's largest loops bound to threads (where none fills the
    block's y threads, the widest is split to fill them: a 32-row k tile copied by all 16 rows of
    threads, not by the 2 a 2-wide loop would give; where none fits its x threads, a loop along the
    rows is split for them, or they would all write the same elements). The tile is laid out
    reduction dims first (the register tile reads consecutive words along its pure dim; for A of a
    matmul a transpose, stored word by word), or `as_stored` in the source's own layout (written
    in whole 16-byte vectors, which cp.async can pipeline; the register tile then reads a row's k steps in
    runs of STORED_K_RUN, one 16-byte load each: `_k_runs_by_row`)."""
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
    block = _block_size(tree, acc)
    along_rows = sorted((lp for lp in loops if lp.name != vector), key=lambda lp: (lp.dim != order[-1], lp.stride))
    bound = {}                                          # loop name -> thread axis
    x = _fitting(along_rows, block[0], bound)
    if x is not None:
        bound[x.name] = "thread.x"
    else:                                            # every lane gets a share (8 lanes, rows of 32: none would)
        wide = next((lp for lp in along_rows if lp.extent > block[0] > 1 and lp.extent % block[0] == 0), None)
        if wide is not None:
            tree = tree.split(wide.name, block[0], stage=copy)
            bound[f"{wide.name}.1"] = "thread.x"
    widest = sorted((lp for lp in tree.schedule.of(copy).loops if lp.name != vector), key=lambda lp: -lp.extent)
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
                k_tile: int = 64, stages: int = 0, copier: str = "cp.async", persistent: int = 0) -> LoopTree:
    """A contraction on Hopper's tensor cores (wgmma): as `mma_tiled`, but the block's tile is split
    between groups[0] x groups[1] warpgroups (4 warps each, on thread.y), each computing its tile as 64 x N wgmma
    tiles (N its columns, at most 256) straight from the shared-memory tiles (k_tile * 2 bytes must be
    128 where A's k is contiguous); a pipeline's tiles are copied by `copier` ('cp.async' or 'tma'), by a
    grid of `persistent` blocks running the tiles in turn where that is not 0 (TMA only)."""
    columns = block[1] // groups[1]
    fitting = [name for name, shape in TENSOR_INSTRUCTIONS.items()
               if shape["warps"] > 1 and columns % shape["n"] == 0]
    if not fitting:
        raise ValueError(f"a warpgroup's {columns} columns are not a multiple of 8 (wgmma tiles are 64 x N, N a "
                         f"multiple of 8 up to 256)")
    return _tensor_tiled(tree, stage, block, groups, k_tile, stages,
                         max(fitting, key=lambda name: TENSOR_INSTRUCTIONS[name]["n"]), copier, persistent)


def _tensor_tiled(tree: LoopTree, stage: str, block: tuple[int, int], teams: tuple[int, int], k_tile: int,
                  stages: int, instruction: str, copier: str, persistent: int = 0) -> LoopTree:
    """The schedule `mma_tiled` and `wgmma_tiled` describe: `teams` warps (or warpgroups) over the
    block's tile, each computing its part as unrolled tiles of `instruction`."""
    shape = TENSOR_INSTRUCTIONS[instruction]
    st = tree.program.stage(stage)
    m, n = [d for d in st.loop_dims if d not in st.reduce_dims][-2:]
    k, = st.reduce_dims
    batch = [d for d in st.loop_dims if d not in st.reduce_dims and d not in (m, n)]
    if len(batch) > 1:
        raise ValueError(f"mma_tiled binds one batch dim to block.z; stage {stage} has {batch}")
    acc = accumulator(stage)
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
    return tree.pipeline(f"{k}.0", stages, stage=acc, copier=copier, persistent=persistent) if stages >= 2 else tree


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
