"""`python -m bench.pool`: where a small multi-thread kernel's time goes when other work runs between calls.

Times the automatic 2-thread kernel of one matmul (default 200x300x500) call by call after different
things ran just before it (nothing, the OpenBLAS matmul with 1 or 2 threads, a sleep) and prints the
10th, 50th and 90th percentiles, beside the 1-thread kernel and OpenBLAS itself.  The rows tell a
wake-up (after a sleep), another library's spinning threads (after OpenBLAS with 2 threads: its
workers spin for a while after each call) and the pool itself (back to back) apart.
`OPENBLAS_THREAD_TIMEOUT=4` in the environment makes OpenBLAS's workers sleep at once."""
from __future__ import annotations

import argparse
import gc
import os
import time

import numpy as np
from threadpoolctl import threadpool_limits

import looptool as lt
import looptool.ir

from .workloads import matmul


def percentiles(times: list[float]) -> str:
    """The 10th, 50th and 90th percentiles in microseconds."""
    ordered = sorted(times)
    return " ".join(f"{ordered[int(p * (len(ordered) - 1))] * 1e6:7.0f}" for p in (0.1, 0.5, 0.9))


def timed(before, fn, calls: int) -> list[float]:
    """Seconds of each of `calls` calls of `fn`, each right after an untimed call of `before`."""
    for _ in range(3):
        before()
        fn()
    enabled = gc.isenabled()
    gc.disable()
    times = []
    for _ in range(calls):
        before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    if enabled:
        gc.enable()
    return times


def kernels(shape: tuple[int, int, int], threads: int):
    """The automatic kernel at 1 and `threads` threads, its input arrays and the NumPy inputs."""
    workload = matmul(*shape, target=0.0)
    inputs = workload.inputs(np.random.default_rng(0))
    tensor = workload.build(inputs)
    made = []
    for count in (1, threads):
        lt.set_num_threads(count)
        made.append(tensor.compile(lt.auto_schedule(tensor)))
    return made, looptool.ir.lower(tensor.node)[1], inputs


def main(argv=None) -> None:
    """Print the table."""
    p = argparse.ArgumentParser(prog="bench.pool", description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="200x300x500", help="M x K x N of the matmul")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args(argv)
    shape = tuple(int(v) for v in args.shape.split("x"))
    (serial, parallel), arrays, inputs = kernels(shape, args.threads)
    a, b = inputs["a"], inputs["b"]
    print(f"matmul {args.shape}, {os.cpu_count()} CPUs, OPENBLAS_THREAD_TIMEOUT="
          f"{os.environ.get('OPENBLAS_THREAD_TIMEOUT', 'unset')}; microseconds per call, p10 p50 p90")
    with threadpool_limits(args.threads, user_api="blas"):
        rows = [
            ("ours 1 thread, back to back", lambda: None, lambda: serial(arrays)),
            (f"ours {args.threads} threads, back to back", lambda: None, lambda: parallel(arrays)),
            (f"ours {args.threads} threads after OpenBLAS {args.threads} threads", lambda: a @ b, lambda: parallel(arrays)),
            (f"ours {args.threads} threads after a 2 ms sleep", lambda: time.sleep(0.002), lambda: parallel(arrays)),
            (f"OpenBLAS {args.threads} threads after ours", lambda: parallel(arrays), lambda: a @ b),
            (f"OpenBLAS {args.threads} threads, back to back", lambda: None, lambda: a @ b),
        ]
        for label, before, fn in rows:
            print(f"{label:48s} {percentiles(timed(before, fn, args.calls))}")
        with threadpool_limits(1, user_api="blas"):
            print(f"{f'ours {args.threads} threads after OpenBLAS 1 thread':48s} "
                  f"{percentiles(timed(lambda: a @ b, lambda: parallel(arrays), args.calls))}")


if __name__ == "__main__":
    main()
