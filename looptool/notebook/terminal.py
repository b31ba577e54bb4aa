"""The editor in a terminal, for people without Jupyter: `python -m looptool.notebook [WORKLOAD]`.

`run_command` runs one line-oriented command (see `TERMINAL_HELP`) on a
`ScheduleEditor` and returns the text to print; `main` reads commands from stdin.
"""
from __future__ import annotations

import shlex
import sys

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
            "place": lambda: _terminal_place(core, args),
        }
        if cmd not in actions:
            return f"unknown command {cmd!r}; type help"
        result = actions[cmd]()
    except (ValueError, IndexError) as err:
        return f"error: {err or 'missing argument'} (type help)"
    text = str(result)
    return text + ("\n" + _marked(core) if result.applied else "")


def _marked(core: ScheduleEditor) -> str:
    return marked_text(core.tree, core.stage, core.loop)


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
