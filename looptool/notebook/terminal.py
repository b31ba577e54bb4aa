"""The editor in a terminal, for people without Jupyter: `python -m looptool.notebook [WORKLOAD]`.

`run_command` runs one line-oriented command (see `TERMINAL_HELP`) on a
`ScheduleEditor` and returns the text to print; `main` reads commands from stdin.
"""
from __future__ import annotations

import importlib
import shlex
import sys

import numpy as np

from looptool import runtime
from .editor import ActionResult, ScheduleEditor
from .render import marked_text


#: The text of the terminal's `help` command.
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
  use                       an lt.function runs the current schedule from now on (this process)
  history | json | help | quit"""


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
            return _marked(core)
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
            "use": lambda: core.use(),
            "place": lambda: _terminal_place(core, args),
        }
        if cmd not in actions:
            return f"unknown command {cmd!r}; type help"
        result = actions[cmd]()
    except (ValueError, IndexError) as err:
        return f"error: {err or 'missing argument'} (type help)"
    text = str(result)
    return text + ("\n" + _marked(core) if result.applied else "")


def _edited(spec: str, example: list[str] | None) -> tuple[object, dict]:
    """What the terminal edits and `ScheduleEditor`'s options for it: a workload (`tuner.workloads.resolve`),
    or an lt.function named module:function with its example arrays (`example_arrays`)."""
    from tuner import workloads
    module, _, attribute = spec.partition(":")
    found = None
    if attribute and module not in workloads.BUILTIN:
        found = getattr(importlib.import_module(module), attribute, None)
    if isinstance(found, runtime.Function):
        if not example:
            raise ValueError(f"{spec} is an lt.function: give the shapes of its example arrays, one per "
                             f"parameter ({', '.join(name for name, _ in found.params)}), with --example")
        return found, {"example": example_arrays(example)}
    if example:
        raise ValueError(f"--example is for an lt.function; {spec} is a workload")
    return workloads.resolve(spec), {}


def example_arrays(shapes: list[str], seed: int = 0) -> tuple[np.ndarray, ...]:
    """Random normal arrays of shapes written SIZExSIZE... with an optional :DTYPE (default float32)."""
    rng, arrays = np.random.default_rng(seed), []
    for text in shapes:
        shape, _, dtype = text.partition(":")
        try:
            sizes = tuple(int(size) for size in shape.split("x")) if shape else ()
            arrays.append(rng.standard_normal(sizes).astype(dtype or "float32"))
        except (ValueError, TypeError) as err:
            raise ValueError(f"example shape {text!r}: write sizes like 64x32, optionally :float64 ({err})") from None
    return tuple(arrays)


def _marked(core: ScheduleEditor) -> str:
    return marked_text(core.tree, core.stage, core.loop)


def _terminal_place(core: ScheduleEditor, args: list[str]) -> ActionResult:
    if args and args[0].isdigit():
        return core.place(core.stage, int(args[0]), args[1] if len(args) > 1 else None)
    return core.place(args[0], int(args[1]), args[2] if len(args) > 2 else None)


def main(argv=None) -> int:
    """`python -m looptool.notebook [WORKLOAD] [--example SHAPE ...]`: the editor in a terminal (reads
    commands from stdin)."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m looptool.notebook",
                                     description="Edit a workload's schedule in the terminal: legality and "
                                                 "speed after every change.")
    parser.add_argument("workload", nargs="?", default="matmul:128x128x128",
                        help="matmul:MxKxN, softmax:RxC, layernorm:RxC or module:function (as for looptool tune; "
                             "an lt.function takes --example)")
    parser.add_argument("--example", nargs="+", metavar="SHAPE[:DTYPE]",
                        help="for an lt.function: the shapes of its example arrays, one per parameter, e.g. "
                             "64x32 32x16:float64 (random normal, float32 unless a dtype is given)")
    args = parser.parse_args(argv)
    try:
        target, options = _edited(args.workload, args.example)
        core = ScheduleEditor(target, **options)
    except ValueError as err:
        parser.error(str(err))
    interactive = sys.stdin.isatty()
    print(f"looptool schedule editor: {core.name} (type help)\n")
    print(_marked(core))
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
