"""Tuning a computation with Optuna: studies, trials, persistence and the result.

`tune(tensor)` derives the search space from the tensor's loop tree, starts a new
study from the automatic schedule for this CPU, measures every legal drawn
schedule in an isolated worker, and records the best schedule
in looptool's tuning database so later `.numpy()` calls use it.  Studies live in
any Optuna storage; the embedded default is the SQLite file
`~/.cache/looptool/studies.sqlite` (or `$LOOPTOOL_STORAGE`).  `trials` is the
size the study should reach, so re-running a stopped study finishes it.
"""
from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing as mp
import os
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import optuna

from looptool.autoschedule import gpu_rules
from looptool import ir
from looptool.codegen import cpu as codegen_cpu
from looptool.runtime import gpu as runtime_gpu
from looptool.runtime import ptx_cache
from looptool.runtime import tuning_db
from looptool.schedule import LoopTree, Schedule

from . import costmodel, scheduler, space
from .retrying import RetryingStorage
from .worker import MeasureError, Measurer, WorkerLost, lowered, measured_sizes

log = logging.getLogger("looptool.tuner")
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
# A GPU study keeps its best drawn schedule only where, timed again beside the automatic one this many times
# each, its median is faster by more than KEEP_MARGIN. H100, session 25, 64 trials: bf16 4096^3 with a bf16
# result kept a drawn schedule its trial timed faster, then 0.93x torch against 1.02x untuned.
CONFIRM_ROUNDS = 3
KEEP_MARGIN = 0.01


class TrialFailed(RuntimeError):
    """Raised inside the objective for a trial that compiled wrongly, crashed or timed out."""


def default_storage() -> str:
    """The study storage URL used when none is given."""
    if os.environ.get("LOOPTOOL_STORAGE"):
        return os.environ["LOOPTOOL_STORAGE"]
    path = Path.home() / ".cache" / "looptool" / "studies.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def make_storage(url: str | None):
    """An Optuna storage for a URL; RDB storages get heartbeats so killed trials are marked failed, SQLite
    files a write-ahead log (a trial's dozens of small writes cost about 1.5 ms each instead of 5), and
    database servers a wrapper that waits out an unreachable server (`retrying.RetryingStorage`)."""
    url = url or default_storage()
    if not url.startswith(("sqlite", "postgresql", "mysql")):
        return url
    import sqlalchemy.exc
    for attempt in range(5):
        try:
            storage = optuna.storages.RDBStorage(url, heartbeat_interval=5, grace_period=20,
                                                 engine_kwargs={"connect_args": {"timeout": 30}}
                                                 if url.startswith("sqlite") else {"pool_pre_ping": True})
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as err:
            # Processes creating the same fresh database race to create its tables and stamp its
            # schema version (UNIQUE constraint failed: alembic_version.version_num); the loser
            # finds them made on a second look.  Other errors (no server, bad login) are raised.
            if attempt == 4 or not isinstance(err, sqlalchemy.exc.IntegrityError) and \
                    "already exists" not in str(err):
                raise
            time.sleep(0.2 * (attempt + 1))
            continue
        if url.startswith("sqlite"):
            _write_ahead_log(storage.engine)
            return storage
        return RetryingStorage(storage)


def _write_ahead_log(engine):
    """Open every later connection of a SQLite engine in WAL mode with normal (not full) syncing: safe
    against killed processes, and several processes still share the file.  Each transaction begins
    IMMEDIATE, taking the write lock before it reads: Optuna claims a waiting trial by reading its state
    and then writing RUNNING (SELECT ... FOR UPDATE, which SQLite ignores), and pysqlite began the
    transaction only at the write, so two processes could both claim one trial and the second to finish
    it stopped with "Cannot tell a COMPLETE trial"."""
    import sqlalchemy

    @sqlalchemy.event.listens_for(engine, "connect")
    def _on_connect(connection, _record):
        connection.isolation_level = None          # no implicit BEGIN: _on_begin says how
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @sqlalchemy.event.listens_for(engine, "begin")
    def _on_begin(connection):
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    engine.dispose()


SAMPLERS = ("costmodel", "tpe", "random")


def make_sampler(name: str, seed: int | None, draw=None, threads: int = 1,
                 prior: costmodel.Prior | None = None, builder=None, centre: dict | None = None):
    """'costmodel' (the learned cost model ranks candidates from `draw`, trained first on `prior`, has
    `builder` compile each round's schedules ahead and ranks what the model cannot by closeness to
    `centre`, the automatic schedule's parameters), 'tpe' (multivariate, safe for parallel workers)
    or 'random'."""
    if name == "costmodel":
        return costmodel.CostModelSampler(draw, threads, seed, prior, builder, centre)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True,
                                          n_startup_trials=10)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r}; use one of {', '.join(SAMPLERS)}")


def study_name_for(program: ir.Program, threads: int, device: str = "cpu", sizes: dict | None = None) -> str:
    """Default study name: the workload, target and thread count (on a GPU the space's version,
    `space.GPU_SPACE_VERSION`), and for dynamic dims the sizes measured (`worker.measured_sizes`: a study's
    values are on the scale of its sizes)."""
    threads_part = f"-space{space.GPU_SPACE_VERSION}" if device == "gpu" else f"-t{threads}"
    points = measured_sizes(program, sizes) if program.dynamic else []
    sizes_part = "".join(f"-{dim}{','.join(str(p[dim]) for p in points)}" for dim, _ in program.dynamic)
    return f"{tuning_db.workload_key(program)}-{target_name(device)}{threads_part}{sizes_part}"


def target_name(device: str) -> str:
    """The tuning database's target: the host CPU, or the current GPU ('cuda-sm_90')."""
    if device == "gpu":
        return runtime_gpu.target_name()
    if device != "cpu":
        raise ValueError(f"unknown device {device!r}; use 'cpu' or 'gpu'")
    return codegen_cpu.HostTarget.get().name


@dataclass
class TuneResult:
    """What a tuning run found."""

    study: optuna.Study
    best_tree: LoopTree | None
    best_seconds: float
    default_seconds: float

    @property
    def speedup_over_default(self) -> float:
        return self.default_seconds / self.best_seconds

    def summary(self, baseline_seconds: float | None = None) -> str:
        """Best schedule as loop-tree text and the speed-ups, for printing."""
        states = [t.state for t in self.study.trials]
        counts = {s.name.lower(): states.count(s) for s in FINISHED}
        lines = [f"study {self.study.study_name}: {len(states)} trials ({counts['complete']} measured, "
                 f"{counts['pruned']} pruned as illegal or invalid, {counts['fail']} failed)"]
        overheads = [t.user_attrs["overhead_seconds"] for t in self.study.trials if "overhead_seconds" in t.user_attrs]
        if overheads:
            lines.append(f"per-trial overhead (all but the kernel runs): median {statistics.median(overheads):.3f} s")
        if self.best_tree is None:
            return "\n".join(lines + ["no schedule was measured"])
        points = self.study.user_attrs.get("measured_sizes")
        if points:
            sizes = "; ".join(f"{dim} = {', '.join(str(p[dim]) for p in points)}" for dim in points[0])
            lines.append(f"measured at {sizes}: times are the geometric mean over these sizes of seconds per row")
        lines += [f"best: {_time(self.best_seconds)}; default schedule: {_time(self.default_seconds)} "
                  f"(speed-up {self.speedup_over_default:.2f}x)"]
        if baseline_seconds:
            lines.append(f"NumPy: {_time(baseline_seconds)} (speed-up {baseline_seconds / self.best_seconds:.2f}x)")
        lines += ["best schedule:", str(self.best_tree)]
        return "\n".join(lines)


def _time(seconds: float) -> str:
    """Seconds in ms, or in µs or ns where that gives fewer zeros."""
    for unit, scale in (("ms", 1e3), ("µs", 1e6)):
        if seconds * scale >= 1:
            return f"{seconds * scale:.3f} {unit}"
    return f"{seconds * 1e9:.3f} ns"


class Objective:
    """Draws a schedule, rejects illegal ones before compiling, measures the rest."""

    def __init__(self, tree: LoopTree, measurer: Measurer, threads: int, inject_crash_at: set[int] = frozenset()):
        self.tree, self.measurer, self.threads, self.inject_crash_at = tree, measurer, threads, inject_crash_at

    def draw(self, trial: optuna.Trial) -> LoopTree:
        return draw_schedule(trial, self.tree, self.threads, self.measurer.device)

    def __call__(self, trial: optuna.Trial) -> float:
        started = time.perf_counter()
        try:
            tree = self.draw(trial)
        except space.InvalidDraw as err:
            trial.set_user_attr("rejected", f"invalid transform: {err}")
            raise optuna.TrialPruned(str(err)) from None
        legal, reason = tree.check()   # remembered: the sampler checked it when drawing
        trial.set_user_attr("schedule", tree.schedule.to_json())
        if not legal:
            trial.set_user_attr("rejected", reason)
            raise optuna.TrialPruned(reason)
        try:
            result = self.measurer.measure(tree.schedule.steps, inject_crash=trial.number in self.inject_crash_at)
        except MeasureError as err:
            trial.set_user_attr("failure", str(err))
            if isinstance(err, WorkerLost):
                log.warning("%s", err)
                trial.study.stop()          # this process's optimize loop ends after this trial
            raise TrialFailed(str(err)) from None
        seconds = study_seconds(trial.study, self.measurer, result)
        trial.set_user_attr("compile_seconds", result.compile_seconds)
        trial.set_user_attr("relative_error", result.relative_error)
        if result.yardstick_ratio is not None:
            trial.set_user_attr("yardstick_ratio", result.yardstick_ratio)
        if result.size_ratios is not None:
            trial.set_user_attr("size_ratios", result.size_ratios)
        if result.gpu is not None:
            trial.set_user_attr("gpu", result.gpu)
        trial.set_user_attr("features", costmodel.describe(tree, self.threads))
        trial.set_user_attr("overhead_seconds", time.perf_counter() - started - result.running_seconds)
        return seconds


def same_kernels(first: LoopTree, second: LoopTree, arch: str) -> bool:
    """Whether two loop trees lower to the same GPU kernels for `arch` (the same PTX and launches)."""
    modules = [ptx_cache.generate(tree, arch) for tree in (first, second)]
    return modules[0].ptx == modules[1].ptx and modules[0].launches == modules[1].launches


def faster_by_margin(drawn: list[float], automatic: list[float]) -> bool:
    """Whether the median of `drawn` times is below the median of `automatic` by more than KEEP_MARGIN."""
    return statistics.median(drawn) < statistics.median(automatic) * (1 - KEEP_MARGIN)


def study_seconds(study: optuna.Study, measurer: Measurer, result) -> float:
    """A measurement's seconds on its study's one scale: a CPU measurement's yardstick ratio times the
    yardstick time stored with the study (the first calibration any of its processes stored; this
    measurer's, stored now, where none is), read when the measurement is done, so that processes that
    started the study together use one scale from their first trial on; a GPU measurement as it is."""
    if result.yardstick_ratio is None:
        return result.seconds
    stored = study.user_attrs.get("yardstick_seconds")
    if stored is None:
        stored = measurer.yardstick_seconds
        study.set_user_attr("yardstick_seconds", stored)
    measurer.yardstick_seconds = stored
    return result.yardstick_ratio * stored


def draw_schedule(trial, tree: LoopTree, threads: int, device: str) -> LoopTree:
    """One schedule of the search space for `device`, drawn through the trial's suggestions."""
    if device == "gpu":
        return space.sample_gpu(trial, tree)
    return space.sample(trial, tree, threads)


class Tuning:
    """One study optimized in this process: its sampler, its measuring worker and its compile processes
    stay warm between calls to `run` (`tune_program` keeps one per kernel over its rounds)."""

    def __init__(self, node, storage_url: str, study_name: str, sampler: str = "costmodel", seed: int | None = None,
                 threads: int = 1, repeats: int = 10, device: str = "cpu", transfer: bool = True,
                 progress: bool = False, inject_crash_at: set[int] = frozenset(), sizes: dict | None = None,
                 gpu: int | None = None):
        self.node, self.storage_url, self.study_name = node, storage_url, study_name
        self.settings = {"sampler": sampler, "seed": seed, "threads": threads, "repeats": repeats, "device": device,
                         "transfer": transfer, "sizes": sizes, "gpu": gpu}
        self.program = lowered(node, device)[0]
        self.storage, self.device, self.progress = make_storage(storage_url), device, progress
        self.transfer = sampler == "costmodel" and transfer
        self.measurer = Measurer(node, repeats=repeats, threads=threads, seed=seed or 0, device=device, sizes=sizes,
                                 gpu=gpu)
        self.objective = Objective(LoopTree(self.program), self.measurer, threads, inject_crash_at)
        centre = space.automatic_params(self.program, threads) if device == "cpu" \
            else space.gpu_start_params(self.program)
        self.sampler = make_sampler(sampler, seed, self.objective.draw, threads, None, self.measurer,   # prior: run()
                                    centre)
        self.study = optuna.create_study(study_name=study_name, storage=self.storage, sampler=self.sampler,
                                         direction="minimize", load_if_exists=True)
        if self.program.dynamic:
            self._keep_sizes(measured_sizes(self.program, sizes))
        self.measurer.yardstick_seconds = self.study.user_attrs.get("yardstick_seconds")

    def _keep_sizes(self, points: list[dict[str, int]]):
        """Store the sizes a dynamic program's study measures at; a study that measured at others is
        refused (its values are on their scale)."""
        stored = self.study.user_attrs.get("measured_sizes")
        if stored is None:
            self.study.set_user_attr("measured_sizes", points)
        elif stored != points:
            raise ValueError(f"study {self.study_name} measured at sizes {stored}, not {points}: tune at those "
                             f"sizes, or name another study")

    def _prior(self) -> costmodel.Prior | None:
        if not self.transfer:
            return None
        return costmodel.prior_from_storage(self.storage, self.study_name, target_name(self.device), self.program)

    def helper(self, index: int, gpu: int | None = None) -> tuple[tuple, dict]:
        """Arguments of a `Tuning` of the same study for the index-th further process (its own seed; its
        own GPU where `gpu` is given, else this one's)."""
        seed = self.settings["seed"]
        return (self.node, self.storage_url, self.study_name), \
            dict(self.settings, seed=None if seed is None else seed + index + 1,
                 gpu=self.settings["gpu"] if gpu is None else gpu)

    def finished(self) -> int:
        """Finished trials of the study (from every process sharing it)."""
        return sum(t.state in FINISHED for t in self.study.get_trials(deepcopy=False))

    def run(self, trials: int, timeout: float | None = None):
        """Optimize until the study holds `trials` finished trials or `timeout` seconds pass; with
        transfer, the prior is read again first (only where other studies gained trials)."""
        if self.transfer:
            self.sampler.prior = self._prior()
        started = time.monotonic()
        while (remaining := trials - self.finished()) > 0:
            left = None if timeout is None else timeout - (time.monotonic() - started)
            if left is not None and left <= 0:
                return
            try:
                self.study.optimize(self.objective, n_trials=remaining, timeout=left, catch=(TrialFailed,),
                                    callbacks=[optuna.study.MaxTrialsCallback(trials, states=FINISHED)],
                                    show_progress_bar=self.progress)
                return
            except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as err:
                # another worker failed this one's running trial as stale (its heartbeats stopped while the
                # database was down): Optuna then refuses its attributes, or its result ("Cannot tell a FAIL
                # trial"); the result is dropped, the study goes on
                if not isinstance(err, optuna.exceptions.UpdateFinishedTrialError) and \
                        not str(err).startswith("Cannot tell a "):
                    raise
                log.warning("a trial was failed by another worker while this one measured it (%s); going on", err)

    def default_seconds(self) -> float:
        """The default schedule's time (on a GPU: one output per thread), measured once per study by
        this worker and kept as a study attribute."""
        if "default_seconds" not in self.study.user_attrs:
            steps = gpu_rules.default_gpu_tree(self.program).schedule.steps if self.device == "gpu" else []
            self.study.set_user_attr("default_seconds", study_seconds(self.study, self.measurer,
                                                                      self.measurer.measure(steps)))
        return self.study.user_attrs["default_seconds"]

    def automatic_seconds(self) -> float:
        """On a GPU, the automatic schedule's time (`runtime.gpu.automatic_tree`: the GPU space cannot draw
        it, as a CPU study draws its own first), measured once per study by this worker and kept as a study
        attribute: a tuned schedule is stored only where it beats it."""
        if "automatic_seconds" not in self.study.user_attrs:
            steps = runtime_gpu.automatic_tree(self.program).schedule.steps
            self.study.set_user_attr("automatic_seconds", study_seconds(self.study, self.measurer,
                                                                        self.measurer.measure(steps)))
        return self.study.user_attrs["automatic_seconds"]

    def beats_automatic(self, seconds: float, schedule: Schedule) -> bool:
        """On a GPU, whether the study's best schedule (`seconds` in its trial) beats the automatic one:
        faster in its trial, then in CONFIRM_ROUNDS measurements of each taken in turn, by more than
        KEEP_MARGIN on their medians (trials measured minutes apart differ by a few per cent on one GPU); never
        where it lowers to the automatic schedule's own kernels (`same_kernels`: then any gap is noise)."""
        if self.automatic_seconds() <= seconds:
            return False
        automatic_tree = runtime_gpu.automatic_tree(self.program)
        if same_kernels(LoopTree(self.program, schedule), automatic_tree, runtime_gpu.device_arch()):
            return False
        automatic = automatic_tree.schedule.steps
        times: dict[str, list[float]] = {"drawn": [], "automatic": []}
        for _ in range(CONFIRM_ROUNDS):
            times["drawn"].append(self.measurer.measure(schedule.steps).seconds)
            times["automatic"].append(self.measurer.measure(automatic).seconds)
        return faster_by_margin(times["drawn"], times["automatic"])

    def result(self, record: bool = True) -> TuneResult:
        """The best measured schedule (stored in the tuning database when `record`); on a GPU, the
        automatic schedule (nothing stored) where no trial beat it, so tuning never makes `.cuda()` slower."""
        study = self.study
        complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        if not complete:
            return TuneResult(study, None, float("inf"), self.default_seconds())
        best = min(complete, key=lambda t: t.value)
        schedule = Schedule.from_json(best.user_attrs["schedule"], self.program)
        if self.device == "gpu" and not self.beats_automatic(best.value, schedule):
            log.info("no trial beat the automatic schedule (%.4g s against %.4g s, timed again side by side): "
                     "nothing stored", best.value, self.automatic_seconds())
            return TuneResult(study, runtime_gpu.automatic_tree(self.program), self.automatic_seconds(),
                              self.default_seconds())
        if record:
            stored = tuning_db.store(self.program, target_name(self.device), schedule.to_json(), best.value,
                                     f"study {study.study_name}, trial {best.number}")
            log.info("best schedule %s in the tuning database", "stored" if stored else "not better than the one")
        return TuneResult(study, LoopTree(self.program, schedule), best.value, self.default_seconds())

    def close(self):
        """Stop the worker and the compile process."""
        self.measurer.__exit__()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _helper_job(args: tuple, settings: dict, trials: int, timeout: float | None):
    with Tuning(*args, **settings) as tuning:
        tuning.run(trials, timeout)


def open_tuning(tensor, storage: str | None = None, study_name: str | None = None, threads: int = 1,
                device: str = "cpu", from_automatic: bool = True, sizes: dict | None = None, **settings) -> Tuning:
    """Create (or resume) the tensor's study and open its `Tuning` (`settings` are its arguments).  A new
    study's first trial is the space's centre (`start_from_automatic`) unless not `from_automatic`
    (bench.tune_quality leaves it out so that every sampler starts cold). The default schedule is measured
    when the result is asked for (`Tuning.result`), so helper processes start and trials begin at once
    (`tune` on several GPUs measures it while its helpers start)."""
    program = lowered(tensor.node, device)[0]
    name = study_name or study_name_for(program, threads, device, sizes)
    tuning = Tuning(tensor.node, storage or default_storage(), name, threads=threads, device=device, sizes=sizes,
                    **settings)
    _describe_workload(tuning.study, program, target_name(device))
    if from_automatic and not tuning.study.trials:
        start_from_automatic(tuning.study, program, threads, device)
    return tuning


def tune(tensor, trials: int = 100, timeout: float | None = None, jobs: int = 1, record: bool = True,
         progress: bool = True, gpus: list[int] | None = None, **settings) -> TuneResult:
    """Search schedules for `tensor` with Optuna and return the best (and store it for `.numpy()`).

    `trials` is how many finished trials the study should hold; `jobs` worker processes share
    it through the storage.  `settings` are `open_tuning`'s and `Tuning`'s: storage, study_name,
    sampler ('costmodel', 'tpe' or 'random'), seed, threads (cores per kernel), repeats, device
    ('gpu': the GPU search space, kernels run on the current GPU through CuPy), transfer (the
    'costmodel' sampler learns from the storage's other studies for the same target too),
    sizes (a dynamic dim's sizes to measure at, {dim: [sizes]}; default `worker.DEFAULT_SIZES`: the
    study's value is the geometric mean of seconds per row over them), from_automatic,
    inject_crash_at (tests). `gpus` (device 'gpu'): one measuring process per GPU of the list, each
    pinned to its GPU, all on the one study (`jobs` is then their number); a GPU that fails fails its
    trials and the study goes on."""
    if gpus:
        if settings.get("device") != "gpu":
            raise ValueError(f"gpus={gpus} measures on GPUs: pass device='gpu' too")
        jobs, settings = len(gpus), dict(settings, gpu=gpus[0])
    with open_tuning(tensor, progress=progress, **settings) as tuning:
        helper_gpus = gpus[1:] if gpus else [None] * (jobs - 1)
        helpers = [mp.get_context("spawn").Process(target=_helper_job, args=tuning.helper(k, gpu) + (trials, timeout))
                   for k, gpu in enumerate(helper_gpus)]
        for proc in helpers:
            proc.start()
        if helpers and tuning.device == "gpu":
            # measured while the helpers start up, not after the last trial when the other GPUs idle
            tuning.default_seconds()
            tuning.automatic_seconds()
        tuning.run(trials, timeout)
        for proc in helpers:
            proc.join()
        return tuning.result(record)


def _describe_workload(study: optuna.Study, program: ir.Program, target: str):
    """Study attributes transfer looks for: the target, the program's structure and its sizes."""
    described = {"target": target, "structure": costmodel.structure_key(program), "sizes": dict(program.sizes)}
    for key, value in described.items():
        if study.user_attrs.get(key) != value:
            study.set_user_attr(key, value)


def start_from_automatic(study: optuna.Study, program: ir.Program, threads: int, device: str = "cpu") -> None:
    """Queue the space's centre as the study's first trial: the automatic schedule for this CPU, or on
    a GPU the default tensor-core schedule of a half-precision contraction (none for other programs)."""
    params = space.automatic_params(program, threads) if device == "cpu" else space.gpu_start_params(program)
    if params:
        study.enqueue_trial(params, skip_if_exists=True)


def tune_program(tensors: list, trials: int = 200, weights: list[float] | None = None, record: bool = True,
                 **settings) -> list[TuneResult]:
    """Tune the kernels of a program (one tensor and study each) within one budget of `trials`: after
    a round each, more rounds go to the kernels whose improvement saves the most program time
    (`tuner/scheduler.py`).  Each kernel's study, sampler and worker stay open over its rounds.
    `weights[i]` is how often kernel i runs per program run (default 1); `settings` are `tune`'s
    but jobs, timeout and study_name."""
    tasks = [scheduler.Task(str(i), w) for i, w in enumerate(weights or [1.0] * len(tensors))]
    settings.setdefault("progress", False)
    with contextlib.ExitStack() as stack:
        tunings = [stack.enter_context(open_tuning(t, **settings)) for t in tensors]

        def run_round(index: int, count: int) -> list[float]:
            before = tunings[index].finished()
            tunings[index].run(before + count)
            return best_so_far(tunings[index].study)[before:]
        scheduler.allocate(tasks, trials, run_round)
        return [tuning.result(record) for tuning in tunings]


def best_so_far(study: optuna.Study, seconds: Callable = lambda trial: trial.value) -> list[float]:
    """The best time after each finished trial, in trial order (inf before the first measured one);
    `seconds(trial)` is a completed trial's time (default: its measured value)."""
    out, best = [], float("inf")
    for trial in sorted(study.trials, key=lambda t: t.number):
        if trial.state == optuna.trial.TrialState.COMPLETE:
            best = min(best, seconds(trial))
        if trial.state in FINISHED:
            out.append(best)
    return out


def best_schedule_json(study: optuna.Study) -> str:
    """The schedule JSON of a study's best trial."""
    return study.best_trial.user_attrs["schedule"]


def trial_table(study: optuna.Study) -> list[dict]:
    """Each trial's number, state, value and reason, for reports and tests."""
    rows = []
    for t in study.trials:
        rows.append({"number": t.number, "state": t.state.name, "value": t.value,
                     "reason": t.user_attrs.get("rejected") or t.user_attrs.get("failure"),
                     "overhead": t.user_attrs.get("overhead_seconds")})
    return rows


def dumps_summary(result: TuneResult) -> str:
    """A JSON summary of a tuning result."""
    return json.dumps({"study": result.study.study_name, "best_seconds": result.best_seconds,
                       "default_seconds": result.default_seconds,
                       "schedule": result.best_tree.schedule.to_json() if result.best_tree else None})
