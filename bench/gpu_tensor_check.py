"""Run the tensor-core matmul schedules once at a small size with tails of whole tiles in every dim
(for compute-sanitizer): bfloat16 and float16, each checked against a float64 reference on a
NaN-poisoned output. Exit status 1 on a wrong result."""
import sys

import numpy as np

import looptool as lt
from bench.gpu import check_and_time
from looptool.codegen import gpu as codegen_gpu
from looptool.runtime import gpu as runtime_gpu
from tuner import space

SHAPES = ((144, 48, 200), (32, 96, 24))      # m x k x n: blocks and k tiles with tails; one partial block


def main() -> int:
    """Check mma_tiled with 0, 2, 3 and 4 pipeline stages (4 stages of 64-wide k tiles: 128 KB of dynamic
    shared memory) and two block shapes, in both dtypes."""
    rng = np.random.default_rng(0)
    failures = 0
    for dtype in (lt.bfloat16, lt.float16):
        for m_size, k_size, n_size in SHAPES:
            m, k, n = lt.symbols("m k n")
            a = rng.standard_normal((m_size, k_size)).astype(dtype)
            b = rng.standard_normal((k_size, n_size)).astype(dtype)
            c = (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k)
            ref = a.astype(np.float64) @ b.astype(np.float64)
            for block, warps, k_tile, stages in (((128, 128), (2, 2), 32, 0), ((128, 128), (2, 2), 32, 2),
                                                 ((64, 64), (2, 1), 32, 3), ((128, 128), (2, 2), 64, 4)):
                tree = space.mma_tiled(c.loop_tree(), "t0", block, warps, k_tile, stages)
                err = check_and_time(c, tree, ref, 1)[0]
                ok = err < 1e-5
                failures += not ok
                print(f"{np.dtype(dtype).name} {m_size}x{k_size}x{n_size}, block {block}, warps {warps}, "
                      f"k tile {k_tile}, {stages} stages: rel. error {err:.1e} {'ok' if ok else 'WRONG'}")
    if runtime_gpu.device_arch() in codegen_gpu.WGMMA_ARCHS:
        failures += check_wgmma(rng)
    return 1 if failures else 0


WGMMA_CASES = (((192, 128, 384), (128, 128), (2, 1), 64, 0), ((192, 128, 384), (128, 128), (2, 1), 64, 3),
               ((64, 192, 256), (128, 256), (2, 1), 64, 2), ((256, 256, 512), (128, 256), (1, 2), 64, 4),
               ((128, 64, 64), (64, 64), (1, 1), 64, 2))


def check_wgmma(rng) -> int:
    """wgmma_tiled at small sizes with a tail of whole 64-row tiles, mn-major B, 0 to 4 stages; the
    number of wrong results."""
    failures = 0
    for dtype in (lt.bfloat16, lt.float16):
        for (m_size, k_size, n_size), block, groups, k_tile, stages in WGMMA_CASES:
            m, k, n = lt.symbols("m k n")
            a = rng.standard_normal((m_size, k_size)).astype(dtype)
            b = rng.standard_normal((k_size, n_size)).astype(dtype)
            c = (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k)
            ref = a.astype(np.float64) @ b.astype(np.float64)
            tree = space.wgmma_tiled(c.loop_tree(), "t0", block, groups, k_tile, stages)
            err = check_and_time(c, tree, ref, 1)[0]
            ok = err < 1e-5
            failures += not ok
            print(f"wgmma {np.dtype(dtype).name} {m_size}x{k_size}x{n_size}, block {block}, warpgroups {groups}, "
                  f"k tile {k_tile}, {stages} stages: rel. error {err:.1e} {'ok' if ok else 'WRONG'}")
    return failures


if __name__ == "__main__":
    sys.exit(main())
