"""The schedule editor's model: `ScheduleEditor`, with no widgets and no terminal.

`ScheduleEditor` holds a tensor's current loop tree and applies one transform at a
time (split, reorder, unroll, vectorize, parallel, place, cache), each on the
selected stage and loop.  Every action returns an `ActionResult`: the isl verdict
with its plain-words reason and, for a legal schedule, its measured run time,
GFLOP/s (when `estimate_flops` can count them) and speed-ups over the default
schedule and an optional NumPy baseline.  An illegal or refused transform leaves
the schedule unchanged.  `undo()` steps back, `tune(trials)` runs the Optuna tuner
and keeps the faster of its best and the current schedule, `export(path)` writes a
kernel artifact (`lt.export`).

Run times are measured in this process: the kernel of a schedule is compiled
once (only after isl proved it legal), checked against the NumPy baseline (or
the default schedule) and timed as the median of a few runs.  Timings are
cached per schedule, so undo and revisits cost nothing.

The views (`looptool.notebook.widget`, `looptool.notebook.terminal`) drive this
model; it never imports them.
"""
from __future__ import annotations

import contextlib
import io
import json
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from looptool import ir, runtime
from looptool.frontend.dtypes import SCHEDULE_TOLERANCE
from looptool.schedule import ANNOTATIONS, Schedule
from looptool.schedule.looptree import LoopTree

from .render import tree_html

MAX_RELATIVE_ERROR = SCHEDULE_TOLERANCE


# Results ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    """How an `ActionResult.status` reads: its word in the log, its mark and colour in the widget, and
    whether the action went through (the schedule changed, or was kept or saved as asked)."""

    word: str
    mark: str
    colour: str
    went_through: bool


VERDICTS = {"applied": Verdict("legal", "✔", "#2e7d32", True),
            "illegal": Verdict("ILLEGAL", "✘", "#c62828", False),
            "refused": Verdict("REFUSED", "✘", "#b26a00", False),
            "wrong": Verdict("WRONG", "✘", "#c62828", False),
            "error": Verdict("ERROR", "✘", "#c62828", False),
            "kept": Verdict("kept current schedule", "●", "#1565c0", True),
            "exported": Verdict("exported", "✔", "#1565c0", True),
            "used": Verdict("used", "✔", "#2e7d32", True)}


@dataclass
class ActionResult:
    """What one editor action did.

    status: 'applied' (legal, measured, now the current schedule), 'illegal' (isl found a
    broken dependence), 'refused' (the transform does not apply, e.g. an unknown loop),
    'wrong' (legal but the compiled kernel disagreed with the reference: a looptool bug),
    'kept' (tuning found nothing faster), 'exported', 'used' (the edited function now runs the
    current schedule), or 'error'.  Only 'applied' changes the schedule.  Timings are those of
    the schedule that is current after the action."""

    action: str
    status: str
    legal: bool
    reason: str
    seconds: float | None = None
    gflops: float | None = None
    default_seconds: float | None = None
    baseline_seconds: float | None = None
    relative_error: float | None = None
    compile_seconds: float | None = None
    schedule: str = ""
    path: str | None = None
    index: int = -1

    @property
    def applied(self) -> bool:
        """True when the action changed the schedule."""
        return self.status == "applied"

    @property
    def speedup_vs_default(self) -> float | None:
        """How many times faster than the default schedule (None when either was not measured)."""
        if self.seconds and self.default_seconds:
            return self.default_seconds / self.seconds
        return None

    @property
    def speedup_vs_baseline(self) -> float | None:
        """How many times faster than the NumPy baseline (None when either was not measured)."""
        if self.seconds and self.baseline_seconds:
            return self.baseline_seconds / self.seconds
        return None

    def timing_text(self) -> str:
        """One line: time, GFLOP/s and the speed-ups, or '' when nothing was measured."""
        if self.seconds is None:
            return ""
        parts = [f"{self.seconds * 1e3:.3f} ms"]
        if self.gflops is not None:
            parts.append(f"{self.gflops:.2f} GFLOP/s")
        if self.default_seconds:
            parts.append(f"{self.speedup_vs_default:.2f}x vs default ({self.default_seconds * 1e3:.3f} ms)")
        if self.baseline_seconds:
            parts.append(f"{self.speedup_vs_baseline:.2f}x vs NumPy ({self.baseline_seconds * 1e3:.3f} ms)")
        return " | ".join(parts)

    def __str__(self) -> str:
        verdict = VERDICTS[self.status]
        line = f"[{self.index}] {self.action}: {verdict.word}"
        if self.reason and self.reason != "legal":
            line += f": {self.reason}"
        if not verdict.went_through:
            line += " (schedule unchanged)"
        timing = self.timing_text()
        return line + (f"\n    current schedule: {timing}" if timing else "")


@dataclass
class _Measured:
    seconds: float
    compile_seconds: float
    relative_error: float


@contextlib.contextmanager
def _blas_threads(limit: int | None):
    """Limit NumPy's BLAS/OpenMP threads while timing the baseline (looptool kernels run on one
    thread unless a loop is parallel); no limit when `limit` is None or threadpoolctl is missing."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        limit = None
    if limit is None:
        yield
        return
    with threadpool_limits(limit):
        yield


def estimate_flops(program: ir.Program, sizes: dict[str, int] | None = None) -> float | None:
    """2 * prod(loop sizes) per stage when every stage is a sum of products (matmul, conv); else None.
    `sizes` gives the dims' sizes where the program's own are not the ones run (dynamic dims)."""
    size = (sizes or dict(program.sizes)).get
    total = 0
    for stage in program.stages:
        expr = stage.expr
        if stage.reduce_op != "sum" or not (isinstance(expr, ir.Binary) and expr.op == "mul"):
            return None
        total += 2 * int(np.prod([size(d, program.size(d)) for d in stage.loop_dims], dtype=np.int64))
    return float(total) or None


def _example_of(function, example) -> tuple:
    """The arrays an editor traces `function` on: `example`, else those of its latest trace."""
    if example is None:
        example = function.last_example()
    if example is None:
        raise ValueError(f"ScheduleEditor({function.__name__}): no arrays to trace it on; pass "
                         f"example=(arrays...), one per parameter ({', '.join(p for p, _ in function.params)}), or "
                         f"call {function.__name__} first (its latest trace is used while its arrays are alive)")
    return tuple(example)


def _relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    ref = np.asarray(ref, dtype=np.float64)
    scale = max(float(np.abs(ref).max()) if ref.size else 0.0, 1e-30)
    return float(np.abs(got.astype(np.float64) - ref).max() / scale) if ref.size else 0.0


# The core ----------------------------------------------------------------------------
class ScheduleEditor:
    """The editor's logic, with no widgets: drive it from code, tests or a terminal.

    `tensor` is an `lt.Tensor`, an `lt.function` (the program it compiles for the arrays `example`,
    one per parameter, default: those of its latest trace; export then names the inputs after its
    parameters) or a `tuner.workloads.Workload` (whose baseline is used);
    `baseline` is an optional callable returning the NumPy result, timed for comparison
    and used as the correctness reference (timed with NumPy's BLAS limited to `baseline_threads`,
    default 1, like looptool's kernels; None: no limit).  `measure=False` checks legality only."""

    def __init__(self, tensor, baseline: Callable[[], np.ndarray] | None = None, *, name: str | None = None,
                 measure: bool = True, repeats: int = 7, budget_seconds: float = 0.3, max_unroll: int = 64,
                 flops: float | None = None, baseline_threads: int | None = 1, example: tuple | None = None):
        self.function = self.example = None
        if isinstance(tensor, runtime.Function):
            self.function, self.example = tensor, _example_of(tensor, example)
            name = name or tensor.__name__
            tensor = tensor.tensor(*self.example)
        elif example is not None:
            raise TypeError(f"example= is for an lt.function; got a {type(tensor).__name__}")
        elif hasattr(tensor, "tensor") and not hasattr(tensor, "node"):      # a tuner Workload
            baseline = baseline or getattr(tensor, "baseline", None)
            name = name or getattr(tensor, "name", None)
            tensor = tensor.tensor
        self.tensor, self.baseline = tensor, baseline
        self.program, self.arrays = runtime.lower_on_host(tensor.node)
        self.name = name or f"{self.program.output.name}[{', '.join(self.program.output.dims)}]"
        self.measure_enabled, self.repeats, self.budget_seconds = measure, repeats, budget_seconds
        self.max_unroll, self.baseline_threads = max_unroll, baseline_threads
        self.flops = flops if flops is not None else estimate_flops(self.program, tensor.node.sizes)
        self.default_tree = LoopTree(self.program)
        self.tree = self.default_tree
        self.results: list[ActionResult] = []
        self.last_tune = None
        self._undo: list[tuple[LoopTree, ActionResult]] = []
        self._timings: dict = {}
        self._reference: np.ndarray | None = None
        self._reference_source = ""
        self._baseline_seconds: float | None = None
        self._default_seconds: float | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._study_name = f"looptool-editor-{uuid.uuid4().hex[:8]}"
        self._tune_target = 0
        self.stage = self.program.output.name
        self.loop = self._first_loop(self.stage)
        self.current = self._record(self._measured_result("default schedule", self.tree, "applied", True, "legal"))

    # Inspecting ------------------------------------------------------------------------
    @property
    def schedule(self) -> Schedule:
        """The current schedule (that of `tree`)."""
        return self.tree.schedule

    def stages(self) -> list[str]:
        """Stage names of the current program (cache copies included), in program order."""
        return [st.name for st in self.tree.program.stages]

    def loops(self, stage: str | None = None) -> list[str]:
        """The stage's own loops, outer to inner (those the transforms can change)."""
        return [lp.name for lp in self.schedule.of(stage or self.stage).loops]

    def shared_loops(self, stage: str | None = None) -> list[str]:
        """Loops of the consumer the stage is placed in (not its own)."""
        stage = stage or self.stage
        return [lp.name for lp in self.schedule.effective_loops(stage)[:self.schedule.of(stage).at]]

    def consumers(self, stage: str | None = None) -> list[str]:
        """Stages that read `stage`: where it can be placed."""
        return [st.name for st in self.tree.program.readers(stage or self.stage)]

    def depths(self, consumer: str) -> int:
        """How many loops `consumer` has around its statements (the deepest placement)."""
        return len(self.schedule.effective_loops(consumer))

    def inputs_read(self, stage: str | None = None) -> list[str]:
        """Buffers the stage reads (inputs or other stages): what `cache` can pack through a copy."""
        return sorted({ld.buffer for ld in ir.loads(self.tree.program.stage(stage or self.stage).expr)})

    def stage_label(self, stage: str) -> str:
        """One line about a stage: its kind (output, temp or copy), dims, reduction and placement."""
        st = self.tree.program.stage(stage)
        kind = "output" if st is self.tree.program.output else ("copy" if "." in st.name else "temp")
        text = f"{st.name} ({kind}: {', '.join(st.dims)}"
        if st.reduce_op:
            text += f"; {st.reduce_op} over {', '.join(st.reduce_dims)}"
        sched = self.schedule.of(stage)
        if sched.consumer:
            text += f"; in {sched.consumer} at depth {sched.at}"
        return text + ")"

    def text(self) -> str:
        """The current loop tree as text."""
        return str(self.tree)

    def html(self) -> str:
        """The loop tree as monospace HTML, the selected loop highlighted and the selected stage's
        statements coloured."""
        return tree_html(self.tree, self.stage, self.loop)

    def history(self) -> list[ActionResult]:
        """Every measured schedule, in the order they were tried (the default first)."""
        return [r for r in self.results if r.status == "applied" and r.seconds is not None]

    def best(self) -> ActionResult:
        """The fastest schedule measured so far."""
        measured = self.history()
        return min(measured, key=lambda r: r.seconds) if measured else self.current

    @property
    def can_undo(self) -> bool:
        """True when there is an applied action for `undo()` to take back."""
        return bool(self._undo)

    @property
    def default_seconds(self) -> float | None:
        """The default schedule's run time (None until measured, or with `measure=False`)."""
        return self._default_seconds

    @property
    def baseline_seconds(self) -> float | None:
        """The NumPy baseline's run time (None without a baseline or with `measure=False`)."""
        return self._baseline_seconds

    # Selecting -------------------------------------------------------------------------
    def select(self, stage: str | None = None, loop: str | None = None) -> tuple[str, str | None]:
        """Choose the stage and loop the next transforms act on; returns (stage, loop).
        With a stage and no loop, its outermost own loop is selected."""
        stage = stage or self.stage
        if stage not in self.stages():
            raise ValueError(f"no stage {stage!r}; stages are {self.stages()}")
        own = self.loops(stage)
        if loop is None:
            loop = self.loop if stage == self.stage and self.loop in own else (own[0] if own else None)
        elif loop not in own:
            raise ValueError(f"stage {stage} has no loop {loop!r} of its own; its loops are {own}")
        self.stage, self.loop = stage, loop
        return stage, loop

    def _first_loop(self, stage: str) -> str | None:
        own = self.loops(stage)
        return own[0] if own else None

    def _resolve(self, loop: str | None, stage: str | None) -> tuple[str, str]:
        stage = stage or self.stage
        loop = loop or (self.loop if stage == self.stage else None)
        if loop is None:
            raise ValueError(f"no loop selected in stage {stage} (its own loops: {self.loops(stage)})")
        return stage, loop

    # Transforms ------------------------------------------------------------------------
    def split(self, factor: int, loop: str | None = None, stage: str | None = None) -> ActionResult:
        """Split the selected loop into `loop.0` (outer) and `loop.1` (`factor` iterations), then
        select `loop.1`."""
        try:
            stage, loop = self._resolve(loop, stage)
        except ValueError as err:
            return self._refused(f"split by {factor}", err)
        factor = int(factor) if isinstance(factor, np.integer) else factor
        return self._transform(f"split {stage}.{loop} by {factor}", lambda t: t.split(loop, factor, stage=stage),
                               select=(stage, f"{loop}.1"))

    def move_out(self, loop: str | None = None, stage: str | None = None) -> ActionResult:
        """Swap the selected loop with the loop just outside it (of the same stage)."""
        return self._move(-1, loop, stage)

    def move_in(self, loop: str | None = None, stage: str | None = None) -> ActionResult:
        """Swap the selected loop with the loop just inside it (of the same stage)."""
        return self._move(+1, loop, stage)

    def _move(self, direction: int, loop, stage) -> ActionResult:
        word = "outward" if direction < 0 else "inward"
        try:
            stage, loop = self._resolve(loop, stage)
            own = self.loops(stage)
            if loop not in own:
                raise ValueError(f"stage {stage} has no loop {loop!r} of its own; its loops are {own}")
            pos = own.index(loop)
            other = pos + direction
            if not 0 <= other < len(own):
                raise ValueError(f"loop '{loop}' is already the {'outermost' if direction < 0 else 'innermost'} "
                                 f"loop of stage {stage}")
        except ValueError as err:
            return self._refused(f"move {loop} {word}", err)
        order = (loop, own[other]) if direction < 0 else (own[other], loop)
        return self._transform(f"move {stage}.{loop} {word}", lambda t: t.reorder(*order, stage=stage),
                               select=(stage, loop))

    def reorder(self, *loops: str, stage: str | None = None) -> ActionResult:
        """Put the named loops of the stage in this order (in the positions they hold now)."""
        stage = stage or self.stage
        return self._transform(f"reorder {stage} ({' '.join(loops)})", lambda t: t.reorder(*loops, stage=stage),
                               select=(stage, self.loop if stage == self.stage else None))

    def annotate(self, annotation: str, loop: str | None = None, stage: str | None = None) -> ActionResult:
        """Mark the selected loop 'unroll', 'vectorize', 'parallel', or '' to clear its annotation."""
        try:
            stage, loop = self._resolve(loop, stage)
            if annotation not in ANNOTATIONS:
                raise ValueError(f"unknown loop annotation {annotation!r}; use one of {ANNOTATIONS}")
            if annotation == "unroll":
                extent = next((lp.extent for lp in self.schedule.of(stage).loops if lp.name == loop), 0)
                if extent > self.max_unroll:
                    raise ValueError(f"unrolling '{loop}' ({extent} iterations) would make a huge kernel; split it "
                                     f"first and unroll the inner loop (or raise max_unroll={self.max_unroll})")
        except ValueError as err:
            return self._refused(f"{annotation or 'clear annotation of'} {loop or ''}".strip(), err)
        name = annotation or "clear annotation of"
        return self._transform(f"{name} {stage}.{loop}",
                               lambda t: LoopTree(t.program, t.schedule.annotate(stage, loop, annotation)),
                               select=(stage, loop))

    def unroll(self, loop: str | None = None, stage: str | None = None) -> ActionResult:
        """Fully unroll the selected loop: `annotate("unroll", ...)`."""
        return self.annotate("unroll", loop, stage)

    def vectorize(self, loop: str | None = None, stage: str | None = None) -> ActionResult:
        """Vectorize the selected loop (SIMD lanes; an innermost loop): `annotate("vectorize", ...)`."""
        return self.annotate("vectorize", loop, stage)

    def parallel(self, loop: str | None = None, stage: str | None = None) -> ActionResult:
        """Run the selected loop's iterations on several threads: `annotate("parallel", ...)`."""
        return self.annotate("parallel", loop, stage)

    def clear_annotation(self, loop: str | None = None, stage: str | None = None) -> ActionResult:
        """Remove the selected loop's annotation: `annotate("", ...)`."""
        return self.annotate("", loop, stage)

    def place(self, stage: str | None, depth: int, consumer: str | None = None) -> ActionResult:
        """Compute producer `stage` inside the first `depth` loops of its consumer (default: its
        only reader); depth 0 puts it back at the root."""
        stage = stage or self.stage
        if consumer is None and depth:
            readers = self.consumers(stage)
            if not readers:
                return self._refused(f"place {stage} at depth {depth}", ValueError(
                    f"no stage reads {stage} (it is the output), so there is nothing to place it in"))
            if len(readers) > 1:
                return self._refused(f"place {stage} at depth {depth}", ValueError(
                    f"stage {stage} is read by {readers}; name the consumer to place it in"))
            consumer = readers[0]
        where = f"in {consumer} at depth {depth}" if consumer and depth else "at the root"
        return self._transform(f"place {stage} {where}", lambda t: t.place(stage, consumer, int(depth)),
                               select=(stage, None))

    def cache(self, buffer: str, stage: str | None = None, order=None) -> ActionResult:
        """Read `buffer` in the stage through a copy stage `<buffer>.<stage>` (dims in `order`);
        place the copy inside the stage's loops to pack one tile.  Selects the copy."""
        stage = stage or self.stage
        if isinstance(order, str):
            order = tuple(order.replace(",", " ").split()) or None
        label = f"cache {buffer} in {stage}" + (f" as ({' '.join(order)})" if order else "")
        return self._transform(label, lambda t: t.cache(buffer, stage=stage, order=order),
                               select=(f"{buffer}.{stage}", None))

    def apply(self, steps, label: str | None = None) -> ActionResult:
        """Apply schedule steps like [("split", "t0", "n", 16), ...] (or a schedule JSON text
        from `Schedule.to_json`) on the current schedule, as one action."""
        if isinstance(steps, str):
            steps = json.loads(steps)["steps"]
        steps = [tuple(s) for s in steps]
        return self._transform(label or f"apply {len(steps)} steps",
                               lambda t: LoopTree(t.program, t.schedule.apply(steps)), select=(self.stage, None))

    def reset(self) -> ActionResult:
        """Go back to the default schedule (undo-able)."""
        return self._transform("reset to the default schedule", lambda t: self.default_tree,
                               select=(self.program.output.name, None))

    def undo(self) -> ActionResult:
        """Restore the schedule before the last applied action."""
        if not self._undo:
            return self._record(ActionResult("undo", "refused", False, "nothing to undo",
                                             **self._timing_fields(self.current)))
        tree, previous = self._undo.pop()
        self.tree = tree
        self._fix_selection(self.stage, self.loop)
        result = self._measured_result(f"undo (back to [{previous.index}])", tree, "applied", True, "legal")
        self.current = self._record(result)
        return result

    # Tuning and export ---------------------------------------------------------------------
    def tune(self, trials: int = 10, *, storage: str | None = None, seed: int | None = 0,
             timeout: float | None = None, record: bool = False, repeats: int = 5, progress: bool = False,
             **kwargs) -> ActionResult:
        """Tune from here: run the Optuna tuner for `trials` more trials and keep whichever is
        faster, the current schedule or the tuner's best (both timed here, the same way).

        The tuner's search space is define-by-run from the default schedule (its parameters
        depend on earlier draws), so it cannot start *from* the current schedule; what this
        does honestly is race the two.  Repeated calls continue the same study.  `storage`
        defaults to a temporary SQLite file of this editor; `record=True` also stores the best
        schedule in looptool's tuning database."""
        from tuner import study as tuner_study

        if storage is None:
            storage = f"sqlite:///{self._tmpdir() / 'studies.sqlite'}"
        self._tune_target += int(trials)
        action = f"tune from here ({trials} trials)"
        try:
            result = tuner_study.tune(self.tensor, trials=self._tune_target, storage=storage,
                                      study_name=kwargs.pop("study_name", self._study_name), seed=seed,
                                      timeout=timeout, record=record, repeats=repeats, progress=progress,
                                      **kwargs)
        except Exception as err:    # a broken tuner must not break the editor
            return self.record_error(action, err)
        self.last_tune = result
        if result.best_tree is None:
            return self._record(ActionResult(action, "kept", True, "the tuner measured no schedule",
                                             **self._timing_fields(self.current)))
        found = LoopTree(self.program, Schedule.from_json(result.best_tree.schedule.to_json(), self.program))
        tuned = self._try(found)
        current = self.current.seconds
        if tuned[0] != "applied":
            return self._record(ActionResult(action, "kept", True, f"the tuner's best was rejected here: "
                                             f"{tuned[1]}", **self._timing_fields(self.current)))
        if current is not None and tuned[2] is not None and tuned[2].seconds >= current:
            reason = (f"kept the current schedule ({current * 1e3:.3f} ms): the tuner's best of "
                      f"{len(result.study.trials)} trials ran {tuned[2].seconds * 1e3:.3f} ms here")
            return self._record(ActionResult(action, "kept", True, reason, **self._timing_fields(self.current)))
        note = (f"adopted the tuner's best of {len(result.study.trials)} trials: "
                f"{tuned[2].seconds * 1e3:.3f} ms here vs {current * 1e3:.3f} ms current"
                if tuned[2] is not None and current is not None else "adopted the tuner's best schedule")
        return self._adopt(action, found, tuned, note, select=(self.program.output.name, None))

    def export(self, path, input_names=None) -> ActionResult:
        """Write the current schedule's kernel as an artifact directory with `lt.export` (of the
        function, traced on the editor's example, when the editor edits one)."""
        from looptool.export import export as lt_export
        tuning = {"source": "looptool.notebook", "seconds": self.current.seconds,
                  "default_seconds": self._default_seconds}
        try:
            out = lt_export(self.function or self.tensor, path, self.tree, input_names=input_names, tuning=tuning,
                            example=self.example)
        except Exception as err:
            return self.record_error(f"export to {path}", err)
        files = ", ".join(sorted(p.name for p in Path(out).iterdir()))
        return self._record(ActionResult(f"export to {out}", "exported", True, f"wrote {files}", path=str(out),
                                         **self._timing_fields(self.current)))

    def use(self) -> ActionResult:
        """Make the edited function run the current schedule from now on, for calls of the example's
        signature (`Function.use_schedule`); refused when the editor edits a tensor."""
        if self.function is None:
            return self._refused("use in the function", ValueError(
                "the editor edits a tensor, not an lt.function: export the schedule, or pass it to "
                "Tensor.numpy(schedule=...)"))
        name, action = self.function.__name__, f"use in {self.function.__name__}"
        try:
            self.function.use_schedule(self.tree, *self.example)
        except Exception as err:
            return self.record_error(action, err)
        shapes = ", ".join(str(tuple(np.shape(a))) for a in self.example)
        return self._record(ActionResult(action, "used", True, f"{name}'s calls of the signature of {shapes} run "
                                         f"this schedule", **self._timing_fields(self.current)))

    def record_error(self, action: str, err: Exception) -> ActionResult:
        """Record that `action` failed with an unexpected exception (status 'error'); the
        schedule is unchanged and the result carries the current schedule's timings."""
        return self._record(ActionResult(action, "error", False, f"{type(err).__name__}: {err}",
                                         **self._timing_fields(self.current)))

    def close(self):
        """Remove this editor's temporary files (tuning studies)."""
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    # Plotting ------------------------------------------------------------------------------
    def plot(self, figsize=(4.6, 2.8)):
        """A matplotlib Figure of the measured schedules' times (no pyplot, no backend change)."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=figsize, dpi=100)
        ax = fig.add_subplot()
        hist = self.history()
        xs = [r.index for r in hist]
        ys = [r.seconds * 1e3 for r in hist]
        ax.plot(xs, ys, "o-", color="#4c72b0", markersize=4, linewidth=1, label="tried schedules")
        if hist:
            best = min(hist, key=lambda r: r.seconds)
            ax.plot([best.index], [best.seconds * 1e3], "*", color="#dd8452", markersize=12, label="best")
        if self.current.seconds is not None:
            ax.plot([self.current.index], [self.current.seconds * 1e3], "o", markerfacecolor="none",
                    markeredgecolor="#c44e52", markersize=10, markeredgewidth=1.5, label="current")
        if self._default_seconds:
            ax.axhline(self._default_seconds * 1e3, color="gray", linestyle="--", linewidth=1, label="default")
        if self._baseline_seconds:
            ax.axhline(self._baseline_seconds * 1e3, color="#55a868", linestyle=":", linewidth=1.5, label="NumPy")
        values = ys + [v * 1e3 for v in (self._default_seconds, self._baseline_seconds) if v]
        if values and max(values) > 8 * min(values):
            ax.set_yscale("log")
        ax.set_xlabel("action #")
        ax.set_ylabel("run time (ms)")
        ax.set_title(f"{self.name}: schedules tried", fontsize=9)
        ax.legend(fontsize=7, loc="best")
        ax.tick_params(labelsize=7)
        fig.tight_layout()
        return fig

    def plot_png(self, figsize=(4.6, 2.8)) -> bytes:
        """The history plot as PNG bytes."""
        buf = io.BytesIO()
        self.plot(figsize).savefig(buf, format="png")
        return buf.getvalue()

    # Internals -------------------------------------------------------------------------------
    def _tmpdir(self) -> Path:
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="looptool-editor-")
        return Path(self._tmp.name)

    def _record(self, result: ActionResult) -> ActionResult:
        result.index = len(self.results)
        if not result.schedule:
            result.schedule = self.schedule.to_json()
        self.results.append(result)
        return result

    def _refused(self, action: str, err: Exception) -> ActionResult:
        return self._record(ActionResult(action, "refused", False, str(err), **self._timing_fields(self.current)))

    def _timing_fields(self, result: ActionResult) -> dict:
        return dict(seconds=result.seconds, gflops=result.gflops, default_seconds=result.default_seconds,
                    baseline_seconds=result.baseline_seconds, relative_error=result.relative_error,
                    compile_seconds=result.compile_seconds)

    def _transform(self, action: str, make: Callable[[LoopTree], LoopTree], select) -> ActionResult:
        try:
            tree = make(self.tree)
        except ValueError as err:     # the schedule API refuses: unknown loop, shared loop, bad factor...
            return self._refused(action, err)
        except Exception as err:
            return self.record_error(action, err)
        return self._adopt(action, tree, self._try(tree), "legal", select)

    def _try(self, tree: LoopTree):
        """(status, reason, measurement or None) for a candidate tree; nothing changes."""
        legal, reason = tree.check()
        if not legal:
            return "illegal", reason, None
        if not self.measure_enabled:
            return "applied", "legal", None
        try:
            measured = self._measure(tree)
        except Exception as err:
            return "error", f"compiling or running failed: {type(err).__name__}: {err}", None
        limit = MAX_RELATIVE_ERROR[self.program.output.dtype]
        if not measured.relative_error <= limit:
            return "wrong", (f"legal, but the compiled kernel disagrees with {self._reference_source} (relative "
                             f"error {measured.relative_error:.3g}); this is a looptool bug"), measured
        return "applied", "legal", measured

    def _adopt(self, action, tree, tried, reason, select) -> ActionResult:
        status, why, measured = tried
        if status != "applied":
            return self._record(ActionResult(action, status, status == "wrong", why,
                                             **self._timing_fields(self.current)))
        self._undo.append((self.tree, self.current))
        self.tree = tree
        self._fix_selection(*select)
        result = self._result_for(action, "applied", True, reason, measured)
        self.current = self._record(result)
        return result

    def _fix_selection(self, stage, loop):
        stages = self.stages()
        stage = stage if stage in stages else (self.stage if self.stage in stages else self.program.output.name)
        own = self.loops(stage)
        if loop not in own:
            loop = self.loop if stage == self.stage and self.loop in own else (own[0] if own else None)
        self.stage, self.loop = stage, loop

    def _measured_result(self, action, tree, status, legal, reason) -> ActionResult:
        measured = self._measure(tree) if self.measure_enabled else None
        return self._result_for(action, status, legal, reason, measured)

    def _result_for(self, action, status, legal, reason, measured: _Measured | None) -> ActionResult:
        if measured is None:
            return ActionResult(action, status, legal, reason)
        gflops = self.flops / measured.seconds / 1e9 if self.flops else None
        return ActionResult(action, status, legal, reason, measured.seconds, gflops, self._default_seconds,
                            self._baseline_seconds, measured.relative_error, measured.compile_seconds)

    def _ensure_reference(self):
        if self._reference is not None:
            return
        expected_shape = tuple(self.tensor.node.sizes[d] for d in self.program.output.dims)
        if self.baseline is not None:
            ref = np.asarray(self.baseline())
            if ref.shape == expected_shape:
                self._reference, self._reference_source = ref, "the NumPy baseline"
                with _blas_threads(self.baseline_threads):
                    self._baseline_seconds = self._time(self.baseline)
            else:
                raise ValueError(f"the baseline returned shape {ref.shape}; the tensor has dims "
                                 f"{self.program.output.dims} of shape {expected_shape}")
        kernel = runtime.Kernel(self.default_tree, runtime.get_num_threads())
        if self._reference is None:
            self._reference, self._reference_source = kernel(self.arrays), "the default schedule"
        self._default_seconds = self._time(lambda: kernel(self.arrays))
        self._timings[self._key(self.default_tree)] = _Measured(
            self._default_seconds, kernel.compile_seconds, _relative_error(kernel(self.arrays), self._reference))

    def _key(self, tree: LoopTree):
        return tree.program, tree.schedule.stages, runtime.get_num_threads()

    def _measure(self, tree: LoopTree) -> _Measured:
        self._ensure_reference()
        key = self._key(tree)
        if key not in self._timings:
            kernel = runtime.Kernel(tree, runtime.get_num_threads())
            error = _relative_error(kernel(self.arrays), self._reference)
            seconds = self._time(lambda: kernel(self.arrays)) if error <= 1e-3 else float("nan")
            self._timings[key] = _Measured(seconds, kernel.compile_seconds, error)
        return self._timings[key]

    def _time(self, fn) -> float:
        """Seconds per call: the median of up to `repeats` samples after a warm-up, each sample
        timing a batch of calls long enough (~2 ms) for the clock; stops early after `budget_seconds`."""
        start = time.perf_counter()
        fn()
        first = time.perf_counter() - start
        batch = max(1, min(10_000, int(2e-3 / max(first, 1e-7))))
        times, spent = [], 0.0
        while len(times) < max(1, self.repeats) and (spent < self.budget_seconds or len(times) < 3):
            start = time.perf_counter()
            for _ in range(batch):
                fn()
            elapsed = time.perf_counter() - start
            times.append(elapsed / batch)
            spent += elapsed
        return float(np.median(times))
