"""Printing loop trees: one line per loop, buffer and statement."""
from __future__ import annotations

from .. import ir

DTYPE_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}


def loop_text(node) -> str:
    """A loop's header line: name, extent, tail limits and annotation."""
    lp = node.loop
    text = f"for {lp.name} in 0..{lp.extent}"
    if node.limits:
        text += " while " + " and ".join(
            f"{'' if lim.coeff == 1 else str(lim.coeff) + '*'}{lp.name} + {lim.rest} < {lim.bound}"
            for lim in node.limits)
    if lp.annotation:
        text += f"  [{lp.annotation}]"
    return text


def buffer_text(buf) -> str:
    """A buffer plan as dtype[shape] kind (and how a blocked dim is kept)."""
    shape = ", ".join(map(str, buf.shape))
    blocks = f", {buf.block[0]} in blocks of {buf.block[1]}" if buf.block else ""
    return f"{DTYPE_SHORT[buf.dtype]}[{shape}] {buf.kind}{blocks}"


def stmt_text(stmt) -> str:
    """A statement as one line of pseudo-code."""
    stage = stmt.stage
    target = f"{stage.name}[{', '.join(stage.dims)}]"
    if stmt.kind == "init":
        return f"{target} = {_identity_text(stage.reduce_op)}"
    value = expr_text(stage.expr)
    if stmt.kind == "assign":
        return f"{target} = {value}"
    if stage.reduce_op == "sum":
        return f"{target} += {value}"
    return f"{target} = {stage.reduce_op}({target}, {value})"


def _identity_text(op: str) -> str:
    return {"sum": "0", "max": "-inf", "min": "inf"}[op]


def expr_text(e: ir.Expr) -> str:
    """A readable one-line rendering of an expression."""
    if isinstance(e, ir.Const):
        return repr(e.value)
    if isinstance(e, ir.Load):
        return f"{e.buffer}[{', '.join(str(i) for i in e.index)}]"
    if isinstance(e, ir.Select):
        guards = " and ".join(str(g) for g in e.guards)
        return f"({expr_text(e.then)} if {guards} else {expr_text(e.otherwise)})"
    if isinstance(e, ir.Cast):
        return f"{DTYPE_SHORT[e.dtype]}({expr_text(e.x)})"
    if isinstance(e, ir.Unary):
        return f"-{expr_text(e.x)}" if e.op == "neg" else f"{e.op}({expr_text(e.x)})"
    symbols = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
    if e.op in symbols:
        return f"({expr_text(e.a)} {symbols[e.op]} {expr_text(e.b)})"
    return f"{e.op}({expr_text(e.a)}, {expr_text(e.b)})"
