"""The GPU scheduler's row and reduction rules against variants of their constants, checked and timed
next to torch in one process: `python -m bench.gpu_rules_variants` on the GPU machine.

For each workload (softmax, layer norm, row and column sums, a dot product, at a large and an odd
size) and each value of `gpu_rules.ROW_ELEMENTS_PER_THREAD` (the elements a thread takes per pass
along a row, which sets the threads a row gets), the automatic schedule's kernels run on a NaN-poisoned
output, are compared with torch in float64, and are timed interleaved with torch (median of CUDA-event
timed calls, best of 3 rounds). Prints one line per variant: kernels' time, torch / kernels.
"""
from __future__ import annotations

import json

import numpy as np

import looptool as lt
from looptool import ir
from looptool.autoschedule import gpu_rules
from looptool.runtime import gpu as runtime_gpu
from bench.gpu_suite import interleaved_ms

VARIANTS = (8, 16, 32)


def cases(torch):
    gen = torch.Generator(device="cuda").manual_seed(1)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    def softmax(rows, cols):
        x = rand(rows, cols)
        xt = lt.Tensor(x).to(*lt.symbols("m n"))
        n = lt.symbols("n")[0]
        e = (xt - xt.max(n)).exp()
        return f"softmax {rows}x{cols}", e / e.sum(n), lambda: torch.softmax(x, 1), lambda: torch.softmax(x.double(), 1)

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

    return [softmax(8192, 8192), softmax(1000, 3001), softmax(4096, 256), row_sum(8192, 8192), row_sum(1000, 3001),
            column_sum(8192, 8192), column_sum(3001, 1000), dot(1 << 24), dot(10 ** 7 + 1)]


def main():
    import torch
    for name, tensor, baseline, reference in cases(torch):
        program, arrays = ir.lower(tensor.node)
        ref = reference().cpu().numpy()
        for elements in VARIANTS:
            gpu_rules.ROW_ELEMENTS_PER_THREAD = elements
            tree = gpu_rules.gpu_tree(program, runtime_gpu.gpu_target())
            kernel = runtime_gpu.GpuKernel(tree)
            out = runtime_gpu.cupy().full(tuple(ref.shape), np.nan, dtype=np.float32)
            got = runtime_gpu.cupy().asnumpy(kernel(arrays, out=out)).astype(np.float64)
            error = float(np.linalg.norm(np.nan_to_num(got - ref, nan=1e30)) / np.linalg.norm(ref))
            launch = kernel.prepare(arrays, out)
            ms = interleaved_ms({"kernels": lambda: launch(out), "torch": baseline})
            print(json.dumps({"case": name, "row_elements": elements, "kernels_ms": round(ms["kernels"], 4),
                              "x_torch": round(ms["torch"] / ms["kernels"], 3), "rel_error": error,
                              "launches": [(l.grid, l.block) for l in kernel.module.launches]}), flush=True)


if __name__ == "__main__":
    main()
