"""GPU kernels built, checked and timed in one call: `python -m bench.gpu` on the GPU machine.

For each workload and schedule: compile to PTX, run on poisoned (NaN-filled) outputs, compare
with a float64 reference, then time with CUDA events (warm-up, median of repeats) next to the
baseline: cuBLAS float32 with TF32 off (torch.matmul), torch.softmax, and a device-to-device
copy moving the same bytes for relu(a*b+c) (so its ratio is the fraction of copy bandwidth).
Prints a table with ptxas's resource report; `--out DIR` writes the results and the PTX as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
from itertools import chain
from pathlib import Path

import numpy as np

import looptool as lt
from looptool import ir
from looptool.codegen import gpu as codegen_gpu
from looptool.runtime import gpu as runtime_gpu
from looptool.runtime import resolve_schedule
from looptool.schedule.looptree import LoopTree
from looptool.autoschedule import gpu as templates


def kernel_times(torch, fn, calls: int = 20) -> list[tuple[str, float]]:
    """(kernel name, mean microseconds a call) of each GPU kernel one `fn()` launches, in launch order
    (kernels of different modules may share a name: they are told apart by their place)."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [event for event in prof.events() if event.device_type.name == "CUDA"]
    per_call = len(kernels) // calls
    return [(kernels[i].name, sum(event.device_time for event in kernels[i::per_call]) / calls)
            for i in range(per_call)]


def median_ms(fn, repeat: int = 20) -> float:
    """Median device time of fn() in milliseconds, measured with CUDA events after a warm-up (the host's
    work before the launch included: the GPU waits for it)."""
    return back_to_back_ms(fn, calls=1, repeat=repeat)


def back_to_back_ms(fn, calls: int = 20, repeat: int = 5) -> float:
    """Median over `repeat` rounds of the device time of `calls` calls of fn() launched back to back,
    divided by `calls`, in milliseconds (after a warm-up): with many calls, the kernels' own time, the
    host's per-call work hidden behind them where it is shorter (as in a model's steady state)."""
    cp = runtime_gpu.cupy()
    fn()
    cp.cuda.Stream.null.synchronize()
    times = []
    for _ in range(repeat):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / calls)
    return float(np.median(times))


def check_and_time(tensor, schedule, reference: np.ndarray, repeat: int):
    """(relative error, median ms, PTX) of one schedule on poisoned outputs."""
    cp = runtime_gpu.cupy()
    program, arrays = ir.lower(tensor.node)
    tree = LoopTree(program, resolve_schedule(program, schedule))
    kernel = runtime_gpu.kernel_for(tree)
    out = cp.full(tree.buffers[program.output.name].shape, cp.nan, dtype=program.output.dtype)
    got = cp.asnumpy(kernel(arrays, out=out)).astype(np.float64)
    err = float(np.linalg.norm(np.nan_to_num(got - reference, nan=1e30)) / np.linalg.norm(reference))
    return err, median_ms(lambda: kernel(arrays, out=out), repeat), kernel.ptx


def resources(ptx: str) -> str:
    """ptxas's report (registers, shared memory, spills, and any warning) for the PTX's own target, where
    ptxas is installed."""
    ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    if not os.path.exists(ptxas):
        return "ptxas not found"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        arch = re.search(r"^\.target (\w+)", ptx, re.M).group(1)
        run = subprocess.run([ptxas, f"-arch={arch}", "-v", f.name, "-o", os.devnull], capture_output=True, text=True)
    return " ".join(line.split("info    : ")[-1] for line in run.stderr.splitlines()
                    if "Used" in line or "spill" in line or "arning" in line)


def workloads(scale: float):
    """(name, tensor, {variant: schedule}, reference, baseline fn, bytes or flops)."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    cp = runtime_gpu.cupy()
    rng = np.random.default_rng(0)

    n = int(2 ** 28 * scale)
    a, b, c = (cp.asarray(rng.standard_normal(n, dtype=np.float32)) for _ in range(3))
    i, = lt.symbols("i")
    relu = (lt.Tensor(a).to(i) * lt.Tensor(b).to(i) + lt.Tensor(c).to(i)).relu()
    relu_ref = np.maximum(cp.asnumpy(a).astype(np.float64) * cp.asnumpy(b) + cp.asnumpy(c), 0)
    src, dst = cp.empty(2 * n, np.float32), cp.empty(2 * n, np.float32)   # a copy moving the same 16n bytes
    yield ("relu(a*b+c)", relu, {
        "1/thread, 256 threads": relu.loop_tree().split("i", 256).bind("i.0", "block.x").bind("i.1", "thread.x"),
        "4/thread unrolled": relu.loop_tree().split("i", 1024).split("i.1", 256).reorder("i.1.1", "i.1.0")
        .bind("i.0", "block.x").bind("i.1.1", "thread.x").unroll("i.1.0"),
    }, relu_ref, lambda: dst.__setitem__(slice(None), src), ("bytes", 16 * n))

    rows = int(8192 * scale ** 0.5)
    x = cp.asarray(rng.standard_normal((rows, 8192), dtype=np.float32))
    m, k = lt.symbols("m k")
    xt = lt.Tensor(x).to(m, k)
    e = (xt - xt.max(k)).exp()
    softmax = e / e.sum(k)
    xh = cp.asnumpy(x).astype(np.float64)
    sm_ref = np.exp(xh - xh.max(1, keepdims=True))
    sm_ref /= sm_ref.sum(1, keepdims=True)
    tx = torch.from_dlpack(x)
    base = softmax.loop_tree().split("m", 128, stage="t2").bind("m.0", "block.x", stage="t2") \
        .bind("m.1", "thread.x", stage="t2").place("t0", "t2", 2).place("t1", "t2", 2)
    block = softmax.loop_tree().bind("m", "block.x", stage="t2").place("t0", "t2", 1).place("t1", "t2", 1)
    for stage in ("t0", "t1", "t2"):
        block = block.split("k", 512, stage=stage).reorder("k.1", "k.0", stage=stage) \
            .bind("k.1", "thread.x", stage=stage)
    yield ("softmax 8192 cols", softmax, {"row per thread": base, "row per block, 512 threads": block}, sm_ref,
           lambda: torch.softmax(tx, dim=1), ("bytes", 8 * rows * 8192))

    size = int(4096 * scale ** (1 / 3))
    A = cp.asarray(rng.standard_normal((size, size), dtype=np.float32))
    B = cp.asarray(rng.standard_normal((size, size), dtype=np.float32))
    mm, kk, nn = lt.symbols("m k n")
    mat = (lt.Tensor(A).to(mm, kk) * lt.Tensor(B).to(kk, nn)).sum(kk)
    mat_ref = cp.asnumpy(A).astype(np.float64) @ cp.asnumpy(B).astype(np.float64)
    ta, tb = torch.from_dlpack(A), torch.from_dlpack(B)

    def tiles(x_threads=16, x_groups=2, y_threads=16, y_tile=8, k_tile=8, unroll_k=False, shared=("in0", "in1"),
              as_stored=()):
        """The tuner's register-tile template (tuner.templates.register_tiled), 128-bit vectors along n."""
        return templates.register_tiled(mat.loop_tree(), "t0", x_threads, x_groups, 4, y_threads, y_tile, k_tile,
                                    unroll_k, shared, as_stored)
    def ahead(stages, y_tile=8, y_groups=2):
        """A transposed ahead by a kernel of its own (tuner.templates.transposed_ahead), then register tiles
        whose rows come in `y_groups` runs of 4, both k tiles of 32 copied as stored by cp.async."""
        tree = templates.transposed_ahead(mat.loop_tree(), "t0", "in0")
        return templates.register_tiled(tree, "t0", 16, 2, 4, 16, y_tile, 32, True, ("in0.t0", "in1"),
                                    ("in0.t0", "in1"), y_groups=y_groups).pipeline("k.0", stages, stage="t0.acc")
    def pipelined(stages, **kw):
        """The register-tile template with its shared-memory copies issued by cp.async `stages - 1` k
        tiles ahead (LoopTree.pipeline)."""
        return tiles(unroll_k=True, **kw).pipeline("k.0", stages, stage="t0.acc")
    naive = mat.loop_tree().split("m", 8).split("n", 128).reorder("m.0", "n.0", "m.1", "n.1", "k") \
        .bind("m.0", "block.y").bind("n.0", "block.x").bind("m.1", "thread.y").bind("n.1", "thread.x")
    tiled = mat.loop_tree().split("m", 64).split("n", 128).split("m.1", 4).split("n.1", 32) \
        .reorder("m.0", "n.0", "m.1.0", "n.1.1", "k", "m.1.1", "n.1.0") \
        .bind("m.0", "block.y").bind("n.0", "block.x").bind("m.1.0", "thread.y").bind("n.1.1", "thread.x") \
        .unroll("m.1.1").unroll("n.1.0")
    tiled8 = mat.loop_tree().split("m", 128).split("n", 128).split("m.1", 8).split("n.1", 16) \
        .reorder("m.0", "n.0", "m.1.0", "n.1.1", "k", "m.1.1", "n.1.0") \
        .bind("m.0", "block.y").bind("n.0", "block.x").bind("m.1.0", "thread.y").bind("n.1.1", "thread.x") \
        .unroll("m.1.1").unroll("n.1.0")
    staged = templates.shared_tiled(mat.loop_tree(), 128, 16, 8, 16)
    yield ("matmul float32", mat, {"1 output/thread": naive, "4x4 register tile/thread": tiled,
                                   "8x8 register tile/thread": tiled8,
                                   "128x128x16 tiles in shared memory, 8x8/thread": staged,
                                   "register tiles 128x128x8, 8x8/thread": tiles(),
                                   "register tiles 128x128x8, k unrolled": tiles(unroll_k=True),
                                   "register tiles 128x128x16, k unrolled": tiles(k_tile=16, unroll_k=True),
                                   "register tiles 64x64x8, 4x8/thread": tiles(x_threads=8, y_threads=16, y_tile=4),
                                   "128x128x8, k unrolled, cp.async 2 stages": pipelined(2),
                                   "128x128x8, k unrolled, cp.async 3 stages": pipelined(3),
                                   "128x128x8, k unrolled, cp.async 4 stages": pipelined(4),
                                   "128x128x16, k unrolled, cp.async 2 stages": pipelined(2, k_tile=16),
                                   "128x128x16, A as stored, k unrolled": tiles(k_tile=16, unroll_k=True,
                                                                                as_stored=("in0",)),
                                   "128x128x16, A as stored, cp.async 2 stages": pipelined(2, k_tile=16,
                                                                                          as_stored=("in0",)),
                                   "128x128x16, A as stored, cp.async 3 stages": pipelined(3, k_tile=16,
                                                                                          as_stored=("in0",)),
                                   "128x128x32, A as stored, cp.async 2 stages": pipelined(2, k_tile=32,
                                                                                          as_stored=("in0",)),
                                   "128x128x32, A as stored, cp.async 3 stages": pipelined(3, k_tile=32,
                                                                                          as_stored=("in0",)),
                                   "128x128x16, k unrolled, cp.async 3 stages": pipelined(3, k_tile=16),
                                   "A transposed ahead, 128x128x32, rows in 2 runs, cp.async 2 stages": ahead(2),
                                   "A transposed ahead, 128x128x32, rows in 2 runs, cp.async 3 stages": ahead(3),
                                   "A transposed ahead, 256x128x32, rows in 4 runs, cp.async 2 stages":
                                       ahead(2, y_tile=16, y_groups=4),
                                   "A transposed ahead, 256x128x32, rows in 4 runs, cp.async 3 stages":
                                       ahead(3, y_tile=16, y_groups=4),
                                   "tuned: 8x512 block tile, A in shared memory, k tile 32 (GPU study, seed 1)":
                                       tiles(x_threads=128, x_groups=1, y_threads=1, y_tile=8, k_tile=32,
                                             shared=("in0",)),
                                   }, mat_ref,
           lambda: torch.matmul(ta, tb), ("flops", 2 * size ** 3))


MMA_VARIANTS = (((128, 256), (2, 4), 64, 2), ((128, 256), (2, 4), 32, 2), ((256, 128), (4, 2), 32, 2), ((128, 256), (4, 2), 32, 2),
                ((128, 128), (2, 2), 32, 0),
                ((128, 128), (2, 2), 32, 2), ((128, 128), (2, 2), 32, 3), ((64, 128), (2, 2), 32, 3))
WGMMA_VARIANTS = (((128, 256), (2, 1), 64, 4, "tma"), ((128, 256), (2, 1), 64, 3, "tma"),
                  ((256, 128), (4, 1), 64, 4, "tma"), ((128, 128), (2, 1), 64, 3, "tma"),
                  ((128, 256), (2, 1), 64, 4), ((128, 256), (2, 1), 64, 3), ((128, 256), (2, 1), 64, 2),
                  ((128, 256), (2, 1), 64, 0), ((128, 128), (2, 1), 64, 4), ((256, 128), (4, 1), 64, 3),
                  ((128, 256), (1, 2), 64, 4))


def tensor_core_variants(tree, shapes=MMA_VARIANTS, wgmma_shapes=WGMMA_VARIANTS) -> dict:
    """Tensor-core schedules: warp tiles of 16 x 8 mma tiles with accumulators in registers and both
    operands staged per k tile, pipelined (`templates.mma_tiled`); on Hopper also warpgroup tiles of
    64 x N wgmma tiles (`templates.wgmma_tiled`)."""
    variants = {}
    for block, warps, k_tile, stages in shapes:
        warp = (block[0] // warps[0], block[1] // warps[1])
        name = (f"mma tiles: block {block[0]}x{block[1]}, {warps[0] * warps[1]} warps of {warp[0]}x{warp[1]}, "
                f"k tile {k_tile}" + (f", cp.async {stages} stages" if stages else ""))
        variants[name] = templates.mma_tiled(tree, "t0", block, warps, k_tile, stages)
    if runtime_gpu.device_arch() not in codegen_gpu.WGMMA_ARCHS:
        return variants
    for block, groups, k_tile, stages, *copier in wgmma_shapes:
        team = (block[0] // groups[0], block[1] // groups[1])
        copier = copier[0] if copier else "cp.async"
        name = (f"wgmma: block {block[0]}x{block[1]}, {groups[0] * groups[1]} warpgroups of {team[0]}x{team[1]}, "
                f"k tile {k_tile}" + (f", {copier} {stages} stages" if stages else ""))
        variants[name] = templates.wgmma_tiled(tree, "t0", block, groups, k_tile, stages, copier)
    return variants


def half_matmuls(scale: float):
    """bfloat16 and float16 matmul 4096^3, bfloat16 8192^3 and a batched bfloat16 matmul (64 x 1024^3,
    as in attention), float32 accumulation and result, against torch.matmul in the same dtype; the
    float64 references come from torch.matmul in float64 on the GPU."""
    import torch
    size, big, rows = (int(s * scale ** (1 / 3)) for s in (4096, 8192, 1024))
    cases = (("matmul bfloat16", torch.bfloat16, (), size, MMA_VARIANTS[:2], WGMMA_VARIANTS),
             ("matmul float16", torch.float16, (), size, MMA_VARIANTS[:1], WGMMA_VARIANTS[:4]),
             ("matmul bfloat16 8192^3", torch.bfloat16, (), big, MMA_VARIANTS[:1], WGMMA_VARIANTS[:4]),
             ("batched matmul bfloat16 64x1024^3", torch.bfloat16, (64,), rows, MMA_VARIANTS[:1], WGMMA_VARIANTS[:4]))
    for label, dtype, batch, n, shapes, wgmma_shapes in cases:
        ta = torch.randn(*batch, n, n, device="cuda").to(dtype)
        tb = torch.randn(*batch, n, n, device="cuda").to(dtype)
        dims = lt.symbols("b m k n")
        outer, (mm, kk, nn) = dims[:len(batch)], dims[1:]
        mat = (lt.Tensor(ta).to(*outer, mm, kk) * lt.Tensor(tb).to(*outer, kk, nn)).sum(kk)
        ref = torch.matmul(ta.double(), tb.double()).cpu().numpy()
        variants = tensor_core_variants(mat.loop_tree(), shapes, wgmma_shapes)
        yield (label, mat, variants, ref, lambda ta=ta, tb=tb: torch.matmul(ta, tb),
               ("flops", 2 * n ** 3 * (batch[0] if batch else 1)))


def main(argv=None):
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="shrink the problems (e.g. 0.01 to smoke-test)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", default=os.environ.get("OUT"))
    parser.add_argument("--only", default="", help="run only workloads whose name contains this")
    parser.add_argument("--variant", default="", help="run only schedules whose name contains this")
    args = parser.parse_args(argv)
    cp = runtime_gpu.cupy()
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"GPU: {name} ({runtime_gpu.device_arch()})")
    results, ptx_by_variant = [], {}
    for label, tensor, schedules, ref, baseline, (unit, amount) in chain(workloads(args.scale),
                                                                        half_matmuls(args.scale)):
        if args.only and args.only not in label:
            continue
        for variant, schedule in schedules.items():
            if args.variant not in variant:
                continue
            base_ms = median_ms(baseline, args.repeat)   # again next to each variant: clocks drift
            try:
                err, ms, ptx = check_and_time(tensor, schedule, ref, args.repeat)
            except Exception as exc:  # report and go on to the next variant
                results.append({"workload": label, "variant": variant, "error": f"{type(exc).__name__}: {exc}"})
                print(results[-1])
                continue
            rate = amount / ms / 1e6 if unit == "bytes" else amount / ms / 1e9
            results.append({"workload": label, "variant": variant, "rel_error": err, "ours_ms": ms,
                            "baseline_ms": base_ms, "ratio": base_ms / ms,
                            "rate": f"{rate:.0f} {'GB/s' if unit == 'bytes' else 'TFLOP/s'}",
                            "ptxas": resources(ptx)})
            print(f"{label} / {variant}: {base_ms / ms:.2f}x, {results[-1]['ptxas']}", flush=True)
            ptx_by_variant[f"{label} / {variant}"] = ptx
    print("\n| workload | schedule | rel. error | ours ms | baseline ms | baseline/ours | ours |")
    print("| --- | --- | --- | ---: | ---: | ---: | --- |")
    for r in results:
        if "error" in r:
            print(f"| {r['workload']} | {r['variant']} | FAILED: {r['error'][:80]} | | | | |")
        else:
            print(f"| {r['workload']} | {r['variant']} | {r['rel_error']:.1e} | {r['ours_ms']:.3f} | "
                  f"{r['baseline_ms']:.3f} | {r['ratio']:.2f} | {r['rate']} |")
    if args.out:
        Path(args.out, "gpu_results.json").write_text(json.dumps({"gpu": name, "results": results}, indent=2))
        Path(args.out, "gpu_ptx.json").write_text(json.dumps(ptx_by_variant, indent=1))


if __name__ == "__main__":
    main()
