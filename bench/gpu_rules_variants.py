"""The GPU scheduler's rules against variants of their constants, checked and timed next to torch in
one process: `python -m bench.gpu_rules_variants [--knob NAME]` on the GPU machine.

Knobs (`KNOBS`): `row_elements`, `gpu_rules.ROW_ELEMENTS_PER_THREAD` (the elements a thread takes per
pass along a row, which sets the threads a row gets) on softmax, row and column sums and dot products
at a large and an odd size; `float32_blocks`, the register-tile template's block tile (rows, columns:
`autoschedule.gpu.FLOAT32_BLOCKS` held to one) on float32 matmuls; `thread_tile_rows`,
`gpu_rules.THREAD_TILE_ROWS` (outputs along a second dim a thread walking a reduction takes) on 3x3
convolutions; `row_walk_unroll`, `gpu_rules.ROW_WALK_UNROLL` on attention heads; `walk_bytes_per_sm`, `gpu_rules.WALK_BYTES_PER_SM` (the most an
attention head's weighted sum walked in its softmax's rows reads besides them, an SM; above it, two kernels) on the same; `strided_unroll`,
`gpu_rules.STRIDED_UNROLL` on softmax, layer norm and attention; `share_row_values`, `gpu_rules.SHARE_ROW_VALUES` (a row group's exp computed once) on
the same; `row_share`, both of those at once (elements a thread
takes per pass, and unrolled) on the same; `scalar_run`, `gpu_rules.SCALAR_RUN`
on pointwise chains whose rows hold no whole vectors; `wgmma_blocks`, `autoschedule.gpu.WGMMA_BLOCKS` (the
wgmma template's block tiles) on bfloat16 matmuls, batched with k = 64, square, and odd; `wgmma_edges`,
`autoschedule.gpu.WGMMA_EDGE_TILES` (odd sizes as one wgmma kernel with guarded edge tiles, or padded) on the same;
`wgmma_stages`, the wgmma template's block tiles and pipeline stages together, on the same;
`turn_l2_share`, `gpu_rules.TURN_L2_SHARE` (the share of the L2 cache the rows a grid of blocks taking rows in turn
holds at once may take) and `in_turn_unroll`, `gpu_rules.IN_TURN_UNROLL` (such a block's walks unrolled this many
times; session 33 measured it as LONG_ROW_UNROLL, which only those rows read there) on long rows; `row_shared_share`, `gpu_rules.ROW_SHARED_SHARE` (the share of a block's shared memory a row kept there
may take) on the row cases; `long_row`, `gpu_rules.LONG_ROW` (rows shorter than it are summed a thread a row, not a block a row) on the
row cases; `warp_rows_below`, `gpu_rules.WARP_ROWS_BELOW` (softmax-like rows shorter than it a warp a row, several
a block; 0: a block of one warp) and `predicated_tails`, `codegen.gpu.PREDICATED_TAILS` (a thread's short walk with a
tail runs every copy predicated), on softmax and layer norm over rows of 33 to 1024; `half_warp_rows_below`, `gpu_rules.HALF_WARP_ROWS_BELOW` (rows shorter than it half a warp a row, two rows a
warp; 0: never), on the same; `warp_row_sums`,
`gpu_rules.WARP_ROWS_BELOW` again (0: plain sums over rows of 32 to 511 a thread a row, or a block of one warp a row
from 128) and `final_warps_an_sm`, `gpu_rules.FINAL_WARPS_AN_SM` (a split reduction's final
sum a block an output where a thread an output leaves fewer warps an SM), on row and column sums; `llvm_levels`, LLVM's
pipeline level and the NVPTX back end's (`codegen.gpu.LLVM_SPEED_LEVEL`, `LLVM_CODEGEN_OPT`; with LOOPTOOL_CACHE_DIR=)
on the workloads of several kernels; `row_vectors`,
`gpu_rules.ROW_VECTORS` (a thread's short row moved in vectors) and
`staged_rows`, `gpu_rules.STAGED_ROWS` (rows a block where a short row with no whole vectors goes through shared
memory; 0: not), on softmax and layer norm over rows of 10 to 127; `programmatic_launch`,
`codegen.gpu.PROGRAMMATIC_ARCHS` (the archs whose kernels after a module's first are launched programmatically;
with LOOPTOOL_CACHE_DIR=), on workloads of several kernels; `split_k_blocks`, `autoschedule.gpu.SPLIT_K_BLOCKS` (0: no split-k) on float32 matmuls; `split_k_run`,
`autoschedule.gpu.SPLIT_K_RUN` (the shortest run of k a part sums) on the same; `half_split_k`, the shortest
run of k a half-precision part sums (`autoschedule.gpu.HALF_SPLIT_K_RUN`; 0: no split-k) on bfloat16 matmuls;
`half_split_k_busy`, `autoschedule.gpu.HALF_SPLIT_K_BUSY` (half precision is split only where its unsplit
blocks keep less than this share of the SMs busy; 0: never, 1.01: wherever they leave more than
SPLIT_K_IDLE of them idle, as before session 20) on bfloat16 products from 24 to 97 % busy;
`vector_store_bytes`, `codegen.gpu.VECTOR_STORE_BYTES` (a code generator's constant: run it with
LOOPTOOL_CACHE_DIR= so no cached PTX is read) on batched bf16 products, float32 and bfloat16 results;
`persistent_waves`, `autoschedule.gpu.PERSISTENT_WAVES` (the waves of blocks from which a wgmma product's
kernel is persistent; 2**30: never) and `tile_group_rows`, `codegen.gpu_copies.TILE_GROUP_ROWS` (a persistent
kernel's tiles in groups of this many block rows; with LOOPTOOL_CACHE_DIR=), on bfloat16 products of many tiles;
`producer_warp`, `codegen.gpu_copies.PRODUCER_WARP` (a persistent product's producer warpgroup; with
LOOPTOOL_CACHE_DIR=) on the same; `split_k_atomic`, `autoschedule.gpu.SPLIT_K_ATOMIC` (split-k's float32 parts added into
the result atomically, or by a second kernel) on float32 matmuls; `stored_k_run`, `autoschedule.gpu.STORED_K_RUN`
(k steps a register tile reads at once from a row stored k last; 1: a word a step) on float32 products whose
inputs are copied as stored; `float32_short_blocks`, `autoschedule.gpu.FLOAT32_SHORT_BLOCKS` (the register tiles'
blocks of products of fewer rows than FLOAT32_BLOCKS hold; (): none, the reduction rules take them) on products of
1 to 63 rows; `wgmma_short`, `autoschedule.gpu.WGMMA_SHORT_START`'s rows (the wgmma template of products of at most
64 rows, and their split into parts; 0: never; session 34 also measured runs of 256 and two blocks an SM for
their parts) on bfloat16 products of 1 to 64 rows; `half_split_off_grid`, `autoschedule.gpu.HALF_SPLIT_OFF_GRID` (half-precision
products off the mma grid split along k on Hopper) on bfloat16 products whose blocks keep few SMs busy; `float32_k_tiles`, `autoschedule.gpu.FLOAT32_K_TILES` (the k tiles a float32 register
tile may take, longest first: `float32_k_tile`), and `stored_rows_groups`, `autoschedule.gpu.STORED_ROWS_GROUPS` (the
runs a thread's rows come in where A is copied as stored), on the same products; `one_k_tile`,
`autoschedule.gpu.WGMMA_ONE_K_TILE` (the wgmma template where k is one k tile: block, teams, stages, copier)
with `PERSISTENT_STORE_SHARE`, on batched bfloat16 products against torch with the same result dtype (session 29's `one_k_tile_stages` runs were its first two values). For each
workload and value, the automatic schedule's kernels run on a NaN-poisoned output, are compared with
torch in float64, and are timed interleaved with torch (median of CUDA-event timed calls, best of 3
rounds). Prints one line per variant: kernels' time, torch / kernels.
"""
from __future__ import annotations

import argparse
import json

import numpy as np

import looptool as lt
from looptool.autoschedule import gpu as templates
from looptool.autoschedule import gpu_rules
from looptool.codegen import gpu as codegen_gpu
from looptool.codegen import gpu_copies
from looptool.runtime import gpu as runtime_gpu
from bench.gpu_suite import interleaved_ms

KNOBS = {
    "scalar_run": (lambda v: setattr(gpu_rules, "SCALAR_RUN", v), (4, 8, 16), "pointwise_cases"),
    "strided_unroll": (lambda v: setattr(gpu_rules, "STRIDED_UNROLL", v), (0, 8), "strided_cases"),
    "share_row_values": (lambda v: setattr(gpu_rules, "SHARE_ROW_VALUES", v), (False, True), "strided_cases"),
    "row_share": (lambda v: (setattr(gpu_rules, "ROW_ELEMENTS_PER_THREAD", v[0]), setattr(gpu_rules, "STRIDED_UNROLL", v[1])),
                  ((8, 8), (16, 16), (12, 16), (32, 32)), "strided_cases"),
    "row_walk_unroll": (lambda v: setattr(gpu_rules, "ROW_WALK_UNROLL", v), (4, 8, 16, 32), "attention_cases"),
    "walk_bytes_per_sm": (lambda v: setattr(gpu_rules, "WALK_BYTES_PER_SM", v), (1 << 40, 16 << 20, 8 << 20, 0), "attention_cases"),
    "thread_tile_rows": (lambda v: setattr(gpu_rules, "THREAD_TILE_ROWS", v), (1, 2, 4, 7, 8), "conv_cases"),
    "rows_in_turn": (lambda v: setattr(gpu_rules, "ROWS_IN_TURN", v), (False, True), "row_cases"),
    "turn_l2_share": (lambda v: setattr(gpu_rules, "TURN_L2_SHARE", v), (0.5, 0.7, 0.9), "long_row_cases"),
    "long_row_unroll": (lambda v: setattr(gpu_rules, "LONG_ROW_UNROLL", v), (1, 2, 4, 8), "row_cases"),
    "in_turn_unroll": (lambda v: setattr(gpu_rules, "IN_TURN_UNROLL", v), (8, 16, 32), "long_row_cases"),
    "row_elements": (lambda v: setattr(gpu_rules, "ROW_ELEMENTS_PER_THREAD", v), (8, 16, 32), "row_cases"),
    "long_row": (lambda v: setattr(gpu_rules, "LONG_ROW", v), (32, 128, 512), "row_cases"),
    "warp_rows_below": (lambda v: setattr(gpu_rules, "WARP_ROWS_BELOW", v), (128, 257, 513), "warp_row_cases"),
    "half_warp_rows_below": (lambda v: setattr(gpu_rules, "HALF_WARP_ROWS_BELOW", v), (0, 65), "warp_row_cases"),
    "warp_row_sums": (lambda v: setattr(gpu_rules, "WARP_ROWS_BELOW", v), (0, 512), "reduction_cases"),
    "final_warps_an_sm": (lambda v: setattr(gpu_rules, "FINAL_WARPS_AN_SM", v), (0, 1, 4), "reduction_cases"),
    "predicated_tails": (lambda v: setattr(codegen_gpu, "PREDICATED_TAILS", v), (False, True), "warp_row_cases"),
    "llvm_levels": (lambda v: (setattr(codegen_gpu, "LLVM_SPEED_LEVEL", v[0]),
                               setattr(codegen_gpu, "LLVM_CODEGEN_OPT", v[1])), ((3, 3), (2, 2)), "multi_kernel_cases"),
    "row_vectors": (lambda v: setattr(gpu_rules, "ROW_VECTORS", v), (False, True), "short_row_cases"),
    "staged_rows": (lambda v: setattr(gpu_rules, "STAGED_ROWS", v), (0, 128, 256), "short_row_cases"),
    "programmatic_launch": (lambda v: setattr(codegen_gpu, "PROGRAMMATIC_ARCHS", v), ((), ("sm_90", "sm_90a")),
                            "multi_kernel_cases"),
    "row_shared_share": (lambda v: setattr(gpu_rules, "ROW_SHARED_SHARE", v), (0.25, 0.5, 0.95), "row_cases"),
    "float32_blocks": (lambda v: setattr(templates, "FLOAT32_BLOCKS", (v,)), ((128, 128), (64, 128), (128, 64), (64, 64)),
                       "matmul_cases"),
    "wgmma_blocks": (lambda v: setattr(templates, "WGMMA_BLOCKS", v), (((128, 256), (128, 128), (128, 64)),
                                                                          ((128, 256), (128, 128)), ((128, 128),),
                                                                          ((128, 256),)), "wgmma_cases"),
    "wgmma_edges": (lambda v: setattr(templates, "WGMMA_EDGE_TILES", v), (False, True), "wgmma_cases"),
    "float32_block_sets": (lambda v: setattr(templates, "FLOAT32_BLOCKS", v),
                           (((128, 128), (128, 64)), ((128, 128), (128, 64), (64, 64)),
                            ((128, 128), (128, 64), (64, 128), (64, 64))),
                           "small_matmul_cases"),
    "float32_short_blocks": (lambda v: setattr(templates, "FLOAT32_SHORT_BLOCKS", v), ((), ((32, 128), (16, 128), (8, 128))),
                             "skinny_cases"),
    "wgmma_short": (lambda v: setattr(templates, "WGMMA_SHORT_START", ((v, 128), (1, 1), 64, 4, "tma")), (0, 64),
                    "short_half_cases"),
    "half_split_off_grid": (lambda v: setattr(templates, "HALF_SPLIT_OFF_GRID", v), (False, True), "off_grid_half_cases"),
    "split_k_blocks": (lambda v: setattr(templates, "SPLIT_K_BLOCKS", v), (0, 2, 3, 4), "matmul_cases"),
    "split_k_run": (lambda v: setattr(templates, "SPLIT_K_RUN", v), (64, 128, 256, 512), "matmul_cases"),
    "half_split_k": (lambda v: (setattr(templates, "HALF_SPLIT_K_BLOCKS", int(v > 0)),
                                setattr(templates, "HALF_SPLIT_K_RUN", v or 1)), (0, 512, 1024), "wgmma_cases"),
    "half_split_k_busy": (lambda v: setattr(templates, "HALF_SPLIT_K_BUSY", v), (0.0, 0.5, 1.01), "split_cases"),
    "vector_store_bytes": (lambda v: setattr(codegen_gpu, "VECTOR_STORE_BYTES", v), (16, 8, 4, 16), "write_back_cases"),
    "persistent_waves": (lambda v: setattr(templates, "PERSISTENT_WAVES", v), (1 << 30, 2, 1), "persistent_cases"),
    "tile_group_rows": (lambda v: setattr(gpu_copies, "TILE_GROUP_ROWS", v), (1, 4, 8, 16), "persistent_cases"),
    "producer_warp": (lambda v: setattr(gpu_copies, "PRODUCER_WARP", v), (False, True), "persistent_cases"),
    "split_k_atomic": (lambda v: setattr(templates, "SPLIT_K_ATOMIC", v), (False, True), "matmul_cases"),
    "one_k_tile": (lambda v: _one_k_tile(*v), (((64, 128), (1, 1), 2, "cp.async", 0.5), ((64, 128), (1, 1), 1, "cp.async", 0.5),
                                                ((64, 128), (1, 1), 2, "tma", 0.5),
                                                ((64, 128), (1, 1), 2, "tma", 4.0), ((64, 128), (1, 1), 3, "tma", 4.0),
                                                ((128, 128), (2, 1), 2, "tma", 4.0), ((128, 128), (2, 1), 3, "tma", 4.0),
                                                ((128, 256), (2, 1), 2, "tma", 4.0)), "batched_cases"),
    "stored_k_run": (lambda v: setattr(templates, "STORED_K_RUN", v), (1, 4), "stored_cases"),
    "float32_k_tiles": (lambda v: setattr(templates, "FLOAT32_K_TILES", v), ((32,), (64, 32)), "stored_cases"),
    "stored_rows_groups": (lambda v: setattr(templates, "STORED_ROWS_GROUPS", v), (2, 1), "stored_cases"),
    "wgmma_stages": (lambda v: _wgmma_start(*v), ((((128, 256), (128, 128), (128, 64)), 3), (((128, 128),), 1),
                                                 (((128, 128),), 2), (((128, 64),), 1), (((128, 64),), 2),
                                                 (((128, 256),), 1)), "wgmma_cases"),
}


def _wgmma_start(blocks, stages):
    """The wgmma template's block tiles held to `blocks`, its pipeline to `stages`."""
    templates.WGMMA_BLOCKS = blocks
    block, teams, k_tile, _, copier = templates.TENSOR_START["wgmma"]
    templates.TENSOR_START["wgmma"] = (block, teams, k_tile, stages, copier)


def _one_k_tile(block, teams, stages, copier, store_share):
    """`autoschedule.gpu.WGMMA_ONE_K_TILE` as (block, teams, 64, stages, copier), and PERSISTENT_STORE_SHARE."""
    templates.WGMMA_ONE_K_TILE = (block, teams, 64, stages, copier)
    templates.PERSISTENT_STORE_SHARE = store_share


def attention_cases(torch):
    gen = torch.Generator(device="cuda").manual_seed(1)
    out = []
    for length, width in ((1024, 64), (1000, 64), (4096, 64), (2048, 128)):
        q, k, v = (torch.randn(length, width, device="cuda", generator=gen) for _ in range(3))
        si, sj, sd = lt.symbols("i j d")
        scale = width ** -0.5
        scores = (lt.Tensor(q).to(si, sd) * lt.Tensor(k).to(sj, sd)).sum(sd) * scale
        e = (scores - scores.max(sj)).exp()
        head = (e / e.sum(sj) * lt.Tensor(v).to(sj, sd)).sum(sj)

        def eager(q=q, k=k, v=v, scale=scale):
            return torch.softmax(q @ k.T * scale, dim=1) @ v
        out.append((f"attention {length}x{width}", head, eager,
                    lambda eager=eager, q=q, k=k, v=v: eager(q.double(), k.double(), v.double())))
    return out


def pointwise_cases(torch):
    out = []
    for rows, cols in ((1000, 3001), (8192, 8191)):
        x = torch.randn(rows, cols, device="cuda")
        xt = lt.Tensor(x).to(*lt.symbols("m n"))
        inner = (xt + xt * xt * xt * 0.044715) * 0.7978845608028654
        y = xt * 0.5 * (2.0 - 2.0 / ((inner * 2.0).minimum(40.0).exp() + 1.0))
        gelu = torch.nn.functional.gelu
        out.append((f"gelu(tanh) {rows}x{cols}", y, lambda x=x: gelu(x, approximate="tanh"),
                    lambda x=x: gelu(x.double(), approximate="tanh")))
    return out


def strided_cases(torch):
    return [case for case in row_cases(torch) if case[0].startswith("softmax")] + attention_cases(torch)[:2] \
        + [layer_norm(torch, *shape) for shape in ((8192, 8192), (1000, 3001))]


def layer_norm(torch, rows, cols):
    x = torch.randn(rows, cols, device="cuda")
    xt = lt.Tensor(x).to(*lt.symbols("m n"))
    n = lt.symbols("n")[0]
    centred = xt - xt.mean(n)
    y = centred / lt.sqrt((centred * centred).mean(n) + 1e-5)
    ln = torch.nn.functional.layer_norm
    return f"layer norm {rows}x{cols}", y, lambda: ln(x, (cols,), eps=1e-5), lambda: ln(x.double(), (cols,), eps=1e-5)


def conv_cases(torch):
    gen = torch.Generator(device="cuda").manual_seed(1)
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(8, 64, 56, 56, device="cuda", generator=gen).to(dtype)
        w = torch.randn(64, 64, 3, 3, device="cuda", generator=gen).to(dtype)
        sh, soh, skh, sw, sow, skw = lt.symbols("h oh kh w ow kw")
        windows = lt.Tensor(x).to(*lt.symbols("n c h w")).window(sh, soh, skh, 3, padding=1) \
            .window(sw, sow, skw, 3, padding=1)
        y = (windows * lt.Tensor(w).to(*lt.symbols("o c kh kw"))).sum(lt.symbols("c")[0], skh, skw)
        conv2d = torch.nn.functional.conv2d
        out.append((f"conv 3x3 {dtype} 8x64x56x56", y, lambda x=x, w=w: conv2d(x, w, padding=1),
                    lambda x=x, w=w: conv2d(x.double(), w.double(), padding=1).permute(0, 2, 3, 1)))
    return out


def products(torch, shapes, dtype, label: str):
    """Products of two matrices of `dtype` (named `label` in the case names), one for each (m, k, n) of
    `shapes`, on standard normal inputs drawn in turn from one seeded generator."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    out = []
    for m, k, n in shapes:
        a = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
        b = torch.randn(k, n, device="cuda", generator=gen).to(dtype)
        sm, sk, sn = lt.symbols("m k n")
        c = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
        out.append((f"matmul {label} {m}x{k}x{n}", c, lambda a=a, b=b: a @ b, lambda a=a, b=b: a.double() @ b.double()))
    return out


def matmul_cases(torch):
    return products(torch, ((1024, 1024, 1024), (1000, 1500, 777), (4096, 4096, 4096), (512, 512, 512),
                            (333, 444, 555), (64, 8192, 64), (784, 288, 64), (200, 300, 500), (768, 3072, 768)),
                    torch.float32, "f32")


def small_matmul_cases(torch):
    """float32 products whose 128 x 64 blocks leave most SMs idle, odd and aligned, and two larger ones."""
    return products(torch, ((331, 277, 413), (200, 300, 500), (333, 444, 555), (257, 511, 129), (257, 129, 511),
                            (512, 512, 512), (784, 288, 64), (1000, 1500, 777), (997, 1001, 1003)),
                    torch.float32, "f32")


def skinny_cases(torch):
    """Products of few rows (m < 64: a linear layer on a few tokens), float32, then bfloat16."""
    shapes = ((1, 4096, 4096), (2, 4096, 4096), (4, 4096, 4096), (5, 4096, 4096), (7, 4096, 4096), (8, 4096, 4096),
              (16, 4096, 4096), (24, 4096, 4096), (32, 4096, 4096), (48, 4096, 4096),
              (63, 4096, 4096), (32, 1024, 8192), (16, 8192, 1024), (40, 2000, 3000), (32, 768, 3072))
    return products(torch, shapes, torch.float32, "f32") + short_half_cases(torch)


def short_half_cases(torch):
    """bfloat16 products of 1 to 64 rows, on the tensor cores' grid (16, 32, 48, 64) and off it."""
    shapes = ((1, 4096, 4096), (1, 8192, 8192), (2, 4096, 4096), (4, 4096, 4096), (7, 4096, 4096), (8, 4096, 4096),
              (24, 4096, 4096), (32, 4096, 4096), (48, 4096, 4096), (63, 4096, 4096), (64, 4096, 4096), (16, 8192, 1024),
              (40, 2000, 3000), (32, 11008, 4096))
    return products(torch, shapes, torch.bfloat16, "bf16")


def off_grid_half_cases(torch):
    """bfloat16 products off the mma grid whose blocks keep few SMs busy, k whole k tiles (split on Hopper since
    session 34, not yet timed then)."""
    shapes = ((200, 4096, 200), (1000, 4096, 200), (200, 4096, 1000), (500, 8192, 300), (1000, 2048, 1000),
              (130, 2048, 136))
    return products(torch, shapes, torch.bfloat16, "bf16")


def stored_cases(torch):
    """float32 products whose register tiles read an input stored k last: split-k parts, small products,
    attention heads' q.k^T, a convolution's product."""
    return small_matmul_cases(torch) + products(torch, ((1536, 1536, 1536), (640, 8192, 640), (1024, 512, 1024),
                                                        (1000, 300, 777), (8192, 8192, 32)), torch.float32, "f32") \
        + attention_cases(torch) + conv_cases(torch)[:1]


def batched_cases(torch):
    """Batched bfloat16 products whose k is one or two of the wgmma template's k tiles, float32 and bfloat16
    results (torch: bmm with the same result dtype)."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    out = []
    for batch, m, k, n in ((16, 1024, 64, 1024), (48, 512, 64, 512), (8, 333, 64, 333), (12, 512, 128, 512)):
        a = torch.randn(batch, m, k, device="cuda", generator=gen).to(torch.bfloat16)
        b = torch.randn(batch, k, n, device="cuda", generator=gen).to(torch.bfloat16)
        sb, sm, sk, sn = lt.symbols("b m k n")
        c = (lt.Tensor(a).to(sb, sm, sk) * lt.Tensor(b).to(sb, sk, sn)).sum(sk)
        name = f"batched bf16 {batch}x{m}x{k}x{n}"
        out.append((name, c, lambda a=a, b=b: torch.bmm(a, b, out_dtype=torch.float32),
                    lambda a=a, b=b: torch.bmm(a.double(), b.double())))
        out.append((f"{name}, bf16 result", c.astype(lt.bfloat16), lambda a=a, b=b: torch.bmm(a, b),
                    lambda a=a, b=b: torch.bmm(a.double(), b.double())))
    return out


def wgmma_cases(torch):
    gen = torch.Generator(device="cuda").manual_seed(1)
    out = []
    for batch, m, k, n in ((16, 1024, 64, 1024), (1, 4096, 4096, 4096), (1, 1000, 1000, 1000), (1, 25088, 576, 64),
                           (1, 2000, 304, 500), (1, 3000, 2000, 1000), (1, 2048, 512, 8192), (1, 768, 3072, 768),
                           (0, 768, 3072, 768), (0, 256, 16384, 256), (0, 1024, 1024, 1024), (0, 512, 8192, 1024)):
        a = torch.randn(max(batch, 1), m, k, device="cuda", generator=gen).to(torch.bfloat16)
        b = torch.randn(max(batch, 1), k, n, device="cuda", generator=gen).to(torch.bfloat16)
        sb, sm, sk, sn = lt.symbols("b m k n")
        if batch:
            c = (lt.Tensor(a).to(sb, sm, sk) * lt.Tensor(b).to(sb, sk, sn)).sum(sk)
        else:                   # (a product of matrices: batch 0)
            a, b = a[0], b[0]
            c = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
        out.append((f"matmul bf16 {batch}x{m}x{k}x{n}", c, lambda a=a, b=b: a @ b,
                    lambda a=a, b=b: a.double() @ b.double()))
    return out


def persistent_cases(torch):
    """bfloat16 products of many tiles: long and short k, aligned, and 6000 or 6144 along m and n (edge tiles
    in one, the other or both: what makes the edge-tile kernel slow, session 25)."""
    return products(torch, ((4096, 4096, 4096), (8192, 8192, 8192), (2048, 4096, 11008), (4096, 512, 4096),
                            (8192, 512, 4096), (5120, 5120, 5120), (6144, 4096, 6144), (6000, 4096, 6000),
                            (6144, 4096, 6000), (6000, 4096, 6144), (3000, 2000, 1000)),
                    torch.bfloat16, "bf16")


def split_cases(torch):
    """bfloat16 products whose unsplit wgmma blocks keep 24 to 97 % of an H100's SMs busy."""
    return products(torch, ((512, 8192, 1024), (640, 4096, 1024), (896, 4096, 1024), (1024, 8192, 1024),
                            (1024, 2048, 1024), (3072, 2048, 1024), (1024, 2048, 3072), (3072, 2048, 1000),
                            (2560, 4096, 1024), (4096, 2048, 1024)), torch.bfloat16, "bf16")


def write_back_cases(torch):
    out = wgmma_cases(torch)[:1]
    name, c, baseline, reference = out[0]
    return out + [(f"{name}, bf16 result", c.astype(lt.bfloat16), baseline, reference)]


def multi_kernel_cases(torch):
    """Workloads of two or three kernels: float32 products (split-k's fill and parts, a transposing kernel),
    3x3 convolutions, column sums and dot products (partials, then their sum), attention heads."""
    return matmul_cases(torch) + conv_cases(torch) + [case for case in row_cases(torch)
                                                      if case[0].startswith(("column sum", "dot"))] \
        + attention_cases(torch)


def softmax_case(torch, x) -> tuple:
    """A case of the softmax of each row of the torch tensor `x`: (name, looptool tensor, torch's softmax, torch's
    in float64)."""
    m, n = lt.symbols("m n")
    xt = lt.Tensor(x).to(m, n)
    e = (xt - xt.max(n)).exp()
    rows, cols = x.shape
    return f"softmax {rows}x{cols}", e / e.sum(n), lambda: torch.softmax(x, 1), lambda: torch.softmax(x.double(), 1)


def layer_norm_case(torch, x) -> tuple:
    """A case of the layer norm (no scale) of each row of the torch tensor `x`, as `softmax_case`."""
    m, n = lt.symbols("m n")
    xt = lt.Tensor(x).to(m, n)
    centred = xt - xt.mean(n)
    y = centred / lt.sqrt((centred * centred).mean(n) + 1e-5)
    ln, cols = torch.nn.functional.layer_norm, x.shape[1]
    return f"layer norm {x.shape[0]}x{cols}", y, lambda: ln(x, (cols,)), lambda: ln(x.double(), (cols,))


def short_row_cases(torch):
    """Softmax and layer norm over rows of 10 to 127 (a thread a row below 32, a warp a row above)."""
    gen = torch.Generator(device="cuda").manual_seed(1)

    def softmax(rows, cols):
        return softmax_case(torch, torch.randn(rows, cols, device="cuda", generator=gen))

    def layer_norm(rows, cols):
        return layer_norm_case(torch, torch.randn(rows, cols, device="cuda", generator=gen))

    return [softmax(100000, 10), softmax(1000000, 10), softmax(100000, 12), softmax(100000, 16), softmax(65536, 20),
            softmax(100000, 13), softmax(100000, 17), softmax(100000, 25), softmax(100000, 31), softmax(1000000, 31),
            softmax(65536, 33), softmax(65536, 48), softmax(65536, 64), softmax(32768, 100), softmax(32768, 127),
            layer_norm(100000, 16), layer_norm(100000, 31), layer_norm(65536, 64)]


def warp_row_cases(torch):
    """Softmax and layer norm over rows of 33 to 1024 (those a warp takes alone)."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    cases = [softmax_case(torch, torch.randn(rows, cols, device="cuda", generator=gen))
             for rows, cols in ((65536, 33), (65536, 48), (65536, 64), (32768, 100), (32768, 127), (1000, 100),
                                (4096, 200), (8192, 300), (32768, 256), (16384, 512), (8192, 1000), (32768, 512))]
    return cases + [layer_norm_case(torch, torch.randn(rows, cols, device="cuda", generator=gen))
                    for rows, cols in ((65536, 64), (10000, 200), (16384, 768), (8192, 1024))]


def long_row_cases(torch):
    """Softmax and layer norm over rows too long to stay in a block's registers, more of them than the SMs."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    shapes = ((256, 100000), (2048, 50257), (512, 65536), (1024, 32000))
    return [softmax_case(torch, torch.randn(rows, cols, device="cuda", generator=gen)) for rows, cols in shapes] + \
        [layer_norm_case(torch, torch.randn(rows, cols, device="cuda", generator=gen)) for rows, cols in shapes[:2]]


def row_cases(torch):
    gen = torch.Generator(device="cuda").manual_seed(1)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    def softmax(rows, cols):
        return softmax_case(torch, rand(rows, cols))

    def row_sum(rows, cols):
        x = rand(rows, cols)
        t = lt.Tensor(x).to(*lt.symbols("m n")).sum(lt.symbols("n")[0])
        return f"row sum {rows}x{cols}", t, lambda: x.sum(1), lambda: x.double().sum(1)

    def column_sum(rows, cols):
        x = rand(rows, cols)
        t = lt.Tensor(x).to(*lt.symbols("m n")).sum(lt.symbols("m")[0])
        return f"column sum {rows}x{cols}", t, lambda: x.sum(0), lambda: x.double().sum(0)

    def dot(n):
        x, y = rand(n), rand(n)
        c = lt.symbols("c")[0]
        t = (lt.Tensor(x).to(c) * lt.Tensor(y).to(c)).sum(c)
        return f"dot {n}", t, lambda: torch.dot(x, y), lambda: torch.dot(x.double(), y.double())

    return [softmax(8192, 8192), softmax(1000, 3001), softmax(4096, 256), softmax(2048, 50257), softmax(256, 20000),
            row_sum(8192, 8192), row_sum(1000, 3001),
            row_sum(100000, 77), row_sum(20000, 300),
            column_sum(8192, 8192), column_sum(3001, 1000), dot(1 << 24), dot(10 ** 7 + 1)]


def reduction_cases(torch):
    """Plain row sums over rows of 33 to 127 (few rows to many) and column sums of few to many columns."""
    gen = torch.Generator(device="cuda").manual_seed(2)

    def summed(rows, cols, axis):
        x = torch.randn(rows, cols, device="cuda", generator=gen)
        t = lt.Tensor(x).to(*lt.symbols("m n")).sum(lt.symbols("m n")[axis])
        return f"{('column', 'row')[axis]} sum {rows}x{cols}", t, lambda: x.sum(axis), lambda: x.double().sum(axis)

    return [summed(rows, cols, 1) for rows, cols in ((2000, 50), (300, 64), (4096, 33), (20000, 100), (65536, 64),
                                                      (100000, 77), (100000, 127))] + \
        [summed(rows, cols, 0) for rows, cols in ((200000, 50), (1000000, 20), (3001, 1000), (10 ** 7, 3),
                                                  (8192, 8192), (100, 100000))]


def automatic_kernels(tensor, reference: np.ndarray):
    """The automatic schedule's kernels of `tensor` as `.cuda()` lowers it (`runtime.gpu.lowered_for`), run once
    on a NaN-poisoned output: (a prepared call of them, their relative error against `reference`, the kernel)."""
    program, arrays = runtime_gpu.lowered_for(tensor.node)
    kernel = runtime_gpu.GpuKernel(gpu_rules.gpu_tree(program, runtime_gpu.gpu_target()))
    out = runtime_gpu.poisoned_empty(tuple(reference.shape), program.output.dtype)
    got = runtime_gpu.to_host(kernel(arrays, out=out)).astype(np.float64)
    error = float(np.linalg.norm(np.nan_to_num(got - reference, nan=1e30)) / np.linalg.norm(reference))
    launch = kernel.prepare(arrays, out)
    return (lambda: launch(out)), error, kernel


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--knob", choices=sorted(KNOBS), default="row_elements")
    args = parser.parse_args(argv)
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    apply, values, cases = KNOBS[args.knob]
    for name, tensor, baseline, reference in globals()[cases](torch):
        ref = reference().cpu().numpy()
        for value in values:
            apply(value)
            call, error, kernel = automatic_kernels(tensor, ref)
            ms = interleaved_ms({"kernels": call, "torch": baseline})
            print(json.dumps({"case": name, args.knob: value, "kernels_ms": round(ms["kernels"], 4),
                              "x_torch": round(ms["torch"] / ms["kernels"], 3), "rel_error": error,
                              "launches": [(l.grid, l.block) for l in kernel.module.launches],
                              "registers": [getattr(f, "num_regs", None) for f in kernel.runner.loaded().functions]}),
                  flush=True)


if __name__ == "__main__":
    main()
