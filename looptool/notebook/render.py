"""Renderings of a loop tree with a selected stage and loop, for the editor's views.

`tree_html` is the HTML the widget shows (and `ScheduleEditor.html()` returns);
`marked_text` is the plain text the terminal prints.  Both depend only on the
loop tree, never on the editor, so the model and every view can use them.
"""
from __future__ import annotations

import html

from looptool.schedule.looptree import LoopNode, LoopTree


def tree_html(tree: LoopTree, stage: str | None = None, loop: str | None = None) -> str:
    """The loop tree as a <pre> block; the `loop` nodes of `stage` highlighted, its statements coloured."""
    lines = str(tree).split("\n")
    nodes = line_nodes(tree)
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


def marked_text(tree: LoopTree, stage: str, loop: str | None) -> str:
    """The loop tree as text, each line of a `loop` node of `stage` marked with '   <=='."""
    lines = str(tree).split("\n")
    nodes = line_nodes(tree)
    offset = len(lines) - len(nodes)
    at = tree.schedule.of(stage).at
    marked = set()
    for stmt, path in tree.statements():
        if stmt.stage.name == stage:
            marked.update(id(n) for n in path[at:] if n.loop.name == loop)
    return "\n".join(text + ("   <==" if offset >= 0 and i >= offset and nodes[i - offset] is not None
                             and id(nodes[i - offset]) in marked else "") for i, text in enumerate(lines))


def line_nodes(tree: LoopTree) -> list:
    """The node each printed line of `str(tree)` after the buffer list shows, depth first
    (None for the lines of a loop's local buffers)."""
    seq: list = []

    def rec(body):
        for node in body:
            seq.append(node)
            if isinstance(node, LoopNode):
                seq.extend([None] * len(tree.local_buffers.get(id(node), [])))
                rec(node.body)
    rec(tree.root)
    return seq
