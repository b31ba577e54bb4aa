"""Dynamic shared memory on the GPU machine: `python -m bench.gpu_shared_check`.

1. The float32 kernel "128x128x16 tiles in shared memory" of bench.gpu (4096^3) with its 16 KB of
   shared memory static, as the same tiles at offsets in dynamic shared memory (launched with exactly
   what it needs), and dynamic with an over-sized request (200 KB, as a launch opting every kernel
   in to the most would): is dynamic shared memory itself slower, or the size asked for?
2. bfloat16 4096^3 mma_tiled variants needing more than 48 KB (3-4 stages, k tile 64), each checked
   on a poisoned output against float64 and timed next to torch.matmul bfloat16."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np

import looptool as lt
from bench.gpu import check_and_time, median_ms, resources, tensor_core_variants
from looptool import ir
from looptool.codegen import gpu
from looptool.runtime import gpu as runtime_gpu
from looptool.runtime import resolve_schedule
from looptool.schedule.looptree import LoopTree
from looptool.autoschedule import gpu as templates

MMA = (((128, 256), (2, 4), 32, 2), ((128, 256), (2, 4), 32, 3), ((128, 256), (2, 4), 32, 4),
       ((128, 256), (2, 4), 64, 2), ((128, 256), (2, 4), 64, 3), ((64, 256), (1, 4), 32, 4),
       ((64, 256), (1, 4), 64, 3))


def launcher(module: gpu.GpuModule, memory: dict):
    """A function launching the module's kernels on `memory` (buffer name -> CuPy array)."""
    cp = runtime_gpu.cupy()
    cuda_module = cp.cuda.function.Module()
    cuda_module.load(module.ptx.encode())
    functions = [cuda_module.get_function(k.name) for k in module.launches]
    for launch, function in zip(module.launches, functions):
        if launch.dynamic_shared:
            runtime_gpu.opt_in_shared(launch, function)
    args = tuple(memory[name] for name in module.params)

    def run():
        for launch, function in zip(module.launches, functions):
            function(launch.grid, launch.block, args, shared_mem=launch.dynamic_shared)
    return run


def float32_static_vs_dynamic(results: list):
    """Part 1."""
    cp = runtime_gpu.cupy()
    rng = np.random.default_rng(0)
    A = cp.asarray(rng.standard_normal((4096, 4096), dtype=np.float32))
    B = cp.asarray(rng.standard_normal((4096, 4096), dtype=np.float32))
    mm, kk, nn = lt.symbols("m k n")
    mat = (lt.Tensor(A).to(mm, kk) * lt.Tensor(B).to(kk, nn)).sum(kk)
    staged = templates.shared_tiled(mat.loop_tree(), 128, 16, 8, 16)
    program, _ = ir.lower(mat.node)
    tree = LoopTree(program, resolve_schedule(program, staged))
    static = gpu.generate(tree, "sm_90")
    dynamic = gpu.generate(tree, "sm_90", dynamic_shared=True)
    oversized = dataclasses.replace(dynamic, launches=[dataclasses.replace(k, dynamic_shared=200 * 1024)
                                                       for k in dynamic.launches])
    ref = None
    for name, module in (("static", static), ("dynamic, exact size", dynamic), ("dynamic, 200 KB asked", oversized)):
        out = cp.full((4096, 4096), cp.nan, dtype=np.float32)
        run = launcher(module, {"in0": A, "in1": B, program.output.name: out})
        run()
        got = cp.asnumpy(out).astype(np.float64)
        ref = got if ref is None else ref
        ms = median_ms(run, 10)
        results.append({"kernel": f"float32 128x128x16 shared tiles, {name}", "ms": ms,
                        "same_as_static": bool(np.array_equal(got, ref)), "shared": module.launches[0].dynamic_shared,
                        "ptxas": resources(module.ptx)})
        print(results[-1], flush=True)


def mma_variants(results: list):
    """Part 2."""
    import torch
    ta, tb = (torch.randn(4096, 4096, device="cuda").to(torch.bfloat16) for _ in range(2))
    m, k, n = lt.symbols("m k n")
    mat = (lt.Tensor(ta).to(m, k) * lt.Tensor(tb).to(k, n)).sum(k)
    ref = torch.matmul(ta.double(), tb.double()).cpu().numpy()
    for variant, tree in tensor_core_variants(mat.loop_tree(), MMA).items():
        torch_ms = median_ms(lambda: torch.matmul(ta, tb))
        try:
            err, ms, ptx = check_and_time(mat, tree, ref, 20)
        except Exception as exc:  # report and go on
            results.append({"kernel": variant, "error": f"{type(exc).__name__}: {exc}"[:300]})
        else:
            results.append({"kernel": variant, "ms": ms, "torch_ms": torch_ms, "ratio": torch_ms / ms,
                            "tflops": 2 * 4096 ** 3 / ms / 1e9, "rel_error": err, "ptxas": resources(ptx)})
        print(results[-1], flush=True)


def main():
    """Both parts; writes shared_check.json under $OUT."""
    results = []
    float32_static_vs_dynamic(results)
    mma_variants(results)
    Path(os.environ.get("OUT", "."), "shared_check.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
