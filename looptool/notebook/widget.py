"""The editor as ipywidgets: `LoopTreeEditor`, a thin view over a `ScheduleEditor`.

ipywidgets is imported only when a `LoopTreeEditor` is built, so importing this
module (or `looptool`) never needs it:

    from looptool.notebook import LoopTreeEditor
    LoopTreeEditor(c, baseline=lambda: a_np @ b_np)     # last expression of a cell

`status_html` and `log_html` render the editor's verdict and action log as the HTML
the widget shows.
"""
from __future__ import annotations

import html
from typing import Callable

import numpy as np

from looptool.schedule.looptree import LoopTree

from .editor import VERDICTS, ActionResult, ScheduleEditor


def _ipywidgets():
    try:
        import ipywidgets
    except ImportError:
        raise ImportError("LoopTreeEditor needs ipywidgets: pip install 'looptool[notebook]' (or ipywidgets>=8); "
                          "without Jupyter, use ScheduleEditor or `python -m looptool.notebook`") from None
    return ipywidgets


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
                 ("export", "export", "lt.export the current schedule's kernel to the folder"),
                 ("use", "use in the function", "The edited lt.function runs this schedule from now on "
                                                "(calls of the example's signature)")]
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
            "export": lambda: self.core.export(self.path.value), "use": lambda: self.core.use(),
        }
        for key, fn in handlers.items():
            self.buttons[key].on_click(lambda _b, fn=fn, key=key: self._run(key, fn))

        b = self.buttons
        controls = w.VBox([
            w.HBox([self.stage_dropdown, self.loop_dropdown]),
            w.HBox([b["move_out"], b["move_in"], self.factor, b["split"], b["unroll"], b["vectorize"],
                    b["parallel"], b["clear"]]),
            w.HBox([self.consumer_dropdown, self.depth, b["place"], self.buffer_dropdown, self.order, b["cache"]]),
            w.HBox([b["undo"], self.trials, b["tune"], self.path, b["export"]]
                   + ([b["use"]] if self.core.function is not None else [])),
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
        """`ScheduleEditor.select`, then redraw the widgets."""
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
    use = _act("use")
    del _act

    @property
    def tree(self) -> LoopTree:
        """The current loop tree (`core.tree`)."""
        return self.core.tree

    @property
    def results(self) -> list[ActionResult]:
        """Every action's result so far (`core.results`)."""
        return self.core.results

    # Callbacks ---------------------------------------------------------------------------------
    def _run(self, key: str, fn):
        busy = {"tune": "tuning (this takes a while)…", "export": "exporting…"}.get(key, "checking and timing…")
        self.status.value = f'<div style="color:#555">{html.escape(busy)}</div>'
        try:
            fn()
        except Exception as err:   # a failure in a callback would otherwise vanish into the log
            self.core.record_error(key, err)
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
            self.buttons["undo"].disabled = not core.can_undo
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
    verdict = VERDICTS[last.status]
    color, word = verdict.colour, f"{verdict.mark} {verdict.word.lower()}"
    parts = [f'<div style="font-weight:bold;color:{color}">{word}: {html.escape(last.action)}</div>']
    if last.reason and last.reason != "legal":
        parts.append(f'<div style="color:{color};white-space:pre-wrap;font-size:12px">{html.escape(last.reason)}'
                     f"</div>")
    if not verdict.went_through:
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
        color = VERDICTS[r.status].colour
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
