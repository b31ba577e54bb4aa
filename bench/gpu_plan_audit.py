"""Plans that leave a GPU idle, found on any machine: `python -m bench.gpu_plan_audit [--arch sm_90]` plans
(`runtime.gpu.planned_trees(node, arch)`, as `.cuda()` would on that architecture's reference part; no GPU
needed) a grid of products (m, n, k in 1, 5, 16, 50, 200, 1000, 4096; float32 and bfloat16, at least 2^26
multiply-adds) and of row programs (softmax over rows and columns, layer norm, sums and maxima along either
dim, a pointwise chain; NCHW channel sums, pools, batch-norm means; at least 16 MiB read), and prints each
whose largest kernel launches fewer than `--blocks` blocks or `--threads` threads an SM: its kernels' grids
and `explain()`. Session 34 found with it bfloat16 products off the mma grid never split (200x4096x200 on 4
blocks) and wide column sums on 25000 threads. A flagged plan is a lead to time, not a verdict: a plan of few
blocks may be right (one wave of 128x128 tiles).
"""
from __future__ import annotations

import argparse
import itertools
import math

import numpy as np

import looptool as lt
from looptool.codegen import gpu as codegen_gpu
from looptool.frontend import dtypes
from looptool.runtime import gpu as runtime_gpu

SIZES = (1, 5, 16, 50, 200, 1000, 4096)
PRODUCT_MACS = 1 << 26
ROW_BYTES = 16 << 20


def products():
    """(name, tensor) of the products audited."""
    sm, sk, sn = lt.symbols("m k n")
    for dtype, (m, k, n) in itertools.product((np.float32, dtypes.bfloat16), itertools.product(SIZES, SIZES, SIZES)):
        if m * k * n >= PRODUCT_MACS:
            a, b = np.zeros((m, k), dtype), np.zeros((k, n), dtype)
            yield f"{np.dtype(dtype).name} {m}x{k}x{n}", (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)


def row_programs():
    """(name, tensor) of the row programs audited."""
    m, n, b, c, h, w = lt.symbols("m n b c h w")

    def softmax(x, dim):
        e = (x - x.max(dim)).exp()
        return e / e.sum(dim)

    def layer_norm(x, dim):
        centred = x - x.mean(dim)
        return centred / lt.sqrt((centred * centred).mean(dim) + 1e-5)
    for rows, cols in itertools.product((1, 7, 64, 333, 4096, 100000), (3, 17, 100, 1000, 8192, 100000)):
        if ROW_BYTES <= rows * cols * 4 <= 1 << 30:
            x = lt.Tensor(np.zeros((rows, cols), np.float32)).to(m, n)
            yield from ((f"{what} {rows}x{cols}", t) for what, t in (
                ("softmax over rows", softmax(x, n)), ("softmax over columns", softmax(x, m)),
                ("layer norm", layer_norm(x, n)), ("row sum", x.sum(n)), ("column sum", x.sum(m)),
                ("row max", x.max(n)), ("pointwise", (x * 2.0).exp())))
    for shape in ((8, 64, 112, 112), (64, 512, 7, 7), (2, 3, 512, 512), (128, 16, 32, 32)):
        x = lt.Tensor(np.zeros(shape, np.float32)).to(b, c, h, w)
        yield from ((f"{what} {'x'.join(map(str, shape))}", t) for what, t in (
            ("channel sum", x.sum(c)), ("global pool", x.mean(h, w)), ("batch-norm means", x.mean(b, h, w)),
            ("softmax over channels", softmax(x, c))))


def audit(name: str, tensor, arch: str, blocks: int, threads: int) -> str | None:
    """A report of `tensor`'s plan on `arch` where its largest kernel launches fewer than `blocks` blocks or
    `threads` threads an SM; else None."""
    trees = runtime_gpu.planned_trees(tensor.node, arch)
    launches = [launch for tree in trees for launch in codegen_gpu.generate(tree, arch).launches]
    largest = max(launches, key=lambda launch: math.prod(launch.grid) * math.prod(launch.block))
    sms = runtime_gpu.gpu_target(arch).sms
    grid, per_sm = math.prod(largest.grid), math.prod(largest.grid) * math.prod(largest.block) / sms
    if grid >= blocks and per_sm >= threads:
        return None
    kernels = ", ".join(f"{launch.grid} x {launch.block}" for launch in launches)
    reasons = [line for tree in trees for line in tree.explain().splitlines()[1:]]
    return f"{name}: {len(launches)} kernels ({kernels}); {per_sm:.0f} threads an SM\n    " + "\n    ".join(reasons)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90", help="the architecture planned for (its reference part)")
    parser.add_argument("--blocks", type=int, default=66, help="flag a largest kernel of fewer blocks")
    parser.add_argument("--threads", type=int, default=64, help="... or of fewer threads an SM")
    args = parser.parse_args(argv)
    flagged = 0
    for name, tensor in itertools.chain(products(), row_programs()):
        report = audit(name, tensor, args.arch, args.blocks, args.threads)
        if report:
            flagged += 1
            print(report, flush=True)
    print(f"{flagged} plans flagged")


if __name__ == "__main__":
    main()
