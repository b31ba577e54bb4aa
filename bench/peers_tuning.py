"""The tuner against TVM MetaSchedule, side by side: `python -m bench.peers_tuning [--trials 32 128]
[--threads 1 2] [--only NAME] [--most-trials-only NAME ...] [--most-trials-threads 1]
[--all-cores-only NAME ...]`.

The suite (`SUITE`, issue 29): matmuls (square, both odd orders, a tall-skinny one), a batched matmul, a
3×3 conv, softmax, layer norm and an attention head, each written for looptool (`bench.models`) and as
TE for MetaSchedule (`te_*` here). Each thread count runs in its own process (TVM's thread pool takes
its size once a process, from TVM_NUM_THREADS), pinned to that many cores. There, for each workload and
trial budget, MetaSchedule (TVM 0.27, in the optional `bench` extra; target `num-cores` and
`num_tuning_cores` the thread count) and looptool's tuner (a fresh study, `threads` the thread count)
each tune it; each records its wall time and its best time after every trial. Then both best kernels
are checked against float64 and timed interleaved (shuffled rounds) with NumPy: the matmuls, the
batched matmul and the attention head through BLAS held to the thread count (`Case.blas`), the others
as `bench.models` has them (one thread). Writes bench/results/peers_tuning.{json,md} and a chart of best-so-far against
trials and against wall time (peers_tuning.png). A workload whose peer is not installed is reported as
such. `--most-trials-only` runs the largest budget only on the workloads whose names contain one of
the given strings, `--most-trials-threads` only at the given thread counts (the others get the smaller
budgets); `--all-cores-only` runs the thread counts above one only on the workloads it names.

MetaSchedule's database file gives each record's run time in the order measured, but no clock: its
best-so-far against wall time spreads the trials evenly over the tuning's wall time (looptool's too).
"""
from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import models
from .peers import cpu_name, relative_error
from .peers_tuned import commit
from .timing import interleaved

HERE = Path(__file__).parent
EPS = models.EPS


# MetaSchedule's side: each workload as TE, inputs in the order of the workload's `inputs`, the result last
def te_matmul(m: int, k: int, n: int) -> list:
    """C[m, n] = sum_k A[m, k] B[k, n]."""
    from tvm import te
    a, b = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    return [a, b, te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")]


def te_batched_matmul(heads: int, positions: int, width: int) -> list:
    """S[h, s, t] = sum_d Q[h, s, d] K[h, t, d] (attention scores, q·kᵀ)."""
    from tvm import te
    q, k = (te.placeholder((heads, positions, width), name=name) for name in "QK")
    d = te.reduce_axis((0, width), name="d")
    return [q, k, te.compute((heads, positions, positions), lambda h, s, t: te.sum(q[h, s, d] * k[h, t, d], axis=d),
                             name="S")]


def te_conv3x3(channels: int, size: int, filters: int) -> list:
    """NCHW conv, 3×3 filters, padding 1, stride 1: Y[0, o, y, x] = sum X[0, c, y + i - 1, x + j - 1] W[o, c, i, j]."""
    from tvm import te, tirx
    x, w = te.placeholder((1, channels, size, size), name="X"), te.placeholder((filters, channels, 3, 3), name="W")
    padded = te.compute((1, channels, size + 2, size + 2), lambda n, c, y, z: tirx.if_then_else(
        tirx.all(y >= 1, y <= size, z >= 1, z <= size), x[n, c, y - 1, z - 1], tirx.const(0.0, "float32")),
        name="pad")
    c, i, j = te.reduce_axis((0, channels), "c"), te.reduce_axis((0, 3), "i"), te.reduce_axis((0, 3), "j")
    return [x, w, te.compute((1, filters, size, size), lambda n, o, y, z: te.sum(
        padded[n, c, y + i, z + j] * w[o, c, i, j], axis=[c, i, j]), name="Y")]


def _te_softmax_rows(te, scores, rows: int, cols: int) -> tuple:
    """exp(s - max) and its row sums of a (rows, cols) tensor."""
    j = te.reduce_axis((0, cols), name="jm")
    top = te.compute((rows,), lambda i: te.max(scores[i, j], axis=j), name="top")
    e = te.compute((rows, cols), lambda i, c: te.exp(scores[i, c] - top[i]), name="e")
    j2 = te.reduce_axis((0, cols), name="js")
    return e, te.compute((rows,), lambda i: te.sum(e[i, j2], axis=j2), name="total")


def te_softmax(rows: int, cols: int) -> list:
    """Row softmax exp(x - max) / sum(exp(x - max))."""
    from tvm import te
    x = te.placeholder((rows, cols), name="X")
    e, total = _te_softmax_rows(te, x, rows, cols)
    return [x, te.compute((rows, cols), lambda i, c: e[i, c] / total[i], name="Y")]


def te_layernorm(rows: int, cols: int) -> list:
    """Row layer norm (x - mean) / sqrt(var + 1e-5) * g + b."""
    from tvm import te
    x = te.placeholder((rows, cols), name="X")
    g, b = te.placeholder((cols,), name="G"), te.placeholder((cols,), name="B")
    j = te.reduce_axis((0, cols), name="j")
    total = te.compute((rows,), lambda i: te.sum(x[i, j], axis=j), name="total")
    d = te.compute((rows, cols), lambda i, c: x[i, c] - total[i] / cols, name="d")
    j2 = te.reduce_axis((0, cols), name="j2")
    squares = te.compute((rows,), lambda i: te.sum(d[i, j2] * d[i, j2], axis=j2), name="squares")
    return [x, g, b, te.compute((rows, cols), lambda i, c: d[i, c] / te.sqrt(squares[i] / cols + EPS) * g[c] + b[c],
                                name="Y")]


def te_attention(positions: int, width: int) -> list:
    """One head, softmax(q·kᵀ / sqrt(width))·v."""
    from tvm import te
    q, k, v = (te.placeholder((positions, width), name=name) for name in "QKV")
    d = te.reduce_axis((0, width), name="d")
    scale = 1.0 / math.sqrt(width)
    products = te.compute((positions, positions), lambda i, j: te.sum(q[i, d] * k[j, d], axis=d), name="QK")
    scores = te.compute((positions, positions), lambda i, j: products[i, j] * scale, name="S")
    e, total = _te_softmax_rows(te, scores, positions, positions)
    j = te.reduce_axis((0, positions), name="j")
    return [q, k, v, te.compute((positions, width), lambda i, c: te.sum(e[i, j] / total[i] * v[j, c], axis=j),
                                name="O")]


def attention_blas(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """One head's softmax(q·kᵀ / sqrt(width))·v with both products through BLAS."""
    scores = q @ k.T * np.float32(1.0 / math.sqrt(q.shape[1]))
    e = np.exp(scores - scores.max(1, keepdims=True))
    return (e / e.sum(1, keepdims=True)) @ v


@dataclass(frozen=True)
class Case:
    """A workload of the suite: its `bench.models` form (looptool, reference, NumPy baseline) and the
    same computation as TE for MetaSchedule."""

    workload: models.Workload
    te: Callable[[], list]
    blas: Callable[[dict], object] | None = None

    @property
    def name(self) -> str:
        return self.workload.title

    def baseline(self, threads: int) -> tuple[Callable[[dict], object], int]:
        """The NumPy baseline and the BLAS threads it gets in a `threads` row: the BLAS form where the case
        has one (on every thread), else the workload's own."""
        if self.blas:
            return self.blas, threads
        return self.workload.baseline, self.workload.baseline_threads(threads)


SUITE = (
    Case(models.matmul(512, 512, 512, target=None), lambda: te_matmul(512, 512, 512)),
    Case(models.matmul(257, 511, 129, target=None), lambda: te_matmul(257, 511, 129)),
    Case(models.matmul(257, 129, 511, target=None), lambda: te_matmul(257, 129, 511)),
    Case(models.matmul(4096, 64, 64, target=None, name="matmul_tall"), lambda: te_matmul(4096, 64, 64)),
    Case(models.batched_matmul(8, 256, 64), lambda: te_batched_matmul(8, 256, 64),
         lambda v: np.matmul(v["q"], v["k"].transpose(0, 2, 1))),
    Case(models.conv(32, 28, 64, 3), lambda: te_conv3x3(32, 28, 64)),
    Case(models.softmax(4096, 1024, 1), lambda: te_softmax(4096, 1024)),
    Case(models.layernorm(4096, 1024), lambda: te_layernorm(4096, 1024)),
    Case(models.attention(1, 512, 64), lambda: te_attention(512, 64), lambda v: attention_blas(v["q"], v["k"], v["v"])),
)


def tvm_available() -> str | None:
    """TVM's version, or None where it is not installed."""
    try:
        import tvm
    except ImportError:
        return None
    return tvm.__version__


def pin_to_cores(count: int) -> list[int]:
    """Run this process (and the workers it starts) on its first `count` allowed cores; returns them."""
    cores = sorted(os.sched_getaffinity(0))[:count]
    os.sched_setaffinity(0, set(cores))
    return cores


def metaschedule(case: Case, trials: int, threads: int, seed: int = 0) -> dict:
    """Tune the case with MetaSchedule (`threads` cores, LLVM for this CPU); its compiled best, wall time
    and best-so-far per trial."""
    import llvmlite.binding as llvm
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms
    func = te.create_prim_func(case.te())
    target = tvm.target.Target({"kind": "llvm", "mcpu": llvm.get_host_cpu_name(), "num-cores": threads})
    start = time.perf_counter()
    # A build worker first imports tvm.s_tir.tensor_intrin (about 34 s here, on a loaded core), which
    # counted against LocalBuilder's 30 s build timeout, so every build of a batch failed: its pool
    # does that import in the worker's initializer instead (no timeout), and still within the wall time.
    builder = ms.builder.LocalBuilder(max_workers=threads, initializer=functools.partial(
        importlib.import_module, "tvm.s_tir.tensor_intrin"))
    with tempfile.TemporaryDirectory() as work:
        database = ms.tune_tir(func, target, work, max_trials_global=trials, num_trials_per_iter=16,
                               builder=builder, num_tuning_cores=threads, seed=seed)
        schedule = ms.tir_integration.compile_tir(database, func, target)
        # the JSON database's file holds the records in the order they were measured (its API sorts them)
        lines = (Path(work) / "database_tuning_record.json").read_text().splitlines()
        seconds = [float(np.mean([float(x) for x in json.loads(line)[1][1]])) for line in lines]
    library = tvm.compile(schedule.mod, target=target)
    wall = time.perf_counter() - start
    return {"library": library, "wall_s": wall, "trial_seconds": seconds}


def looptool_tuned(tensor, trials: int, threads: int, seed: int = 0) -> dict:
    """Tune the tensor with looptool's tuner (`threads` cores, a fresh study); its best kernel, wall time
    and best-so-far per trial."""
    import optuna
    import tuner
    from looptool.runtime.cpu import Kernel
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        result = tuner.tune(tensor, trials=trials, storage=f"sqlite:///{work}/study.sqlite", seed=seed, progress=False,
                            record=False, threads=threads)
        done = [t for t in result.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        seconds = [t.value for t in sorted(done, key=lambda t: t.number)]
    wall = time.perf_counter() - start
    return {"kernel": Kernel(result.best_tree, threads), "wall_s": wall, "trial_seconds": seconds}


def best_so_far(seconds: list[float]) -> list[float]:
    """The lowest time after each trial."""
    return [min(seconds[:i + 1]) for i in range(len(seconds))]


def rate(workload: models.Workload) -> tuple[str, float]:
    """The chart's unit and the work a call does in it: GFLOP/s of `flops`, else GB/s of `bytes`."""
    return ("GFLOP/s", workload.flops) if workload.flops else ("GB/s", workload.bytes)


def compare(case: Case, trials: int, threads: int) -> dict:
    """One row: both tuners at `trials` on `threads` cores, their best kernels timed next to NumPy, checked
    against float64."""
    from threadpoolctl import threadpool_limits
    import tvm
    from looptool import ir
    workload = case.workload
    inputs = workload.inputs(np.random.default_rng(0))
    reference = workload.reference(inputs)
    tensor = workload.build(inputs)
    ms_run = metaschedule(case, trials, threads)
    lt_run = looptool_tuned(tensor, trials, threads)
    arrays = ir.lower(tensor.node)[1]
    device = tvm.cpu()
    given = [tvm.runtime.tensor(x, device) for x in inputs.values()]
    result = tvm.runtime.tensor(np.zeros(reference.shape, np.float32), device)
    ms_run["library"](*given, result)
    ours = workload.to_ref(lt_run["kernel"](arrays))
    errors = {"metaschedule": relative_error(result.numpy(), reference), "looptool": relative_error(ours, reference),
              "between_them": relative_error(ours, result.numpy())}     # 0: both summed in the same order
    baseline, blas_threads = case.baseline(threads)
    errors["numpy"] = relative_error(np.asarray(baseline(inputs)), reference)
    with threadpool_limits(blas_threads):
        timings = interleaved([lambda: lt_run["kernel"](arrays), lambda: ms_run["library"](*given, result),
                               lambda: baseline(inputs)], budget=4.0, shuffle=True)
    lt_s, ms_s, numpy_s = (t.median for t in timings)
    unit, work = rate(workload)
    return {"workload": case.name, "threads": threads, "trials": trials, "rel_error": errors,
            "seconds": {"looptool": lt_s, "metaschedule": ms_s, "numpy": numpy_s},
            "numpy_threads": blas_threads,
            "looptool_x_metaschedule": ms_s / lt_s, "looptool_x_numpy": numpy_s / lt_s,
            "metaschedule_x_numpy": numpy_s / ms_s,
            "wall_s": {"looptool": lt_run["wall_s"], "metaschedule": ms_run["wall_s"]},
            "unit": unit, "best_rate": {who: [work / s / 1e9 for s in best_so_far(run["trial_seconds"])]
                                        for who, run in (("looptool", lt_run), ("metaschedule", ms_run))}}


def budgets(case: Case, trials: list[int], threads: int, most_only: list[str],
            most_threads: list[int]) -> list[int]:
    """The trial budgets a case runs on `threads` cores: all of them, or all but the largest where
    `most_only` names other cases or `most_threads` other thread counts."""
    if (not most_only or named(case, most_only)) and (not most_threads or threads in most_threads):
        return trials
    return [t for t in trials if t != max(trials)]


def named(case: Case, names: list[str]) -> bool:
    """Whether the case's name or title contains one of `names`."""
    return any(name in case.workload.name or name in case.name for name in names)


def child(threads: int, trials: list[int], only: str, most_only: list[str], most_threads: list[int],
          all_cores_only: list[str]) -> list[dict]:
    """The rows of one thread count, in this process (pinned to `threads` cores); above one thread, only
    the cases `all_cores_only` names (all where it names none)."""
    version = tvm_available()
    rows = []
    for case in SUITE:
        if not named(case, [only]) or threads > 1 and all_cores_only and not named(case, all_cores_only):
            continue
        for budget in budgets(case, trials, threads, most_only, most_threads):
            if version is None:
                rows.append({"workload": case.name, "threads": threads, "trials": budget,
                             "missing": "TVM not installed (pip install '.[bench]')"})
                continue
            rows.append(compare(case, budget, threads))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "best_rate"}), flush=True)
    return rows


def run_child(threads: int, args) -> list[dict]:
    """Run `child` for one thread count in a fresh process (its TVM thread pool that size); its rows."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, "-m", "bench.peers_tuning", "--child", str(threads), "--child-out", out.name,
                   "--trials", *map(str, args.trials), "--only", args.only,
                   "--most-trials-only", *args.most_trials_only,
                   "--most-trials-threads", *map(str, args.most_trials_threads),
                   "--all-cores-only", *args.all_cores_only]
        subprocess.run(command, check=True, cwd=HERE.parent, env=dict(os.environ, TVM_NUM_THREADS=str(threads)))
        return json.loads(Path(out.name).read_text())


def table(rows: list[dict], header: str) -> str:
    """The markdown table of the rows."""
    lines = [header, "", "| workload | threads | trials | looptool / MetaSchedule | looptool / NumPy | "
             "MetaSchedule / NumPy | tuning wall s (looptool, MetaSchedule) | rel. error (looptool, MS) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        if "missing" in row:
            lines.append(f"| {row['workload']} | {row['threads']} | {row['trials']} | {row['missing']} | | | | |")
            continue
        wall, err = row["wall_s"], row["rel_error"]
        lines.append(f"| {row['workload']} | {row['threads']} | {row['trials']} | "
                     f"{row['looptool_x_metaschedule']:.2f} | {row['looptool_x_numpy']:.2f} | "
                     f"{row['metaschedule_x_numpy']:.2f} | "
                     f"{wall['looptool']:.0f}, {wall['metaschedule']:.0f} | "
                     f"{err['looptool']:.1e}, {err['metaschedule']:.1e} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path):
    """Best-so-far against trials and against wall time, a row of two panels a table row."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    measured = [row for row in rows if "best_rate" in row]
    if not measured:
        return
    fig, axes = plt.subplots(len(measured), 2, figsize=(11, 2.6 * len(measured)), squeeze=False)
    for (by_trial, by_wall), row in zip(axes, measured):
        for who, style in (("looptool", "-"), ("metaschedule", "--")):
            best = row["best_rate"][who]
            by_trial.plot(range(1, len(best) + 1), best, style, label=who)
            wall = row["wall_s"][who]
            by_wall.plot([wall * (i + 1) / len(best) for i in range(len(best))], best, style, label=who)
        by_trial.set_title(f"{row['workload']}, {row['threads']} thread(s), {row['trials']} trials", fontsize=9)
        by_trial.set_xlabel("trials")
        by_wall.set_xlabel("wall seconds (trials spread evenly)")
        by_trial.set_ylabel(f"best {row['unit']} so far")
        by_trial.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main(argv=None):
    """The command line (the module docstring): each thread count's rows in a child process, then the
    table, JSON and chart."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[32])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, len(os.sched_getaffinity(0))])
    parser.add_argument("--only", default="", help="workloads whose name contains this")
    parser.add_argument("--most-trials-only", nargs="*", default=[],
                        help="run the largest --trials budget only on workloads whose names contain one of these")
    parser.add_argument("--most-trials-threads", type=int, nargs="*", default=[],
                        help="run the largest --trials budget only at these thread counts")
    parser.add_argument("--all-cores-only", nargs="*", default=[],
                        help="above one thread, run only the workloads whose names contain one of these")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        pin_to_cores(args.child)
        args.child_out.write_text(json.dumps(child(args.child, args.trials, args.only, args.most_trials_only,
                                                       args.most_trials_threads, args.all_cores_only)))
        return
    cpu = cpu_name()
    rows = [row for threads in dict.fromkeys(args.threads) for row in run_child(threads, args)]
    header = (f"looptool's tuner (commit {commit()}) against TVM {tvm_available()} MetaSchedule on {cpu}; each "
              f"thread count in its own process pinned to that many cores; best kernels timed interleaved with "
              f"NumPy (matmuls, batched matmul and attention through BLAS held to the thread count; softmax, layer "
              f"norm and the conv's im2col + BLAS on one thread); "
              f"a / b is b's time over a's (above 1: a is faster)")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peers_tuning.md").write_text(table(rows, header))
    (args.out / "peers_tuning.json").write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    plot(rows, args.out / "peers_tuning.png")
    print(table(rows, header))


if __name__ == "__main__":
    main()
