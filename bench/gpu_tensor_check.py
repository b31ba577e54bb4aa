"""Run the tensor-core matmul schedules once at a small size with tails of whole tiles in every dim
(for compute-sanitizer): bfloat16 and float16, each checked against a float64 reference on a
NaN-poisoned output. Exit status 1 on a wrong result. `python -m bench.gpu_tensor_check tma` runs only the
cases whose schedule names 'tma'."""
import sys

import numpy as np

import looptool as lt
from bench.gpu import check_and_time
from looptool.codegen import gpu as codegen_gpu
from looptool.runtime import gpu as runtime_gpu
from looptool.autoschedule import gpu as templates

MMA_SCHEDULES = (((128, 128), (2, 2), 32, 0), ((128, 128), (2, 2), 32, 2), ((64, 64), (2, 1), 32, 3),
                 ((128, 128), (2, 2), 64, 4))      # block, warps, k tile, stages
MMA_SHAPES = ((144, 48, 200), (32, 96, 24))      # m x k x n: blocks and k tiles with tails; one partial block
WGMMA_CASES = (((192, 128, 384), ((128, 128), (2, 1), 64, 0)), ((192, 128, 384), ((128, 128), (2, 1), 64, 3)),
               ((64, 192, 256), ((128, 256), (2, 1), 64, 2)), ((256, 256, 512), ((128, 256), (1, 2), 64, 4)),
               ((128, 64, 64), ((64, 64), (1, 1), 64, 2)))    # m x k x n: block, warpgroups, k tile, stages
WGMMA_TRANSPOSED = (("a", (192, 128, 256), ((128, 128), (2, 1), 64, 3)),      # A stored [k][m]: mn-major A
                    ("b", (192, 128, 256), ((128, 128), (2, 1), 64, 3)))      # B stored [n][k]: k-major B
TMA_CASES = tuple((shape, (*schedule, "tma")) for shape, schedule in WGMMA_CASES if schedule[3] >= 2)
TMA_TRANSPOSED = tuple((stored, shape, (*schedule, "tma")) for stored, shape, schedule in WGMMA_TRANSPOSED)


def main() -> int:
    """Check mma_tiled with 0, 2, 3 and 4 pipeline stages (4 stages of 64-wide k tiles: 128 KB of dynamic
    shared memory) and two block shapes, and on Hopper wgmma_tiled (tails of whole 64-row tiles,
    mn-major B, 0 to 4 stages, warpgroups along m or n, tiles copied by cp.async or TMA), in both dtypes."""
    rng = np.random.default_rng(0)
    cases = [("mma", shape, schedule) for shape in MMA_SHAPES for schedule in MMA_SCHEDULES]
    if runtime_gpu.device_arch() in codegen_gpu.WGMMA_ARCHS:
        cases += [("wgmma", shape, schedule) for shape, schedule in WGMMA_CASES]
        cases += [("wgmma", shape, schedule, stored) for stored, shape, schedule in WGMMA_TRANSPOSED + TMA_TRANSPOSED]
        cases += [("wgmma", shape, schedule) for shape, schedule in TMA_CASES]
    only = sys.argv[1] if len(sys.argv) > 1 else ""       # e.g. 'tma': only the cases whose schedule names it
    cases = [case for case in cases if only in str(case)]
    failures = sum(not check(rng, dtype, *case) for dtype in (lt.bfloat16, lt.float16) for case in cases)
    return 1 if failures else 0


def check(rng, dtype, family: str, shape: tuple[int, int, int], schedule: tuple, transposed: str = "") -> bool:
    """Whether `family`'s schedule (block, teams, k tile, stages) of a `shape` (m x k x n) matmul in
    `dtype` matches float64 within 1e-5 on a poisoned output; `transposed` names the input ('a' or
    'b') stored the other way round. Prints the case."""
    m_size, k_size, n_size = shape
    m, k, n = lt.symbols("m k n")
    a = rng.standard_normal((m_size, k_size)).astype(dtype)
    b = rng.standard_normal((k_size, n_size)).astype(dtype)
    ta = lt.Tensor(np.ascontiguousarray(a.T)).to(k, m) if transposed == "a" else lt.Tensor(a).to(m, k)
    tb = lt.Tensor(np.ascontiguousarray(b.T)).to(n, k) if transposed == "b" else lt.Tensor(b).to(k, n)
    c = (ta * tb).sum(k)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    build = templates.mma_tiled if family == "mma" else templates.wgmma_tiled
    err = check_and_time(c, build(c.loop_tree(), "t0", *schedule), ref, 1)[0]
    block, teams, k_tile, stages, *copier = schedule
    print(f"{family} {np.dtype(dtype).name} {m_size}x{k_size}x{n_size}{' ' + transposed + ' stored transposed' if transposed else ''}, "
          f"block {block}, teams {teams}, k tile {k_tile}, {stages} stages{' by ' + copier[0] if copier else ''}: "
          f"rel. error {err:.1e} {'ok' if err < 1e-5 else 'WRONG'}")
    return err < 1e-5


if __name__ == "__main__":
    sys.exit(main())
