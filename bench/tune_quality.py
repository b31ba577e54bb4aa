"""How well does the tuner search?  `python -m bench.tune_quality [--trials N] [--seeds 0 1 2] [--workloads ...]`

Tunes matmul 512³, conv2d 1×64×56² 3×3, softmax 4096×1024 and layernorm 4096×1024 (float32,
one thread) with four samplers over the same space: random, Optuna's TPE, the cost-model
sampler cold (no transfer), and the cost-model sampler warm-started from the studies of the
other workloads (copied into a fresh storage first, so nothing of the workload itself is
seen).  No study starts with the automatic schedule (`--from-automatic` puts it back as trial
0), so every sampler starts cold from the same space and the figures measure its search.
Every run measures in the same kind of isolated worker.

At the end, every schedule any run measured and the automatic schedule are measured again side
by side in this process, in interleaved rounds, so load on the machine moves them alike; every
figure comes from these times, not from the trials' own (taken at different times and loads).
The fastest is the workload's "best known" time.  Per run it reports the trials and wall seconds
(from the first trial's start) until a trial's schedule is within 0.9x and 0.95x of the best
known time, the run's best schedule against it, and the median per-trial overhead (everything
but the timed runs).  Per workload it reports the cost model's ranking quality:
Spearman's correlation between predicted and measured speed on the random studies' trials (held
out), with the model trained on every other study of the run ("within"), and trained on the
other workloads' studies only ("transfer": what a warm start knows).
Writes bench/results/tune_quality.json, .md and .png (best-so-far against trials; `--output` names them); `--keep DIR`
keeps the study storages there, and `--summarize DIR` (with the same --trials, --seeds and
--workloads) re-measures and writes the results of such a run again without tuning.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import optuna

import looptool as lt
from bench import workloads as bench_workloads
from looptool import autoschedule, ir, runtime
from looptool.analysis.target import host
from looptool.schedule import LoopTree, Schedule
from tuner import costmodel
from tuner import study as tuner_study

HERE = Path(__file__).parent
WORKLOADS = ("matmul_512", "conv2d", "softmax", "layernorm")
SAMPLERS = ("random", "tpe", "costmodel-cold", "costmodel-warm")
TARGETS = (0.9, 0.95)
COMPLETE = optuna.trial.TrialState.COMPLETE
REMEASURE_ROUNDS = 5        # interleaved rounds of the final side-by-side measurement


def tensor_of(name: str) -> lt.Tensor:
    """The benchmark workload's tensor, on seed-0 inputs."""
    work = next(w for w in bench_workloads.WORKLOADS if w.name == name)
    return work.build(work.inputs(np.random.default_rng(0)))


def measured(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The study's measured trials, in trial order."""
    return sorted((t for t in study.trials if t.state == COMPLETE), key=lambda t: t.number)


def first_reaching(study: optuna.Study, seconds_of: dict[str, float], target: float) -> tuple[int | None, float | None]:
    """(1-based trial number, wall seconds since the first trial began) of the first trial whose
    schedule's re-measured time (`seconds_of`, by schedule JSON) is at most `target`; (None, None)
    when none is."""
    start = min(t.datetime_start for t in study.trials)
    for trial in measured(study):
        if seconds_of[trial.user_attrs["schedule"]] <= target:
            return trial.number + 1, (trial.datetime_complete - start).total_seconds()
    return None, None


def tune_run(tensor, storage: str, name: str, sampler: str, seed: int, trials: int, repeats: int,
             from_automatic: bool) -> optuna.Study:
    """One tuning run; 'costmodel-cold' and 'costmodel-warm' are the cost-model sampler without and
    with transfer."""
    kind = sampler.split("-")[0]
    result = tuner_study.tune(tensor, trials=trials, storage=storage, study_name=name, sampler=kind, seed=seed,
                              repeats=repeats, progress=False, record=False, transfer=sampler == "costmodel-warm",
                              from_automatic=from_automatic)
    return result.study


def ranking_quality(runs: dict, name: str, transfer: bool) -> float | None:
    """Spearman correlation of predicted and measured speed on the trials of workload `name`'s random
    studies (every seed), with the model trained on every other study of the run (`transfer`: on
    the other workloads' studies only)."""
    from scipy.stats import spearmanr
    train = costmodel.TrainingSet()
    held_out = []
    for (workload, sampler, _), study in runs.items():
        if workload == name and sampler == "random":
            held_out += [t for t in measured(study) if t.user_attrs.get("features")]
        elif workload != name or not transfer:
            train.add_study(study.trials)
    predicted = costmodel.CostModel().fit(train).predict([t.user_attrs["features"] for t in held_out])
    if predicted is None or len(held_out) < 3 or len(set(predicted)) < 2:
        return None
    return float(spearmanr(predicted, [-math.log(t.value) for t in held_out]).statistic)


def run(names: list[str], trials: int, seeds: list[int], repeats: int, keep: str | None = None,
        from_automatic: bool = False, samplers: tuple[str, ...] = SAMPLERS) -> dict:
    """Every workload with every sampler of `samplers` and seed; the warm runs last, from the others'
    studies."""
    cold = [s for s in SAMPLERS[:3] if s in samplers]
    lt.set_num_threads(1)
    runs: dict[tuple[str, str, int], optuna.Study] = {}
    with contextlib.nullcontext(keep) if keep else tempfile.TemporaryDirectory() as tmp:
        for name in names:
            storage = storage_url(tmp, name)
            for sampler in cold:
                for seed in seeds:
                    runs[name, sampler, seed] = tune_run(tensor_of(name), storage, f"{sampler}-{seed}", sampler,
                                                         seed, trials, repeats, from_automatic)
                    print(name, sampler, seed, runs[name, sampler, seed].best_value, flush=True)
        for name in names if "costmodel-warm" in samplers else ():
            warm = storage_url(tmp, name, warm=True)
            for other in names:
                for sampler in cold:
                    for seed in seeds:
                        if other != name:
                            optuna.copy_study(from_study_name=f"{sampler}-{seed}",
                                              from_storage=storage_url(tmp, other), to_storage=warm,
                                              to_study_name=f"{other}-{sampler}-{seed}")
            for seed in seeds:
                runs[name, "costmodel-warm", seed] = tune_run(tensor_of(name), warm, f"costmodel-warm-{seed}",
                                                              "costmodel-warm", seed, trials, repeats, from_automatic)
                print(name, "costmodel-warm", seed, runs[name, "costmodel-warm", seed].best_value, flush=True)
        return summarize(names, runs, trials, seeds, repeats)


def load_runs(directory: str, names: list[str], seeds: list[int], samplers: tuple[str, ...] = SAMPLERS) -> dict:
    """The studies of a run kept with --keep, as `run` holds them."""
    runs = {}
    for name in names:
        for sampler in samplers:
            for seed in seeds:
                storage = storage_url(directory, name, warm=sampler == "costmodel-warm")
                runs[name, sampler, seed] = optuna.load_study(study_name=f"{sampler}-{seed}", storage=storage)
    return runs


def storage_url(directory: str, name: str, warm: bool = False) -> str:
    """The SQLite storage of a workload's studies in a run's directory (the warm-started ones apart,
    with the other workloads' studies copied in)."""
    return f"sqlite:///{directory}/{'warm-' if warm else ''}{name}.sqlite"


def remeasure(name: str, schedules: dict[str, str | None], repeats: int) -> dict[str, float]:
    """Seconds of each schedule (JSON; None: the automatic schedule), compiled once and timed side by
    side in this process: REMEASURE_ROUNDS rounds, each running every schedule `repeats` times after
    a warm-up run; the fastest round's median (a round of a few hundred schedules takes long enough
    for the load of a shared machine to change within it, and load only slows a kernel down)."""
    program, arrays = ir.lower(tensor_of(name).node)
    kernels = {}
    for label, text in schedules.items():
        tree = autoschedule.auto_tree(program, host().with_cores(1)) if text is None else \
            LoopTree(program, Schedule.from_json(text, program))
        kernels[label] = runtime.Kernel(tree, 1)
    rounds: dict[str, list[float]] = {label: [] for label in kernels}
    for _ in range(REMEASURE_ROUNDS):
        for label, kernel in kernels.items():
            kernel(arrays)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                kernel(arrays)
                times.append(time.perf_counter() - start)
            rounds[label].append(statistics.median(times))
    return {label: min(medians) for label, medians in rounds.items()}


def remeasured_times(name: str, runs: dict, repeats: int) -> dict[str, float]:
    """Re-measured seconds of every schedule any run of workload `name` measured (by schedule JSON)
    and of the automatic schedule ('automatic'), all side by side."""
    schedules: dict[str, str | None] = {"automatic": None}
    for (workload, _, _), study in runs.items():
        if workload == name:
            schedules.update((t.user_attrs["schedule"], t.user_attrs["schedule"]) for t in measured(study))
    return remeasure(name, schedules, repeats)


def summarize(names, runs, trials, seeds, repeats) -> dict:
    """Rows per run, medians per workload and sampler, ranking quality per workload; every figure
    from the re-measured times of the trials' schedules."""
    rows, curves, quality, known = [], {}, {}, {}
    for name in names:
        seconds_of = remeasured_times(name, runs, repeats)
        best = min(seconds_of.values())
        known[name] = {"best_seconds": best, "automatic_seconds": seconds_of["automatic"],
                       "automatic_fraction": best / seconds_of["automatic"], "schedules": len(seconds_of)}
        quality[name] = {"within": ranking_quality(runs, name, False),
                         "transfer": ranking_quality(runs, name, True) if len(names) > 1 else None}
        for (workload, sampler, seed), study in runs.items():
            if workload != name:
                continue
            key = f"{name}/{sampler}/{seed}"
            curves[key] = [best / b if b < math.inf else 0.0 for b in tuner_study.best_so_far(study, lambda t: seconds_of[t.user_attrs["schedule"]])]
            row = {"workload": name, "sampler": sampler, "seed": seed, "best_trial_seconds": study.best_value,
                   "fraction_of_best": max(curves[key], default=0.0)}
            for target in TARGETS:
                row[f"trials_to_{target}"], row[f"seconds_to_{target}"] = first_reaching(study, seconds_of,
                                                                                         best / target)
            overheads = [t.user_attrs["overhead_seconds"] for t in study.trials if "overhead_seconds" in t.user_attrs]
            row["median_overhead_seconds"] = statistics.median(overheads) if overheads else None
            rows.append(row)
    return {"trials": trials, "seeds": seeds, "runs": rows, "curves": curves, "spearman": quality,
            "best_known": known}


def median_trials(data: dict, workload: str, sampler: str, target: float) -> float:
    """Median trials to reach `target` over seeds; runs that never reach it count as trials + 1."""
    reached = [r[f"trials_to_{target}"] or data["trials"] + 1 for r in data["runs"]
               if r["workload"] == workload and r["sampler"] == sampler]
    return statistics.median(reached)


def to_markdown(data: dict) -> str:
    """The run's setting, the best known times, the per-run table, then median trials to each target
    per workload and sampler with the Spearman correlations, and the median overheads."""
    def cell(value, fmt):
        return "-" if value is None else format(value, fmt)
    start = "the automatic schedule as trial 0" if data.get("from_automatic") else "no automatic trial 0"
    lines = [f"float32, 1 thread; {data['trials']} trials per run, seeds {data['seeds']}, {start}; "
             f"{data.get('wall_seconds', 0) / 60:.0f} min; load average {data.get('load', '?')}; every schedule "
             f"a run measured, and the automatic one, re-measured side by side (fastest of {REMEASURE_ROUNDS} rounds' "
             "medians); targets "
             "are fractions of the fastest (the best known time)", "",
             "| workload | schedules re-measured | best known ms | automatic ms | automatic / best known |",
             "| --- | ---: | ---: | ---: | ---: |"]
    workloads = sorted({r["workload"] for r in data["runs"]}, key=WORKLOADS.index)
    samplers = [s for s in SAMPLERS if any(r["sampler"] == s for r in data["runs"])]
    for name in workloads:
        known = data["best_known"][name]
        lines.append(f"| {name} | {known['schedules']} | {known['best_seconds'] * 1e3:.3f} "
                     f"| {known['automatic_seconds'] * 1e3:.3f} "
                     f"| {known['automatic_fraction']:.2f} |")
    lines += ["", "| workload | sampler | seed | best / best known | trials to 0.9x | s to 0.9x "
              "| trials to 0.95x | s to 0.95x | median overhead s |",
              "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in data["runs"]:
        lines.append(f"| {r['workload']} | {r['sampler']} | {r['seed']} | {r['fraction_of_best']:.2f} "
                     f"| {cell(r['trials_to_0.9'], 'd')} | {cell(r['seconds_to_0.9'], '.0f')} "
                     f"| {cell(r['trials_to_0.95'], 'd')} | {cell(r['seconds_to_0.95'], '.0f')} "
                     f"| {cell(r['median_overhead_seconds'], '.2f')} |")
    lines += ["", f"median trials to reach the target (never reached counts as {data['trials'] + 1}); Spearman on "
              "held-out random trials, model trained within the run / on the other workloads only:", "",
              "| workload | " + " | ".join(f"{s} 0.9x / 0.95x" for s in samplers) + " | Spearman within / transfer |",
              "| --- | " + " | ".join("---" for _ in samplers) + " | --- |"]
    for name in workloads:
        cells = [f"{median_trials(data, name, s, 0.9):g} / {median_trials(data, name, s, 0.95):g}" for s in samplers]
        rho = data["spearman"][name]
        lines.append(f"| {name} | " + " | ".join(cells) +
                     f" | {cell(rho['within'], '.2f')} / {cell(rho['transfer'], '.2f')} |")
    lines += ["", "median per-trial overhead in seconds (median over the runs' medians):", "",
              "| workload | " + " | ".join(samplers) + " |", "| --- | " + " | ".join("---" for _ in samplers) + " |"]
    for name in workloads:
        cells = [cell(median_overhead(data, name, s), ".3f") for s in samplers]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def median_overhead(data: dict, workload: str, sampler: str) -> float | None:
    """Median over seeds of a run's median per-trial overhead."""
    values = [r["median_overhead_seconds"] for r in data["runs"] if r["workload"] == workload and
              r["sampler"] == sampler and r["median_overhead_seconds"] is not None]
    return statistics.median(values) if values else None


def plot(data: dict, path: Path) -> Path:
    """Best-so-far (as a fraction of the best known time) against trials, one panel per workload; the
    dashed line is the automatic schedule."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    workloads = sorted({r["workload"] for r in data["runs"]}, key=WORKLOADS.index)
    fig, axes = plt.subplots(1, len(workloads), figsize=(4 * len(workloads), 3.4), squeeze=False)
    colors = dict(zip(SAMPLERS, ("tab:gray", "tab:blue", "tab:orange", "tab:green")))
    for ax, name in zip(axes[0], workloads):
        for key, curve in data["curves"].items():
            workload, sampler, _ = key.split("/")
            if workload == name:
                ax.plot(range(1, len(curve) + 1), curve, color=colors[sampler], label=sampler, alpha=0.8)
        ax.axhline(data["best_known"][name]["automatic_fraction"], color="black", linestyle="--", linewidth=1)
        ax.set_title(name)
        ax.set_xlabel("trials")
        ax.set_ylim(0, 1.05)
    axes[0][0].set_ylabel("best so far / best known")
    handles, labels = axes[0][0].get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    fig.legend(unique.values(), unique.keys(), loc="lower center", ncol=len(unique))
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv=None):
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=SAMPLERS,
                        help="costmodel-warm needs the others' studies: it learns from those that ran")
    parser.add_argument("--from-automatic", action="store_true",
                        help="start every study with the automatic schedule (trial 0), as `tune` does")
    parser.add_argument("--keep", metavar="DIR", help="keep the study storages in DIR (default: a temporary one)")
    parser.add_argument("--output", default="tune_quality", help="file name stem of the results in bench/results")
    parser.add_argument("--summarize", metavar="DIR", help="tune nothing: summarize the storages a --keep run left")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started, load = time.perf_counter(), os.getloadavg()[0]
    if args.summarize:
        runs = load_runs(args.summarize, args.workloads, args.seeds, tuple(args.samplers))
        data = summarize(args.workloads, runs, args.trials, args.seeds, args.repeats)
    else:
        if args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
        data = run(args.workloads, args.trials, args.seeds, args.repeats, args.keep, args.from_automatic,
                   tuple(args.samplers))
    data.update(from_automatic=args.from_automatic, wall_seconds=time.perf_counter() - started,
                load=f"{load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / f"{args.output}.json").write_text(json.dumps(data, indent=2))
    text = to_markdown(data)
    (out / f"{args.output}.md").write_text(text + "\n")
    print(text)
    print(f"plot: {plot(data, out / f'{args.output}.png')}")


if __name__ == "__main__":
    main()
