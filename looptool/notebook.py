"""Tune loop orders interactively: see legality and speed after every change.

Three layers, from the bottom up:

`ScheduleEditor` (plain Python, no widgets) holds a tensor's current loop tree and
applies one transform at a time (split, reorder, unroll, vectorize, parallel,
place, cache), each on the selected stage and loop.  Every action returns an
`ActionResult`: the isl verdict with its plain-words reason and, for a legal
schedule, its measured run time, GFLOP/s (when the FLOPs can be estimated) and
speed-ups over the default schedule and an optional NumPy baseline.  An illegal
or refused transform leaves the schedule unchanged.  `undo()` steps back,
`tune(trials)` runs the Optuna tuner and keeps the faster of its best and the
current schedule, `export(path)` writes a kernel artifact (`lt.export`).

`LoopTreeEditor` is a thin ipywidgets layer over it (ipywidgets is imported only
when one is built, so `import looptool` never needs it):

    from looptool.notebook import LoopTreeEditor
    LoopTreeEditor(c, baseline=lambda: a_np @ b_np)     # last expression of a cell

`python -m looptool.notebook [WORKLOAD]` is the same editor as a line-oriented
terminal program, for people without Jupyter.

Run times are measured in this process: the kernel of a schedule is compiled
once (only after isl proved it legal), checked against the NumPy baseline (or
the default schedule) and timed as the median of a few runs.  Timings are
cached per schedule, so undo and revisits cost nothing.
"""
from __future__ import annotations

import contextlib
import html
import io
import shlex
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import ir, runtime
from .looptree import LoopNode, LoopTree
from .schedule import ANNOTATIONS, Schedule

MAX_RELATIVE_ERROR = {"float32": 1e-4, "float64": 1e-10}


# Results ---------------------------------------------------------------------------
@dataclass
class ActionResult:
    """What one editor action did.

    status: 'applied' (legal, measured, now the current schedule), 'illegal' (isl found a
    broken dependence), 'refused' (the transform does not apply, e.g. an unknown loop),
    'wrong' (legal but the compiled kernel disagreed with the reference: a looptool bug),
    'kept' (tuning found nothing faster), 'exported', or 'error'.  Only 'applied' changes
    the schedule.  Timings are those of the schedule that is current after the action."""

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
        if self.seconds and self.default_seconds:
            return self.default_seconds / self.seconds
        return None

    @property
    def speedup_vs_baseline(self) -> float | None:
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
        verdict = {"applied": "legal", "kept": "kept current schedule", "exported": "exported"}.get(
            self.status, self.status.upper())
        line = f"[{self.index}] {self.action}: {verdict}"
        if self.reason and self.reason != "legal":
            line += f": {self.reason}"
        if self.status not in ("applied", "kept", "exported"):
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


def estimate_flops(program: ir.Program) -> float | None:
    """2 * prod(loop sizes) per stage when every stage is a sum of products (matmul, conv); else None."""
    total = 0
    for stage in program.stages:
        expr = stage.expr
        if stage.reduce_op != "sum" or not (isinstance(expr, ir.Binary) and expr.op == "mul"):
            return None
        total += 2 * int(np.prod([program.size(d) for d in stage.loop_dims], dtype=np.int64))
    return float(total) or None


def _relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    ref = np.asarray(ref, dtype=np.float64)
    scale = max(float(np.abs(ref).max()) if ref.size else 0.0, 1e-30)
    return float(np.abs(got.astype(np.float64) - ref).max() / scale) if ref.size else 0.0


# The core ----------------------------------------------------------------------------
class ScheduleEditor:
    """The editor's logic, with no widgets: drive it from code, tests or a terminal.

    `tensor` is an `lt.Tensor` (or a `tuner.workloads.Workload`, whose baseline is used);
    `baseline` is an optional callable returning the NumPy result, timed for comparison
    and used as the correctness reference (timed with NumPy's BLAS limited to `baseline_threads`,
    default 1, like looptool's kernels; None: no limit).  `measure=False` checks legality only."""

    def __init__(self, tensor, baseline: Callable[[], np.ndarray] | None = None, *, name: str | None = None,
                 measure: bool = True, repeats: int = 7, budget_seconds: float = 0.3, max_unroll: int = 64,
                 flops: float | None = None, baseline_threads: int | None = 1):
        if hasattr(tensor, "tensor") and not hasattr(tensor, "node"):      # a tuner Workload
            baseline = baseline or getattr(tensor, "baseline", None)
            name = name or getattr(tensor, "name", None)
            tensor = tensor.tensor
        self.tensor, self.baseline = tensor, baseline
        self.program, self.arrays = ir.lower(tensor.node)
        self.name = name or f"{self.program.output.name}[{', '.join(self.program.output.dims)}]"
        self.measure_enabled, self.repeats, self.budget_seconds = measure, repeats, budget_seconds
        self.max_unroll, self.baseline_threads = max_unroll, baseline_threads
        self.flops = flops if flops is not None else estimate_flops(self.program)
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
    def default_seconds(self) -> float | None:
        return self._default_seconds

    @property
    def baseline_seconds(self) -> float | None:
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
        return self.annotate("unroll", loop, stage)

    def vectorize(self, loop: str | None = None, stage: str | None = None) -> ActionResult:
        return self.annotate("vectorize", loop, stage)

    def parallel(self, loop: str | None = None, stage: str | None = None) -> ActionResult:
        return self.annotate("parallel", loop, stage)

    def clear_annotation(self, loop: str | None = None, stage: str | None = None) -> ActionResult:
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
            import json
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
            return self._record(ActionResult(action, "error", False, f"{type(err).__name__}: {err}",
                                             **self._timing_fields(self.current)))
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
        """Write the current schedule's kernel as an artifact directory with `lt.export`."""
        from .export import export as lt_export
        tuning = {"source": "looptool.notebook", "seconds": self.current.seconds,
                  "default_seconds": self._default_seconds}
        try:
            out = lt_export(self.tensor, path, self.tree, input_names=input_names, tuning=tuning)
        except Exception as err:
            return self._record(ActionResult(f"export to {path}", "error", False, f"{type(err).__name__}: {err}",
                                             **self._timing_fields(self.current)))
        files = ", ".join(sorted(p.name for p in Path(out).iterdir()))
        return self._record(ActionResult(f"export to {out}", "exported", True, f"wrote {files}", path=str(out),
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
            return self._record(ActionResult(action, "error", False, f"{type(err).__name__}: {err}",
                                             **self._timing_fields(self.current)))
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
        limit = MAX_RELATIVE_ERROR.get(self.program.output.dtype, 1e-4)
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
        expected_shape = tuple(self.program.size(d) for d in self.program.output.dims)
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


# Rendering ---------------------------------------------------------------------------------
def tree_html(tree: LoopTree, stage: str | None = None, loop: str | None = None) -> str:
    """The loop tree as a <pre> block; the `loop` nodes of `stage` highlighted, its statements coloured."""
    lines = str(tree).split("\n")
    nodes = _line_nodes(tree)
    marked, stage_nodes = set(), set()
    if stage is not None:
        at = tree.schedule.of(stage).at if stage in {n for n, _ in tree.schedule.stages} else 0
        for stmt, path in tree.statements():
            if stmt.stage.name == stage:
                stage_nodes.add(id(stmt))
                marked.update(id(n) for n in path[at:] if n.loop.name == loop)
    out = []
    # The buffer lines come first; then one line per node (and per local buffer) depth first.
    offset = len(lines) - len(nodes)
    for i, text in enumerate(lines):
        esc = html.escape(text)
        node = nodes[i - offset] if offset >= 0 and i >= offset else None
        if node is not None and id(node) in marked:
            esc = f'<span style="background:#ffe08a;font-weight:bold">{esc}</span>'
        elif node is not None and id(node) in stage_nodes:
            esc = f'<span style="color:#1f5fbf">{esc}</span>'
        elif "[vectorize]" in text or "[unroll]" in text or "[parallel]" in text:
            esc = f'<span style="color:#7a3e9d">{esc}</span>'
        out.append(esc)
    return ('<pre style="font-family:monospace;font-size:12px;line-height:1.35;margin:0;padding:6px;'
            'background:#f7f7f9;border:1px solid #ddd;overflow:auto">' + "\n".join(out) + "</pre>")


def _line_nodes(tree: LoopTree) -> list:
    """The node each printed line after the buffer list shows (None for local-buffer lines)."""
    seq: list = []

    def rec(body):
        for node in body:
            seq.append(node)
            if isinstance(node, LoopNode):
                seq.extend([None] * len(tree.local_buffers.get(id(node), [])))
                rec(node.body)
    rec(tree.root)
    return seq


# The widgets ---------------------------------------------------------------------------------
def _ipywidgets():
    try:
        import ipywidgets
    except ImportError:
        raise ImportError("LoopTreeEditor needs ipywidgets: pip install 'looptool[notebook]' (or ipywidgets>=8); "
                          "without Jupyter, use ScheduleEditor or `python -m looptool.notebook`") from None
    return ipywidgets


STATUS_COLORS = {"applied": "#2e7d32", "illegal": "#c62828", "refused": "#b26a00", "wrong": "#c62828",
                 "error": "#c62828", "kept": "#1565c0", "exported": "#1565c0"}


class LoopTreeEditor:
    """An ipywidgets editor of a tensor's loop tree; display it as a cell's last expression.

    Every control calls a `ScheduleEditor` method (`self.core`); the same actions are
    available as methods here, which also refresh the widgets."""

    def __init__(self, tensor, baseline: Callable[[], np.ndarray] | None = None, **options):
        w = _ipywidgets()
        self.core = tensor if isinstance(tensor, ScheduleEditor) else ScheduleEditor(tensor, baseline, **options)
        self._syncing = False
        layout = w.Layout
        small = layout(width="auto")
        self.stage_dropdown = w.Dropdown(description="stage", layout=layout(width="340px"))
        self.loop_dropdown = w.Dropdown(description="loop", layout=layout(width="180px"))
        self.factor = w.BoundedIntText(value=8, min=1, max=1 << 20, description="factor",
                                       layout=layout(width="140px"))
        self.consumer_dropdown = w.Dropdown(description="place in", layout=layout(width="200px"))
        self.depth = w.BoundedIntText(value=1, min=0, max=1, description="depth", layout=layout(width="130px"))
        self.buffer_dropdown = w.Dropdown(description="cache", layout=layout(width="170px"))
        self.order = w.Text(value="", placeholder="dims order (optional)", layout=layout(width="160px"))
        self.trials = w.BoundedIntText(value=8, min=1, max=10000, description="trials",
                                       layout=layout(width="140px"))
        self.path = w.Text(value="looptool_kernel", description="export to", layout=layout(width="300px"))
        specs = [("move_out", "⬆ outward", "Swap with the loop just outside"),
                 ("move_in", "⬇ inward", "Swap with the loop just inside"),
                 ("split", "split", "Split by the factor: loop.0 (outer), loop.1 (inner)"),
                 ("unroll", "unroll", "Fully unroll the loop"),
                 ("vectorize", "vectorize", "SIMD lanes (an innermost loop)"),
                 ("parallel", "parallel", "Run iterations on several threads"),
                 ("clear", "clear", "Remove the loop's annotation"),
                 ("place", "place", "Compute the stage inside the first `depth` loops of its consumer"),
                 ("cache", "cache", "Read the buffer through a copy stage (then place the copy to pack a tile)"),
                 ("undo", "↶ undo", "Back to the previous schedule"),
                 ("tune", "tune from here", "Run the tuner; keep the faster of its best and this schedule"),
                 ("export", "export", "lt.export the current schedule's kernel to the folder")]
        self.buttons = {key: w.Button(description=label, tooltip=tip, layout=small) for key, label, tip in specs}
        for key in ("undo",):
            self.buttons[key].button_style = "warning"
        self.buttons["tune"].button_style = "info"
        self.buttons["export"].button_style = "success"
        self.title = w.HTML()
        self.tree_view = w.HTML(layout=layout(width="auto", min_width="380px"))
        self.status = w.HTML(layout=layout(width="auto"))
        self.plot = w.Image(format="png", layout=layout(width="460px"))
        self.log = w.HTML()

        self.stage_dropdown.observe(self._on_stage, names="value")
        self.loop_dropdown.observe(self._on_loop, names="value")
        self.consumer_dropdown.observe(self._on_consumer, names="value")
        handlers = {
            "move_out": lambda: self.core.move_out(), "move_in": lambda: self.core.move_in(),
            "split": lambda: self.core.split(int(self.factor.value)),
            "unroll": lambda: self.core.unroll(), "vectorize": lambda: self.core.vectorize(),
            "parallel": lambda: self.core.parallel(), "clear": lambda: self.core.clear_annotation(),
            "place": lambda: self.core.place(self.core.stage, int(self.depth.value),
                                             self.consumer_dropdown.value),
            "cache": lambda: self.core.cache(self.buffer_dropdown.value, order=self.order.value or None),
            "undo": lambda: self.core.undo(), "tune": lambda: self.core.tune(int(self.trials.value)),
            "export": lambda: self.core.export(self.path.value),
        }
        for key, fn in handlers.items():
            self.buttons[key].on_click(lambda _b, fn=fn, key=key: self._run(key, fn))

        b = self.buttons
        controls = w.VBox([
            w.HBox([self.stage_dropdown, self.loop_dropdown]),
            w.HBox([b["move_out"], b["move_in"], self.factor, b["split"], b["unroll"], b["vectorize"],
                    b["parallel"], b["clear"]]),
            w.HBox([self.consumer_dropdown, self.depth, b["place"], self.buffer_dropdown, self.order, b["cache"]]),
            w.HBox([b["undo"], self.trials, b["tune"], self.path, b["export"]]),
        ])
        right = w.VBox([self.status, self.plot], layout=layout(width="480px"))
        self.widget = w.VBox([self.title, controls, w.HBox([self.tree_view, right]), self.log])
        self.refresh()

    # Display -------------------------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    def _ipython_display_(self):
        from IPython.display import display
        display(self.widget)

    # Programmatic actions (each refreshes the widgets) -----------------------------------------
    def select(self, stage=None, loop=None):
        out = self.core.select(stage, loop)
        self.refresh()
        return out

    def _act(name):
        def method(self, *args, **kwargs):
            result = getattr(self.core, name)(*args, **kwargs)
            self.refresh()
            return result
        method.__name__ = name
        method.__doc__ = getattr(ScheduleEditor, name).__doc__
        return method

    split = _act("split")
    move_out = _act("move_out")
    move_in = _act("move_in")
    reorder = _act("reorder")
    annotate = _act("annotate")
    unroll = _act("unroll")
    vectorize = _act("vectorize")
    parallel = _act("parallel")
    clear_annotation = _act("clear_annotation")
    place = _act("place")
    cache = _act("cache")
    apply = _act("apply")
    reset = _act("reset")
    undo = _act("undo")
    tune = _act("tune")
    export = _act("export")
    del _act

    @property
    def tree(self) -> LoopTree:
        return self.core.tree

    @property
    def results(self) -> list[ActionResult]:
        return self.core.results

    # Callbacks ---------------------------------------------------------------------------------
    def _run(self, key: str, fn):
        busy = {"tune": "tuning (this takes a while)…", "export": "exporting…"}.get(key, "checking and timing…")
        self.status.value = f'<div style="color:#555">{html.escape(busy)}</div>'
        try:
            fn()
        except Exception as err:   # a failure in a callback would otherwise vanish into the log
            self.core._record(ActionResult(key, "error", False, f"{type(err).__name__}: {err}",
                                           **self.core._timing_fields(self.core.current)))
        self.refresh()

    def _on_stage(self, change):
        if self._syncing or change["new"] is None:
            return
        self.core.select(change["new"])
        self.refresh()

    def _on_loop(self, change):
        if self._syncing or change["new"] is None:
            return
        self.core.select(self.core.stage, change["new"])
        self.refresh(status=False)

    def _on_consumer(self, change):
        if self._syncing or change["new"] is None:
            return
        self._sync_depth()

    def _sync_depth(self):
        consumer = self.consumer_dropdown.value
        deepest = self.core.depths(consumer) if consumer else 0
        self.depth.max = max(deepest, 0)
        sched = self.core.schedule.of(self.core.stage)
        self.depth.value = min(sched.at if sched.consumer == consumer and sched.at else min(1, deepest), deepest)

    def refresh(self, status: bool = True):
        """Redraw every widget from the core's state."""
        core = self.core
        self._syncing = True
        try:
            self.stage_dropdown.options = [(core.stage_label(s), s) for s in core.stages()]
            self.stage_dropdown.value = core.stage
            self.loop_dropdown.options = core.loops()
            self.loop_dropdown.value = core.loop
            consumers = core.consumers()
            self.consumer_dropdown.options = consumers
            self.consumer_dropdown.value = core.schedule.of(core.stage).consumer if \
                core.schedule.of(core.stage).consumer in consumers else (consumers[0] if consumers else None)
            self.consumer_dropdown.disabled = self.buttons["place"].disabled = not consumers
            self._sync_depth()
            buffers = core.inputs_read()
            self.buffer_dropdown.options = buffers
            self.buffer_dropdown.value = buffers[0] if buffers else None
            self.buttons["cache"].disabled = not buffers
            self.buttons["undo"].disabled = not core._undo
            no_loop = core.loop is None
            for key in ("move_out", "move_in", "split", "unroll", "vectorize", "parallel", "clear"):
                self.buttons[key].disabled = no_loop
        finally:
            self._syncing = False
        shared = core.shared_loops()
        self.title.value = (f"<b>LoopTreeEditor</b>: {html.escape(core.name)} &nbsp; "
                            f"<span style='color:#666'>stage {html.escape(core.stage)}"
                            + (f", inside {html.escape(', '.join(shared))} of "
                               f"{html.escape(core.schedule.of(core.stage).consumer)}" if shared else "")
                            + "</span>")
        self.tree_view.value = core.html()
        if status:
            self.status.value = status_html(core)
            self.log.value = log_html(core.results)
            if core.measure_enabled:
                self.plot.value = core.plot_png()


def status_html(core: ScheduleEditor) -> str:
    """The verdict of the last action and the current schedule's timings, as HTML."""
    last, cur = core.results[-1], core.current
    color = STATUS_COLORS.get(last.status, "#333")
    word = {"applied": "✔ legal", "illegal": "✘ illegal", "refused": "✘ refused", "wrong": "✘ wrong result",
            "error": "✘ error", "kept": "● kept current schedule", "exported": "✔ exported"}[last.status]
    parts = [f'<div style="font-weight:bold;color:{color}">{word}: {html.escape(last.action)}</div>']
    if last.reason and last.reason != "legal":
        parts.append(f'<div style="color:{color};white-space:pre-wrap;font-size:12px">{html.escape(last.reason)}'
                     f"</div>")
    if last.status in ("illegal", "refused", "wrong", "error"):
        parts.append('<div style="font-size:12px;color:#555">the schedule is unchanged</div>')
    if cur.seconds is not None:
        rows = [("current", f"{cur.seconds * 1e3:.3f} ms"
                 + (f" · {cur.gflops:.2f} GFLOP/s" if cur.gflops is not None else ""))]
        if cur.default_seconds:
            rows.append(("default", f"{cur.default_seconds * 1e3:.3f} ms · speed-up {cur.speedup_vs_default:.2f}x"))
        if cur.baseline_seconds:
            rows.append(("NumPy", f"{cur.baseline_seconds * 1e3:.3f} ms · speed-up {cur.speedup_vs_baseline:.2f}x"))
        best = core.best()
        rows.append(("best so far", f"{best.seconds * 1e3:.3f} ms (action [{best.index}])"))
        parts.append('<table style="font-size:12px;margin-top:4px">' + "".join(
            f"<tr><td style='padding-right:10px;color:#555'>{k}</td><td>{v}</td></tr>" for k, v in rows) + "</table>")
    return "".join(parts)


def log_html(results: list[ActionResult], last: int = 8) -> str:
    """The last few actions as a small table."""
    rows = []
    for r in results[-last:][::-1]:
        color = STATUS_COLORS.get(r.status, "#333")
        timing = f"{r.seconds * 1e3:.3f} ms" if r.status == "applied" and r.seconds is not None else ""
        reason = "" if r.reason == "legal" else r.reason
        if len(reason) > 140:
            reason = reason[:137] + "…"
        cell = "<td style='padding:0 12px 0 0'>"
        rows.append(f"<tr>{cell}[{r.index}]</td>{cell}{html.escape(r.action)}</td>"
                    f"<td style='padding:0 12px 0 0;color:{color}'>{r.status}</td>{cell}{timing}</td>"
                    f"<td style='color:#666'>{html.escape(reason)}</td></tr>")
    head = "".join(f"<th style='padding:0 12px 0 0'>{h}</th>" for h in ("#", "action", "verdict", "time", "reason"))
    return ('<table style="font-size:11px;border-collapse:collapse">'
            f"<tr style='text-align:left'>{head}</tr>" + "".join(rows) + "</table>")


# The terminal fallback ----------------------------------------------------------------------
TERMINAL_HELP = """commands (the selected stage/loop is used when a name is left out):
  show                      print the loop tree (the selected loop marked with <==)
  stages | loops            list the stages / the selected stage's own loops
  select STAGE [LOOP]       select a stage (and a loop); `select LOOP` picks a loop of this stage
  out | in                  move the selected loop outward / inward
  reorder L1 L2 ...         put these loops of the stage in this order
  split FACTOR              split the selected loop (selects LOOP.1)
  unroll | vectorize | parallel | clear     annotate the selected loop (clear removes it)
  place [STAGE] DEPTH [CONSUMER]            compute a producer inside its consumer's first DEPTH loops
  cache BUFFER [DIMS...]    read BUFFER through a copy stage (then place the copy)
  undo | reset              previous schedule / default schedule
  tune TRIALS               run the tuner, keep the faster schedule
  export PATH               lt.export the current schedule
  history | json | help | quit"""


def _marked_text(core: ScheduleEditor) -> str:
    lines = core.text().split("\n")
    nodes = _line_nodes(core.tree)
    offset = len(lines) - len(nodes)
    at = core.schedule.of(core.stage).at
    marked = set()
    for stmt, path in core.tree.statements():
        if stmt.stage.name == core.stage:
            marked.update(id(n) for n in path[at:] if n.loop.name == core.loop)
    return "\n".join(text + ("   <==" if offset >= 0 and i >= offset and nodes[i - offset] is not None
                             and id(nodes[i - offset]) in marked else "") for i, text in enumerate(lines))


def run_command(core: ScheduleEditor, line: str) -> str | None:
    """Run one terminal command on the editor; return the text to print (None: quit)."""
    try:
        words = shlex.split(line)
    except ValueError as err:
        return f"cannot parse: {err}"
    if not words:
        return ""
    cmd, args = words[0].lower(), words[1:]
    try:
        if cmd in ("quit", "exit", "q"):
            return None
        if cmd in ("help", "?"):
            return TERMINAL_HELP
        if cmd == "show":
            return _marked_text(core)
        if cmd == "stages":
            return "\n".join(("* " if s == core.stage else "  ") + core.stage_label(s) for s in core.stages())
        if cmd == "loops":
            return " ".join(f"[{lp}]" if lp == core.loop else lp for lp in core.loops())
        if cmd == "select":
            if len(args) == 1 and args[0] not in core.stages():
                core.select(core.stage, args[0])
            else:
                core.select(*args[:2])
            return f"selected stage {core.stage}, loop {core.loop}"
        if cmd == "history":
            return "\n".join(str(r) for r in core.results)
        if cmd == "json":
            return core.schedule.to_json()
        actions = {
            "out": lambda: core.move_out(), "in": lambda: core.move_in(),
            "reorder": lambda: core.reorder(*args), "split": lambda: core.split(int(args[0])),
            "unroll": lambda: core.unroll(), "vectorize": lambda: core.vectorize(),
            "parallel": lambda: core.parallel(), "clear": lambda: core.clear_annotation(),
            "cache": lambda: core.cache(args[0], order=tuple(args[1:]) or None),
            "undo": lambda: core.undo(), "reset": lambda: core.reset(),
            "tune": lambda: core.tune(int(args[0]) if args else 10),
            "export": lambda: core.export(args[0]),
            "place": lambda: _terminal_place(core, args),
        }
        if cmd not in actions:
            return f"unknown command {cmd!r}; type help"
        result = actions[cmd]()
    except (ValueError, IndexError) as err:
        return f"error: {err or 'missing argument'} (type help)"
    text = str(result)
    return text + ("\n" + _marked_text(core) if result.applied else "")


def _terminal_place(core: ScheduleEditor, args: list[str]) -> ActionResult:
    if args and args[0].isdigit():
        return core.place(core.stage, int(args[0]), args[1] if len(args) > 1 else None)
    return core.place(args[0], int(args[1]), args[2] if len(args) > 2 else None)


def main(argv=None) -> int:
    """`python -m looptool.notebook [WORKLOAD]`: the editor in a terminal (reads commands from stdin)."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m looptool.notebook",
                                     description="Edit a workload's schedule in the terminal: legality and "
                                                 "speed after every change.")
    parser.add_argument("workload", nargs="?", default="matmul:128x128x128",
                        help="matmul:MxKxN, softmax:RxC, layernorm:RxC or module:function (as for looptool tune)")
    args = parser.parse_args(argv)
    from tuner import workloads
    work = workloads.resolve(args.workload)
    core = ScheduleEditor(work)
    interactive = sys.stdin.isatty()
    print(f"looptool schedule editor: {core.name} (type help)\n")
    print(_marked_text(core))
    print(core.current)
    try:
        while True:
            try:
                line = input(f"{core.stage}:{core.loop}> " if interactive else "")
            except EOFError:
                break
            if not interactive:
                print(f"> {line}")
            out = run_command(core, line)
            if out is None:
                break
            if out:
                print(out)
    finally:
        core.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
