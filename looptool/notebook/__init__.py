"""Tune loop orders interactively: see legality and speed after every change.

Three layers, from the bottom up:

`ScheduleEditor` (plain Python, no widgets; `looptool.notebook.editor`) holds a
tensor's current loop tree and applies one transform at a time (split, reorder,
unroll, vectorize, parallel, place, cache), each on the selected stage and loop.
Every action returns an `ActionResult`: the isl verdict with its plain-words reason
and, for a legal schedule, its measured run time, GFLOP/s and speed-ups over the
default schedule and an optional NumPy baseline.  An illegal or refused transform
leaves the schedule unchanged.

`LoopTreeEditor` (`looptool.notebook.widget`) is a thin ipywidgets layer over it
(ipywidgets is imported only when one is built, so `import looptool` never needs it):

    from looptool.notebook import LoopTreeEditor
    LoopTreeEditor(c, baseline=lambda: a_np @ b_np)     # last expression of a cell

`python -m looptool.notebook [WORKLOAD]` (`looptool.notebook.terminal`) is the same
editor as a line-oriented terminal program, for people without Jupyter.
"""
from .editor import MAX_RELATIVE_ERROR, ActionResult, ScheduleEditor, estimate_flops
from .render import line_nodes, marked_text, tree_html
from .terminal import TERMINAL_HELP, main, run_command
from .widget import LoopTreeEditor, log_html, status_html

__all__ = ["MAX_RELATIVE_ERROR", "ActionResult", "ScheduleEditor", "estimate_flops", "line_nodes", "marked_text",
           "tree_html", "TERMINAL_HELP", "main", "run_command", "LoopTreeEditor", "log_html",
           "status_html"]
