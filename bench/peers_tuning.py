"""The tuner against TVM MetaSchedule, side by side: `python -m bench.peers_tuning [--trials 32 128] [--only NAME]`.

For each workload and trial budget, MetaSchedule (TVM 0.27, in the optional `bench` extra) and
looptool's tuner each tune it with one thread, pinned to one core, on a fresh database / study; each
records its wall time and its best time after every trial. Then both best kernels are checked against
float64 and timed interleaved with NumPy's BLAS (one thread) in this process. Writes
bench/results/peers_tuning.{json,md} and a chart of best-so-far against trials and against wall time
(peers_tuning.png). A workload whose peer is not installed is reported as such.

MetaSchedule's database file gives each record's run time in the order measured, but no clock: its
best-so-far against wall time spreads the trials evenly over the tuning's wall time (looptool's too).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

import looptool as lt

from .peers import cpu_name
from .timing import interleaved

HERE = Path(__file__).parent
# (name, m, k, n) of C[m, n] = sum_k A[m, k] * B[k, n], float32: the square and odd orders, and
# a tall-skinny one
MATMULS = (("matmul 512³", 512, 512, 512), ("matmul 257×511×129", 257, 511, 129),
           ("matmul 257×129×511", 257, 129, 511), ("matmul 4096×64×64 (tall-skinny)", 4096, 64, 64))


def tvm_available() -> str | None:
    """TVM's version, or None where it is not installed."""
    try:
        import tvm
    except ImportError:
        return None
    return tvm.__version__


def pin_to_one_core() -> int:
    """Run this process (and the workers it starts) on one core; returns it."""
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def metaschedule(m: int, k: int, n: int, trials: int, seed: int = 0) -> dict:
    """Tune the matmul with MetaSchedule (one core, LLVM for this CPU); its compiled best, wall time
    and best-so-far per trial."""
    import llvmlite.binding as llvm
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    func = te.create_prim_func([a, b, c])
    target = tvm.target.Target({"kind": "llvm", "mcpu": llvm.get_host_cpu_name(), "num-cores": 1})
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        database = ms.tune_tir(func, target, work, max_trials_global=trials, num_trials_per_iter=16,
                               num_tuning_cores=1, seed=seed)
        schedule = ms.tir_integration.compile_tir(database, func, target)
        # the JSON database's file holds the records in the order they were measured (its API sorts them)
        lines = (Path(work) / "database_tuning_record.json").read_text().splitlines()
        seconds = [float(np.mean([float(x) for x in json.loads(line)[1][1]])) for line in lines]
    library = tvm.compile(schedule.mod, target=target)
    wall = time.perf_counter() - start
    return {"library": library, "wall_s": wall, "trial_seconds": seconds}


def looptool_tuned(m: int, k: int, n: int, trials: int, seed: int = 0) -> dict:
    """Tune the matmul with looptool's tuner (one thread, a fresh study); its best kernel, wall time and
    best-so-far per trial."""
    import optuna
    import tuner
    sm, sk, sn = lt.symbols("m k n")
    a, b = lt.Tensor(np.zeros((m, k), np.float32)).to(sm, sk), lt.Tensor(np.zeros((k, n), np.float32)).to(sk, sn)
    c = (a * b).sum(sk)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        result = tuner.tune(c, trials=trials, storage=f"sqlite:///{work}/study.sqlite", seed=seed, progress=False,
                            record=False, threads=1)
        done = [t for t in result.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        seconds = [t.value for t in sorted(done, key=lambda t: t.number)]
    wall = time.perf_counter() - start
    return {"kernel": lt.Kernel(result.best_tree, 1), "wall_s": wall, "trial_seconds": seconds}


def best_so_far(seconds: list[float]) -> list[float]:
    return [min(seconds[:i + 1]) for i in range(len(seconds))]


def compare(name: str, m: int, k: int, n: int, trials: int) -> dict:
    """One row: both tuners at `trials`, their best kernels timed next to NumPy, checked against float64."""
    from threadpoolctl import threadpool_limits
    import tvm
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    reference = a.astype(np.float64) @ b
    ms_run = metaschedule(m, k, n, trials)
    lt_run = looptool_tuned(m, k, n, trials)
    device = tvm.cpu()
    ta, tb = tvm.runtime.tensor(a, device), tvm.runtime.tensor(b, device)
    tc = tvm.runtime.tensor(np.zeros((m, n), np.float32), device)
    out = np.empty((m, n), np.float32)
    ms_run["library"](ta, tb, tc)
    scale = np.abs(reference).max()
    errors = {"metaschedule": float(np.abs(tc.numpy() - reference).max() / scale),
              "looptool": float(np.abs(lt_run["kernel"]([a, b], out=out) - reference).max() / scale),
              "between_them": float(np.abs(out - tc.numpy()).max() / scale)}     # 0: both summed k in order
    with threadpool_limits(1):
        timings = interleaved([lambda: lt_run["kernel"]([a, b], out=out), lambda: ms_run["library"](ta, tb, tc),
                               lambda: a @ b], budget=4.0)
    lt_s, ms_s, numpy_s = (t.median for t in timings)
    flops = 2.0 * m * k * n
    return {"workload": name, "trials": trials, "rel_error": errors,
            "seconds": {"looptool": lt_s, "metaschedule": ms_s, "numpy": numpy_s},
            "looptool_x_metaschedule": ms_s / lt_s, "looptool_x_numpy": numpy_s / lt_s,
            "metaschedule_x_numpy": numpy_s / ms_s,
            "wall_s": {"looptool": lt_run["wall_s"], "metaschedule": ms_run["wall_s"]},
            "best_gflops": {who: [flops / s / 1e9 for s in best_so_far(run["trial_seconds"])]
                            for who, run in (("looptool", lt_run), ("metaschedule", ms_run))}}


def table(rows: list[dict], header: str) -> str:
    lines = [header, "", "| workload | trials | looptool / MetaSchedule | looptool / NumPy | MetaSchedule / NumPy | "
             "tuning wall s (looptool, MetaSchedule) | rel. error (looptool, MS) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        if "missing" in row:
            lines.append(f"| {row['workload']} | {row['trials']} | {row['missing']} | | | | |")
            continue
        wall, err = row["wall_s"], row["rel_error"]
        lines.append(f"| {row['workload']} | {row['trials']} | {row['looptool_x_metaschedule']:.2f} | "
                     f"{row['looptool_x_numpy']:.2f} | {row['metaschedule_x_numpy']:.2f} | "
                     f"{wall['looptool']:.0f}, {wall['metaschedule']:.0f} | "
                     f"{err['looptool']:.1e}, {err['metaschedule']:.1e} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    measured = [row for row in rows if "best_gflops" in row]
    if not measured:
        return
    fig, axes = plt.subplots(len(measured), 2, figsize=(11, 3.2 * len(measured)), squeeze=False)
    for (by_trial, by_wall), row in zip(axes, measured):
        for who, style in (("looptool", "-"), ("metaschedule", "--")):
            gflops = row["best_gflops"][who]
            by_trial.plot(range(1, len(gflops) + 1), gflops, style, label=who)
            wall = row["wall_s"][who]
            by_wall.plot([wall * (i + 1) / len(gflops) for i in range(len(gflops))], gflops, style, label=who)
        by_trial.set_title(f"{row['workload']}, {row['trials']} trials")
        by_trial.set_xlabel("trials")
        by_wall.set_xlabel("wall seconds (trials spread evenly)")
        by_trial.set_ylabel("best GFLOP/s so far")
        by_trial.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[32])
    parser.add_argument("--only", default="", help="workloads whose name contains this")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    cpu = cpu_name()                 # before pinning: it counts the cores this process may use
    core = pin_to_one_core()
    version = tvm_available()
    rows = []
    for name, m, k, n in MATMULS:
        if args.only not in name:
            continue
        for trials in args.trials:
            if version is None:
                rows.append({"workload": name, "trials": trials,
                             "missing": "TVM not installed (pip install '.[bench]')"})
                continue
            rows.append(compare(name, m, k, n, trials))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "best_gflops"}), flush=True)
    header = (f"looptool's tuner against TVM {version} MetaSchedule on {cpu}, one thread each, pinned to core "
              f"{core}; best kernels timed interleaved with NumPy (one thread); a / b is b's time over a's "
              f"(above 1: a is faster)")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peers_tuning.md").write_text(table(rows, header))
    (args.out / "peers_tuning.json").write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    plot(rows, args.out / "peers_tuning.png")
    print(table(rows, header))


if __name__ == "__main__":
    main()
