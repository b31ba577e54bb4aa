"""How far the tuner's space should reach from the automatic schedule: `python -m bench.tuning_reach
[--trials 32 128] [--only NAME] [--reach 1 2]`.

For each workload of `bench.peers_tuning.SUITE` (or those whose name contains `--only`), one thread,
the process pinned to one core: a fresh study at each `--reach` (`looptool.autoschedule.choices.REACH`,
the steps each neighbourhood goes from the rules' value) and trial budget, same seed; then all best
kernels are checked against float64 and timed interleaved (shuffled rounds) with NumPy (BLAS on one
thread). Prints one JSON row a workload and budget and writes them to `--out` (default
bench/results/tuning_reach.json): each reach's time over the first reach's, and its tuning wall time.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from .peers import cpu_name, relative_error
from .peers_tuned import commit
from .peers_tuning import HERE, SUITE, looptool_tuned, pin_to_cores
from .timing import interleaved


def with_reach(reach: int, tune):
    """`tune()` with the space's neighbourhoods `reach` steps wide (the space's memo of them cleared)."""
    from looptool.autoschedule import choices
    from tuner import space
    kept = choices.REACH
    choices.REACH = reach
    space.centre_of.cache_clear()
    try:
        return tune()
    finally:
        choices.REACH = kept
        space.centre_of.cache_clear()


def compare(case, trials: int, reaches: list[int]) -> dict:
    """One row: a study at each reach, the best kernels timed side by side with NumPy."""
    from threadpoolctl import threadpool_limits
    from looptool import ir
    workload = case.workload
    inputs = workload.inputs(np.random.default_rng(0))
    reference = workload.reference(inputs)
    tensor = workload.build(inputs)
    arrays = ir.lower(tensor.node)[1]
    runs = {reach: with_reach(reach, lambda: looptool_tuned(tensor, trials, 1)) for reach in reaches}
    errors = {reach: relative_error(workload.to_ref(run["kernel"](arrays)), reference) for reach, run in runs.items()}
    baseline, blas_threads = case.baseline(1)
    calls = [lambda run=run: run["kernel"](arrays) for run in runs.values()] + [lambda: baseline(inputs)]
    with threadpool_limits(blas_threads):
        timings = interleaved(calls, budget=4.0, shuffle=True)
    seconds = [t.median for t in timings]
    first = seconds[0]
    return {"workload": case.name, "trials": trials, "rel_error": errors,
            "seconds": dict(zip(map(str, reaches), seconds)), "numpy_seconds": seconds[-1],
            "time_over_first_reach": {str(r): s / first for r, s in zip(reaches, seconds)},
            "numpy_over": {str(r): seconds[-1] / s for r, s in zip(reaches, seconds)},
            "wall_s": {str(r): run["wall_s"] for r, run in runs.items()},
            "best_trial_seconds": {str(r): min(run["trial_seconds"]) for r, run in runs.items()}}


def main(argv=None):
    """The command line (the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--reach", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--only", nargs="*", default=[], help="workloads whose names contain one of these")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "tuning_reach.json")
    args = parser.parse_args(argv)
    cpu = cpu_name()
    pin_to_cores(1)
    started, rows = time.time(), []
    for case in SUITE:
        if args.only and not any(name in case.workload.name or name in case.name for name in args.only):
            continue
        for trials in args.trials:
            rows.append(compare(case, trials, args.reach))
            print(json.dumps(rows[-1]), flush=True)
    args.out.write_text(json.dumps({"cpu": cpu, "commit": commit(), "threads": 1, "started": started,
                                    "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
