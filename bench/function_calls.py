"""What a call costs through `lt.function` (issue 28): `python -m bench.function_calls [--out DIR]`.

A 64³ float32 matmul on one thread, timed interleaved in batches of CALLS calls (median of the
batches): through `lt.function` (making its result, into `out=`, and with its rows a dynamic dim), the
same compiled kernel called directly with the three arrays (`Kernel.array_entry`: the kernel alone, unchecked, into one `out`),
`Kernel.__call__` with a list of arrays, `c.numpy()` on a built expression, and
NumPy's `a @ b` (BLAS held to one thread). The call overhead is the function's time less the kernel
alone's. Writes function_calls.json and .md to `--out`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

import looptool as lt

from . import timing
from .peers import cpu_name

CALLS = 200
SIZE = 64


def per_call_us(fns: dict) -> dict[str, float]:
    """Median microseconds a call of each zero-argument callable, timed interleaved in batches."""
    batches = {name: (lambda fn=fn: _repeat(fn)) for name, fn in fns.items()}
    times = timing.interleaved(list(batches.values()), budget=4.0)
    return {name: t.median / CALLS * 1e6 for name, t in zip(batches, times)}


def _repeat(fn):
    """CALLS calls, each result dropped before the next (so the allocator reuses its memory, as in a loop)."""
    for _ in range(CALLS):
        fn()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    lt.set_num_threads(1)
    m, k, n = lt.symbols("m k n")

    @lt.function
    def matmul(a: lt.In[m, k], b: lt.In[k, n]):
        return (a * b).sum(k)
    rows = lt.symbols("rows", dynamic=True)[0]

    @lt.function
    def dynamic(a: lt.In[rows, k], b: lt.In[k, n]):      # one kernel for every number of rows
        return (a * b).sum(k)

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((SIZE, SIZE)).astype(np.float32) for _ in range(2))
    error = float(np.abs(matmul(a, b) - a.astype(np.float64) @ b).max() / np.abs(a.astype(np.float64) @ b).max())
    kernel = matmul.kernel(a, b)
    dynamic(a, b)
    out = np.empty((SIZE, SIZE), np.float32)
    expression = (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k)
    with threadpool_limits(1):
        us = per_call_us({"lt.function": lambda: matmul(a, b), "lt.function, out=": lambda: matmul(a, b, out=out),
                          "lt.function, dynamic rows": lambda: dynamic(a, b),
                          "kernel alone": lambda: kernel.array_entry(a, b, out),
                          "Kernel(arrays)": lambda: kernel([a, b]), "c.numpy()": expression.numpy,
                          "NumPy a @ b": lambda: a @ b})
    result = {"cpu": cpu_name(), "size": SIZE, "max_rel_error": error, "us_per_call": us,
              "overhead_us": us["lt.function"] - us["kernel alone"],
              "out_overhead_us": us["lt.function, out="] - us["kernel alone"],
              "function_x_numpy_time": us["lt.function"] / us["NumPy a @ b"]}
    lines = [f"64³ float32 matmul, 1 thread, {result['cpu']}; µs a call (median of batches of {CALLS})", "",
             "| call | µs |", "| --- | ---: |", *[f"| {name} | {t:.2f} |" for name, t in us.items()], "",
             f"lt.function's overhead over the kernel alone: {result['overhead_us']:.2f} µs (with out=: "
             f"{result['out_overhead_us']:.2f} µs); its time over NumPy's: {result['function_x_numpy_time']:.2f}x; "
             f"max rel. error vs float64 {error:.1e}"]
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "function_calls.json").write_text(json.dumps(result, indent=1))
        (args.out / "function_calls.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
