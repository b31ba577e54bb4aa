"""`python -m bench.variants WORKLOAD [NAME=VALUE[,NAME=VALUE...] ...]`: the automatic schedule against
variants of it, side by side with the NumPy baseline.

Each variant redraws some of the automatic scheduler's choices (`t0.k.block=128`, `t0.n.tile=16`, ...;
the names and their options are printed first) and keeps every other choice the rules make.  Every
kernel is checked against the float64 reference, then all kernels and the baseline are timed
interleaved in one process (`timing.interleaved`), and each is reported as the baseline's median
time over its own: the way this session's kc, tile and thread figures were compared.

    python -m bench.variants matmul_1024 t0.k.block=128 t0.k.block=256 --threads 1
"""
from __future__ import annotations

import argparse

import numpy as np
from threadpoolctl import threadpool_limits

import looptool as lt
import looptool.ir
from looptool.analysis.target import host
from looptool.autoschedule import automatic_choices, drawn_tree

from . import timing, workloads
from .suite import TOLERANCE, relative_error


def parse_variant(text: str) -> dict:
    """'t0.k.block=128,t0.order=...' as {name: value}, numbers as ints."""
    pairs = (item.split("=", 1) for item in text.split(",") if item)
    return {name: int(value) if value.lstrip("-").isdigit() else value for name, value in pairs}


def main(argv=None) -> None:
    """Print each variant's time and its ratio to the baseline."""
    p = argparse.ArgumentParser(prog="bench.variants", description=__doc__.splitlines()[0])
    p.add_argument("workload", help="one workload name, as for `python -m bench --only`")
    p.add_argument("variants", nargs="*", help="NAME=VALUE[,NAME=VALUE...] choices to redraw")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--budget", type=float, default=3.0, help="seconds of timed rounds")
    args = p.parse_args(argv)
    [workload] = workloads.select(args.workload)[:1]
    inputs = workload.inputs(np.random.default_rng(0))
    tensor = workload.build(inputs)
    program, arrays = looptool.ir.lower(tensor.node)
    reference = workload.reference(inputs)
    lt.set_num_threads(args.threads)
    target = host().with_cores(args.threads)
    for name, choice in automatic_choices(program, target).items():
        print(f"{name} = {choice.value!r}  (options {choice.options})")
    kernels = {}
    for text in ["auto", *args.variants]:
        drawn = parse_variant(text) if text != "auto" else {}
        tree = drawn_tree(program, target, lambda name, value, options: drawn.get(name, value))
        kernels[text] = kernel = tensor.compile(tree.schedule)
        error = relative_error(workload.to_ref(kernel(arrays)), reference)
        if not error < TOLERANCE:
            raise SystemExit(f"{text}: relative error {error:.2e} against the float64 reference")
    with threadpool_limits(workload.baseline_threads(args.threads), user_api="blas"):
        times = timing.interleaved([lambda k=k: k(arrays) for k in kernels.values()]
                                   + [lambda: workload.baseline(inputs)], budget=args.budget)
    base = times[-1].median
    print(f"\n{workload.title}, {args.threads} thread(s); ratio = baseline median / ours ({workload.note or 'NumPy'})")
    for text, measured in zip(kernels, times):
        print(f"{text:50s} {measured.median * 1e3:9.3f} ms  ratio {base / measured.median:5.2f}  "
              f"noise ±{(measured.spread or 0) * 100:.0f}%")
    print(f"{'baseline':50s} {base * 1e3:9.3f} ms")


if __name__ == "__main__":
    main()
