"""Random legal GPU schedules under NVIDIA compute-sanitizer: `python -m bench.gpu_sanitize --out DIR`
on the GPU machine (one call).

Draws schedules from the tuner's GPU space (tuner.space.sample_gpu: blocks and threads, register
tiles through cache_write, shared-memory staging, thread-bound reductions combined across
threads, 128-bit vectors) for small float32 workloads with odd sizes (tails everywhere), keeps
those the isl check accepts, and runs them in child processes under `compute-sanitizer` with
memcheck (out-of-bounds and misaligned accesses), racecheck (shared-memory hazards) and
synccheck (barriers in divergent code), the three children at once.  Each kernel writes into a
NaN-filled output and is compared with a float64 NumPy reference.  The JSON report
(DIR/gpu_sanitize.json, with each child's full output in DIR/gpu_sanitize_TOOL.log) lists the draws, every sanitizer error by draw and schedule, and every
wrong result.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optuna

import looptool as lt
from looptool import ir
from looptool.frontend import dtypes
from looptool.autoschedule import gpu as templates
from looptool.autoschedule import gpu_rules
from looptool.runtime import gpu as runtime_gpu
from looptool.runtime import resolve_schedule
from looptool.schedule.looptree import LoopTree
from tuner import space

TOOLS = ("memcheck", "racecheck", "synccheck")
MARK = "@@"


def workloads() -> dict:
    """{name: (tensor, float64 reference)}; the same arrays in every process (fixed seeds)."""
    rng = np.random.default_rng(16)
    out = {}
    for m, k, n in ((67, 45, 53), (130, 36, 97)):
        a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
        s = lt.symbols("m k n")
        out[f"matmul {m}x{k}x{n}"] = ((lt.Tensor(a).to(s.m, s.k) * lt.Tensor(b).to(s.k, s.n)).sum(s.k),
                                      a.astype(np.float64) @ b.astype(np.float64))
    x = rng.standard_normal((37, 300), dtype=np.float32)
    m, n = lt.symbols("m n")
    xt = lt.Tensor(x).to(m, n)
    e = (xt - xt.max(n)).exp()
    ex = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    out["softmax 37x300"] = (e / e.sum(n), ex / ex.sum(1, keepdims=True))
    x, g, b = (rng.standard_normal(shape, dtype=np.float32) for shape in ((29, 257), (257,), (257,)))
    xt = lt.Tensor(x).to(m, n)
    centered = xt - xt.mean(n)
    y = centered / ((centered * centered).mean(n) + 1e-5).sqrt() * lt.Tensor(g).to(n) + lt.Tensor(b).to(n)
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5) * g + b
    out["layernorm 29x257"] = (y, ref)
    return out


TOLERANCE = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}     # a result rounded to 8 or 11 bits


def _conv(x: np.ndarray, w: np.ndarray) -> tuple:
    """A 3x3 convolution (padding 1) of NCHW `x` by OIHW `w` written with `window`, and its float64 reference."""
    sn, sc, sh, sw, so, soh, sow, skh, skw = lt.symbols("n c h w o oh ow kh kw")
    windows = lt.Tensor(x).to(sn, sc, sh, sw).window(sh, soh, skh, 3, padding=1).window(sw, sow, skw, 3, padding=1)
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    taps = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    return (windows * lt.Tensor(w).to(so, sc, skh, skw)).sum(sc, skh, skw), \
        np.einsum("ncijhw,ochw->nijo", taps, w.astype(np.float64))


def automatic_workloads() -> dict:
    """{name: (tensor, float64 reference)} for `--automatic`: one odd-sized case of each family the
    automatic GPU scheduler has a rule for, beside those of `workloads()`."""
    rng = np.random.default_rng(17)
    out = dict(workloads())
    m, n, c = lt.symbols("m n c")
    x, y = rng.standard_normal(10_001, dtype=np.float32), rng.standard_normal(10_001, dtype=np.float32)
    out["dot 10001"] = ((lt.Tensor(x).to(c) * lt.Tensor(y).to(c)).sum(c), x.astype(np.float64) @ y)
    a = rng.standard_normal((301, 68), dtype=np.float32)
    out["column sum 301x68"] = (lt.Tensor(a).to(m, n).sum(m), a.astype(np.float64).sum(0))
    tall = rng.standard_normal((20_001, 3), dtype=np.float32)
    out["column sum 20001x3"] = (lt.Tensor(tall).to(m, n).sum(m), tall.astype(np.float64).sum(0))
    out["row sum 68x301"] = (lt.Tensor(a.T.copy()).to(m, n).sum(n), a.astype(np.float64).sum(0))
    out["max to a scalar 301x68"] = (lt.Tensor(a).to(m, n).max(m, n), np.array(a.max(), dtype=np.float64))
    xt = lt.Tensor(a).to(m, n)
    e = (xt - xt.max(m)).exp()
    ex = np.exp(a.astype(np.float64) - a.max(0))
    out["softmax over the outer dim 301x68"] = (e / e.sum(m), ex / ex.sum(0))
    wide = rng.standard_normal((20_000, 50), dtype=np.float32)
    out["column sum 20000x50, its 2500 partials an output summed by a block"] = (lt.Tensor(wide).to(m, n).sum(m),
                                                                               wide.astype(np.float64).sum(0))
    out["row sum 1001x50 half a warp a row, a tail leaving a warp's half out"] = (lt.Tensor(wide[:1001]).to(m, n).sum(n),
                                                                                  wide[:1001].astype(np.float64).sum(1))
    for rows, cols, case in ((17_001, 48, "rows of 48 half a warp a row, 16 a block, a tail"),
                             (1001, 100, "rows of 100 a warp a row, its lanes' walks predicated"),
                             (1001, 12, "rows of 12 a thread a row in 16-byte vectors"),
                             (1001, 10, "rows of 10 a thread a row in pairs"),
                             (1001, 31, "rows of 31 a thread a row through shared memory, a tail")):
        v = rng.standard_normal((rows, cols), dtype=np.float32)
        vt = lt.Tensor(v).to(m, n)
        e = (vt - vt.max(n)).exp()
        ev = np.exp(v.astype(np.float64) - v.max(1, keepdims=True))
        out[f"softmax {case} {rows}x{cols}"] = (e / e.sum(n), ev / ev.sum(1, keepdims=True))
    g = rng.standard_normal((33, 1001), dtype=np.float32)
    out["pointwise 33x1001"] = ((lt.Tensor(g).to(m, n) * 2.0).exp(), np.exp(2.0 * g.astype(np.float64)))
    out["pointwise 33x1000"] = ((lt.Tensor(g[:, :1000]).to(m, n) * 2.0).exp(), np.exp(2.0 * g[:, :1000].astype(np.float64)))
    s = lt.symbols("m k n")

    def product(shape: tuple[int, int, int], dtype=np.float32):
        a = rng.standard_normal(shape[:2], dtype=np.float32).astype(dtype)
        b = rng.standard_normal(shape[1:], dtype=np.float32).astype(dtype)
        return (lt.Tensor(a).to(s.m, s.k) * lt.Tensor(b).to(s.k, s.n)).sum(s.k), a.astype(np.float64) @ b.astype(np.float64)
    for name, shape in {"matmul on register tiles with edges": (300, 100, 200),
                            "float32 matmul on 128x32 blocks, a tail along n": (260, 100, 40),
                            "float32 matmul split along k": (260, 1024, 100),
                            "float32 matmul under one 128x128 block, split along k onto 64x64 blocks": (100, 4096, 100),
                            "float32 matmul on 128x32 blocks, A's tiles read once as stored": (520, 1024, 32),
                            "float32 matmul in parts on 128x128 blocks, rows of 777": (1000, 1536, 777),
                            "float32 matmul of few rows on short 32x128 blocks in parts, tails of m and n": (45, 2048, 300)}.items():
        out[f"{name} {'x'.join(map(str, shape))}"] = product(shape)
    a, b = rng.standard_normal((300, 100), dtype=np.float32), rng.standard_normal((100, 200), dtype=np.float32)
    a16, b16 = (v.astype(dtypes.bfloat16) for v in (a[:100, :70], b[:70, :45]))
    out["bf16 matmul padded onto tensor cores 100x70x45"] = (
        (lt.Tensor(a16).to(s.m, s.k) * lt.Tensor(b16).to(s.k, s.n)).sum(s.k),
        a16.astype(np.float64) @ b16.astype(np.float64))
    a16 = rng.standard_normal((257, 136), dtype=np.float32).astype(dtypes.bfloat16)
    b16 = rng.standard_normal((136, 200), dtype=np.float32).astype(dtypes.bfloat16)
    odd = ((lt.Tensor(a16).to(s.m, s.k) * lt.Tensor(b16).to(s.k, s.n)).sum(s.k),
           a16.astype(np.float64) @ b16.astype(np.float64))
    out["bf16 matmul padded onto wgmma, the pads TMA's zero fill 257x136x200"] = odd
    out["bf16 matmul as one wgmma kernel: edge tiles guarded, k zero-filled by TMA 257x136x200"] = odd
    for name, shape in {"bf16 matmul of few rows in parts padded to 64-row wgmma blocks, their sum reading them in place":
                            (24, 4096, 520),
                        "bf16 matmul off the mma grid split along k, its parts one wgmma kernel with guarded edges":
                            (200, 4096, 200),
                        "bf16 matmul on 128x128 wgmma blocks two an SM, edge tiles guarded, k zero-filled": (2300, 100, 2304),
                        "bf16 matmul persistent (blocks run the tiles in turn), edge tiles guarded, k zero-filled":
                            (3000, 200, 3100)}.items():
        out[f"{name} {'x'.join(map(str, shape))}"] = product(shape, dtypes.bfloat16)
    q16 = rng.standard_normal((8, 1100, 128), dtype=np.float32).astype(dtypes.bfloat16)
    k16 = rng.standard_normal((8, 128, 1104), dtype=np.float32).astype(dtypes.bfloat16)
    sb = lt.symbols("b")[0]
    out["batched bf16 matmul persistent over batch and tiles, a bf16 result, edges guarded 8x1100x128x1104"] = (
        (lt.Tensor(q16).to(sb, s.m, s.k) * lt.Tensor(k16).to(sb, s.k, s.n)).sum(s.k).astype(lt.bfloat16),
        np.einsum("bmk,bkn->bmn", q16.astype(np.float64), k16.astype(np.float64)))
    q16 = rng.standard_normal((3, 201, 64), dtype=np.float32).astype(dtypes.bfloat16)
    k16 = rng.standard_normal((3, 64, 136), dtype=np.float32).astype(dtypes.bfloat16)
    sb = lt.symbols("b")[0]
    out["batched bf16 matmul of one k tile: 64x128 wgmma blocks by cp.async, edges guarded 3x201x64x136"] = (
        (lt.Tensor(q16).to(sb, s.m, s.k) * lt.Tensor(k16).to(sb, s.k, s.n)).sum(s.k),
        np.einsum("bmk,bkn->bmn", q16.astype(np.float64), k16.astype(np.float64)))
    x, w = rng.standard_normal((2, 8, 9, 7), dtype=np.float32), rng.standard_normal((40, 8, 3, 3), dtype=np.float32)
    out["conv 3x3 2x8x9x7 to 40"] = _conv(x, w)
    x = rng.standard_normal((2, 8, 9, 9), dtype=np.float32)
    out["conv 3x3 2x8x9x9 to 40, 3 outputs along ow a thread"] = _conv(x, w)
    x, w = rng.standard_normal((2, 8, 5, 28), dtype=np.float32), rng.standard_normal((64, 8, 3, 3), dtype=np.float32)
    out["conv 3x3 2x8x5x28 to 64, 4x4 outputs a thread"] = _conv(x, w)
    x, w = (v.astype(dtypes.bfloat16) for v in (rng.standard_normal((2, 16, 9, 7)), rng.standard_normal((64, 16, 3, 3))))
    out["conv 3x3 bf16 2x16x9x7 to 64"] = _conv(x, w)
    q, k, v = (rng.standard_normal((100, 24), dtype=np.float32) for _ in range(3))
    si, sj, sd = lt.symbols("i j d")
    scores = (lt.Tensor(q).to(si, sd) * lt.Tensor(k).to(sj, sd)).sum(sd) * 0.25
    e = (scores - scores.max(sj)).exp()
    p = np.exp(q.astype(np.float64) @ k.T * 0.25 - (q.astype(np.float64) @ k.T * 0.25).max(1, keepdims=True))
    out["attention head 100x24"] = ((e / e.sum(sj) * lt.Tensor(v).to(sj, sd)).sum(sj), p / p.sum(1, keepdims=True) @ v)
    out["attention head 100x24, softmax written whole"] = out["attention head 100x24"]
    bias = rng.standard_normal(200, dtype=np.float32)
    a, b = rng.standard_normal((300, 100), dtype=np.float32), rng.standard_normal((100, 200), dtype=np.float32)
    out["matmul with bias and relu fused 300x100x200"] = (
        lt.relu((lt.Tensor(a).to(s.m, s.k) * lt.Tensor(b).to(s.k, s.n)).sum(s.k) + lt.Tensor(bias).to(s.n)),
        np.maximum(a.astype(np.float64) @ b + bias, 0))
    a16, b16 = (v.astype(dtypes.bfloat16) for v in (rng.standard_normal((256, 64)), rng.standard_normal((64, 256))))
    fused = lt.relu((lt.Tensor(a16).to(s.m, s.k) * lt.Tensor(b16).to(s.k, s.n)).sum(s.k) * 0.5)
    out["bf16 matmul on tensor cores, relu and scale fused 256x64x256"] = (
        fused, np.maximum(a16.astype(np.float64) @ b16.astype(np.float64) * 0.5, 0))
    out["bf16 matmul on tensor cores, rounded to bf16 in its write-back 256x64x256"] = (
        fused.astype(lt.bfloat16), np.maximum(a16.astype(np.float64) @ b16.astype(np.float64) * 0.5, 0))
    a16, b16 = (v.astype(dtypes.bfloat16) for v in (rng.standard_normal((130, 64)), rng.standard_normal((64, 200))))
    edges = lt.relu((lt.Tensor(a16).to(s.m, s.k) * lt.Tensor(b16).to(s.k, s.n)).sum(s.k) * 0.5)
    out["bf16 matmul on wgmma, edge tiles stored under guards, rounded to bf16 130x64x200"] = (
        edges.astype(lt.bfloat16), np.maximum(a16.astype(np.float64) @ b16.astype(np.float64) * 0.5, 0))
    a16, b16 = (v.astype(dtypes.bfloat16) for v in (rng.standard_normal((208, 2048)), rng.standard_normal((2048, 136))))
    split = (lt.Tensor(a16).to(s.m, s.k) * lt.Tensor(b16).to(s.k, s.n)).sum(s.k)
    product = a16.astype(np.float64) @ b16.astype(np.float64)
    out["bf16 matmul split along k, parts on wgmma with edge tiles 208x2048x136"] = (split, product)
    bias = rng.standard_normal(136, dtype=np.float32)
    out["bf16 matmul split along k, bias, relu and a cast to bf16 after the parts' sum 208x2048x136"] = (
        lt.relu(split + lt.Tensor(bias).to(s.n)).astype(lt.bfloat16), np.maximum(product + bias, 0))
    a16, b16 = (v.astype(dtypes.bfloat16) for v in (rng.standard_normal((1000, 64)), rng.standard_normal((64, 256))))
    residual, bias = rng.standard_normal((1000, 256), dtype=np.float32), rng.standard_normal(256, dtype=np.float32)
    rows_cut = (lt.Tensor(a16).to(s.m, s.k) * lt.Tensor(b16).to(s.k, s.n)).sum(s.k) + lt.Tensor(residual).to(s.m, s.n)
    out["bf16 matmul on wgmma, rows cut alone: a row's stores under one guard, residual and bias fused 1000x64x256"] = (
        lt.relu(rows_cut + lt.Tensor(bias).to(s.n)),
        np.maximum(a16.astype(np.float64) @ b16.astype(np.float64) + residual + bias, 0))
    xt = lt.Tensor(g).to(m, n)
    shifted = xt - xt.max(n)
    g64 = g.astype(np.float64) - g.astype(np.float64).max(1, keepdims=True)
    out["log-softmax 33x1001"] = (shifted - shifted.exp().sum(n).log(), g64 - np.log(np.exp(g64).sum(1, keepdims=True)))
    t = rng.standard_normal((45, 70), dtype=np.float32)
    out["transpose through swizzled shared tiles 45x70"] = (
        lt.Tensor(np.zeros(70, np.float32)).to(n) + lt.Tensor(t).to(m, n), t.T.astype(np.float64))
    t16 = rng.standard_normal((3, 40, 70), dtype=np.float32).astype(dtypes.bfloat16)
    sb = lt.symbols("b")[0]
    out["batched bf16 transpose through swizzled shared tiles 3x40x70"] = (
        lt.Tensor(np.zeros((3, 70), dtypes.bfloat16)).to(sb, n) + lt.Tensor(t16).to(sb, m, n),
        t16.astype(np.float64).transpose(0, 2, 1))
    few = rng.standard_normal((3, 70_001), dtype=np.float32)
    ft = lt.Tensor(few).to(m, n)
    fe = (ft - ft.max(n)).exp()
    f64 = np.exp(few.astype(np.float64) - few.max(1, keepdims=True))
    out["softmax of 3 rows of 70001, reductions split across blocks"] = (fe / fe.sum(n), f64 / f64.sum(1, keepdims=True))
    norm = rng.standard_normal((64, 16, 32, 32), dtype=np.float32)
    sb, sh, sw = lt.symbols("b h w")
    out["batch-norm means of 16 channels, b split across blocks 64x16x32x32"] = (
        lt.Tensor(norm).to(sb, c, sh, sw).mean(sb, sh, sw), norm.astype(np.float64).mean((0, 2, 3)))
    narrow = rng.standard_normal((513, 3), dtype=np.float32)
    out["pointwise 513x3"] = (lt.relu(lt.Tensor(narrow).to(m, n)), np.maximum(narrow, 0).astype(np.float64))
    return out


def automatic_draws() -> list[dict]:
    """The automatic GPU schedule of each of `automatic_workloads()` on the program `.cuda()` runs
    (`runtime.gpu.lowered_for`: flattened where pointwise), as draws (the cases named for wgmma edge
    tiles with `WGMMA_EDGE_TILES` on, those padded onto wgmma with it off and `SMALL_CONTRACTION_MACS` at 0, the attention head's softmax
    written whole with `WALK_BYTES_PER_SM` at 0); and where `.cuda()` runs
    more than that program (a convolution's gather and product), the whole `.cuda()` call as one more."""
    target = runtime_gpu.gpu_target()
    draws, default, walk, small = [], templates.WGMMA_EDGE_TILES, gpu_rules.WALK_BYTES_PER_SM, templates.SMALL_CONTRACTION_MACS
    for name, (tensor, _) in automatic_workloads().items():
        if "edge tiles" in name or "padded onto" in name:
            templates.WGMMA_EDGE_TILES = "edge tiles" in name
        if "padded onto" in name:
            templates.SMALL_CONTRACTION_MACS = 0
        if "softmax written whole" in name:
            gpu_rules.WALK_BYTES_PER_SM = 0
        try:
            tree = gpu_rules.gpu_tree(runtime_gpu.lowered_for(tensor.node)[0], target)
        finally:
            templates.WGMMA_EDGE_TILES, gpu_rules.WALK_BYTES_PER_SM = default, walk
            templates.SMALL_CONTRACTION_MACS = small
        draws.append({"workload": name, "schedule": tree.schedule.to_json(), "as_cuda_lowers": True})
        if len(runtime_gpu.planned_trees(tensor.node)) > 1:
            draws.append({"workload": name, "cuda_call": True})
    return draws


def draw_schedules(per_workload: int, seed: int) -> list[dict]:
    """Up to `per_workload` distinct legal GPU schedules per workload, as {workload, schedule JSON}
    (the workloads drawn in parallel processes)."""
    names = list(workloads())
    with concurrent.futures.ProcessPoolExecutor(len(names)) as pool:
        found = pool.map(draw_for, names, [per_workload] * len(names), [seed + k for k in range(len(names))])
    return [{"workload": name, "schedule": text} for name, texts in zip(names, found) for text in texts]


def draw_for(name: str, count: int, seed: int) -> list[str]:
    """Distinct legal GPU schedules (JSON) of one workload, from up to 20 * count draws."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    tree, seen = LoopTree(ir.lower(workloads()[name][0].node)[0]), []      # the program .cuda() lowers
    for _ in range(count * 20):
        if len(seen) == count:
            break
        try:
            drawn = space.sample_gpu(study.ask(), tree)
        except space.InvalidDraw:
            continue
        text = drawn.schedule.to_json()
        if text not in seen and drawn.check()[0]:
            seen.append(text)
    return seen


def run_draws(draws: list[dict]):
    """Child: run each draw on a NaN-filled output, printing a mark before it and its result after."""
    cp = runtime_gpu.cupy()
    cases = automatic_workloads()
    for i, draw in enumerate(draws):
        print(f"{MARK}draw {i}", flush=True)
        tensor, reference = cases[draw["workload"]]
        result = {"draw": i}
        try:
            program, run = _drawn(tensor, draw)
            out = runtime_gpu.poisoned_empty(tensor.shape, program.output.dtype)
            got = runtime_gpu.to_host(run(out)).astype(np.float64).reshape(reference.shape)
            cp.cuda.Device().synchronize()
            err = np.abs(np.nan_to_num(got - reference, nan=np.inf)).max() / np.abs(reference).max()
            result["rel_error"] = float(err)
            result["tolerance"] = TOLERANCE.get(program.output.dtype, 1e-4)
        except Exception as exc:  # noqa: BLE001 - a failing draw is reported, the others still run
            result["exception"] = f"{type(exc).__name__}: {exc}"[:500]
        print(f"{MARK}result {json.dumps(result)}", flush=True)


def _drawn(tensor, draw: dict):
    """(the program whose result it writes, a call writing into `out`) for a draw: the whole `.cuda()`
    call, or one program's kernels under the drawn schedule (legality was checked when drawn)."""
    if draw.get("cuda_call"):
        return runtime_gpu.planned_trees(tensor.node)[-1].program, runtime_gpu.prepared_call(tensor.node)
    program, arrays = runtime_gpu.lowered_for(tensor.node) if draw.get("as_cuda_lowers") else ir.lower(tensor.node)
    kernel = runtime_gpu.GpuKernel(LoopTree(program, resolve_schedule(program, draw["schedule"])))
    return program, lambda out: kernel(arrays, out=out)


def sanitize(tool: str, schedules: Path, count: int, timeout: float) -> subprocess.Popen:
    """Start a child running the first `count` draws under compute-sanitizer's `tool`."""
    sanitizer = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    command = [sanitizer, "--tool", tool, "--print-limit", "100", sys.executable, "-m", "bench.gpu_sanitize",
               "--child", str(schedules), "--count", str(count)]
    return subprocess.Popen(["timeout", str(int(timeout))] + command, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def parse(output: str) -> tuple[dict[int, list[str]], dict[int, dict], list[str]]:
    """(sanitizer error lines by draw, results by draw, lines outside any draw)."""
    errors: dict[int, list[str]] = {}
    results: dict[int, dict] = {}
    outside, current = [], None
    for line in output.splitlines():
        if line.startswith(MARK + "draw "):
            current = int(line.split()[-1])
        elif line.startswith(MARK + "result "):
            result = json.loads(line[len(MARK + "result "):])
            results[result["draw"]] = result
        elif line.startswith("=") and "SUMMARY" in line:
            outside.append(line.strip())
        elif re.match(r"=+ (ERROR|Invalid|Race|Barrier|.*[Hh]azard|Program hit|Error|Warning)", line):
            (errors.setdefault(current, []) if current is not None else outside).append(line.strip())
    return errors, results, outside


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for gpu_sanitize.json")
    parser.add_argument("--per-workload", type=int, default=75, help="draws per workload (4 workloads)")
    parser.add_argument("--racecheck-draws", type=int, default=300, help="draws racecheck and synccheck run")
    parser.add_argument("--timeout", type=float, default=420, help="seconds each sanitizer child may run")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--automatic", action="store_true",
                        help="check the automatic schedules of odd-sized workloads of every family instead")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run_draws(json.loads(args.child.read_text())[:args.count])
        return
    start = time.time()
    draws = automatic_draws() if args.automatic else draw_schedules(args.per_workload, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    schedules = args.out / "gpu_sanitize_schedules.json"
    schedules.write_text(json.dumps(draws))
    drawn_s = time.time() - start
    print(f"{len(draws)} legal schedules drawn in {drawn_s:.0f} s", flush=True)
    counts = {tool: len(draws) if tool == "memcheck" else min(len(draws), args.racecheck_draws) for tool in TOOLS}
    children = {tool: sanitize(tool, schedules, counts[tool], args.timeout) for tool in TOOLS}
    report = {"device": runtime_gpu.cupy().cuda.runtime.getDeviceProperties(0)["name"].decode(),
              "draws": len(draws), "drawing_s": round(drawn_s), "tools": {}}
    for tool, child in children.items():
        output, _ = child.communicate()
        (args.out / f"gpu_sanitize_{tool}.log").write_text(output)
        errors, results, outside = parse(output)
        wrong = {i: r for i, r in results.items() if not r.get("rel_error", np.inf) < r.get("tolerance", 1e-4)}
        report["tools"][tool] = {
            "draws_asked": counts[tool], "draws_run": len(results), "exit_code": child.returncode,
            "draws_with_errors": len(errors), "summary": outside[-3:],
            "errors": {i: {"workload": draws[i]["workload"], "lines": lines[:8], "schedule": draws[i].get("schedule", ".cuda()")}
                       for i, lines in errors.items()},
            "wrong_results": {i: {**r, "workload": draws[i]["workload"], "schedule": draws[i].get("schedule", ".cuda()")}
                              for i, r in wrong.items()},
            "max_rel_error": max((r["rel_error"] for r in results.values() if "rel_error" in r), default=None),
        }
        print(f"{tool}: {len(results)}/{counts[tool]} draws run, {len(errors)} with sanitizer errors, "
              f"{len(wrong)} wrong or failed, exit {child.returncode}; {outside[-1:] }", flush=True)
    report["seconds"] = round(time.time() - start)
    (args.out / "gpu_sanitize.json").write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
