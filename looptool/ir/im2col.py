"""A convolution as a gather and a matrix product (im2col): a one-stage contraction that reads one
operand through windows (`window`, `pad`: affine indexes and guards) and the other as a plain array
becomes two programs. The gather writes each window's elements out as the columns of a matrix
[k, m] (k: the reduction's dims, m: the windowed operand's output dims); the product then multiplies it
with the other operand, viewed as a matrix of its merged dims, on the matrix templates (tensor cores
for half precision). The product's result holds the contraction's elements in its own layout.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .program import Affine, Binary, Buffer, Cast, Expr, Load, Program, Stage, index_vars, loads, plain_dims


@dataclass(frozen=True)
class Im2col:
    """The two programs of `im2col` and where their inputs come from: `gather` reads the input at
    `windowed` (an index into the original program's inputs); `product` reads the gather's result
    (viewed as its first input, [k, m]) and the input at `other`, viewed as its second input."""

    gather: Program
    product: Program
    windowed: int
    other: int


def im2col(program: Program) -> Im2col | None:
    """`program` as a gather and a matrix product, where it is one sum over the product of a windowed
    operand and a plain one: every reduced dim indexes both, every kept dim one of them, the result
    lays out the windowed operand's dims and the other's in two runs, and the plain operand's reduced
    dims and kept dims each lie back to back in memory. None where it is not."""
    if len(program.stages) != 1 or program.dynamic:
        return None
    stage = program.output
    if stage.reduce_op != "sum" or not isinstance(stage.expr, Binary) or stage.expr.op != "mul":
        return None
    sides = [stage.expr.a, stage.expr.b]
    plain = [_plain_load(_uncast(side), program) for side in sides]
    if plain.count(None) != 1:
        return None
    w_side = plain.index(None)
    windowed, other = sides[w_side], plain[1 - w_side]
    operand = list(loads(windowed))
    if len(operand) != 1 or not _is_input(operand[0].buffer, program):
        return None
    window_vars, other_dims = index_vars(windowed), list(plain_dims(other))
    m = [d for d in stage.dims if d in window_vars and d not in other_dims]
    n = [d for d in stage.dims if d in other_dims and d not in window_vars]
    k = [d for d in other_dims if d in stage.reduce_dims]
    if not m or not n or len(m) + len(n) != len(stage.dims) or set(k) != set(stage.reduce_dims) \
            or not set(k) <= window_vars or tuple(stage.dims) not in (tuple(m + n), tuple(n + m)):
        return None
    other_buffer = _input(other.buffer, program)
    if not _in_runs(other_dims, k, n) or [d for d in other_dims if d in n] != n:
        return None
    gather = _gather_program(program, _uncast(windowed), k, m)
    product = _product_program(program, stage, gather, other_buffer, other_dims, k, m, n, w_side)
    if product is None:
        return None
    inputs = [buffer.name for buffer in program.inputs]
    return Im2col(gather, product, inputs.index(operand[0].buffer), inputs.index(other.buffer))


def _uncast(expr: Expr) -> Expr:
    while isinstance(expr, Cast):
        expr = expr.x
    return expr


def _recast(template: Expr, inner: Expr) -> Expr:
    """`inner` under the chain of casts that `template` has above its first non-cast expression."""
    if isinstance(template, Cast):
        return Cast(_recast(template.x, inner), template.dtype)
    return inner


def _is_input(name: str, program: Program) -> bool:
    return any(buffer.name == name for buffer in program.inputs)


def _input(name: str, program: Program) -> Buffer:
    return next(buffer for buffer in program.inputs if buffer.name == name)


def _plain_load(expr: Expr, program: Program) -> Load | None:
    """`expr` where it reads a whole input at one distinct dim an axis, else None."""
    if not isinstance(expr, Load) or not _is_input(expr.buffer, program):
        return None
    dims = plain_dims(expr)
    shape = _input(expr.buffer, program).shape
    if dims is None or len(set(dims)) != len(dims) or any(program.size(d) != size for d, size in zip(dims, shape)):
        return None
    return expr


def _in_runs(dims: list[str], *groups: list[str]) -> bool:
    """Whether each of `groups` lies in `dims` as one unbroken run."""
    for group in groups:
        first = dims.index(group[0]) if group and group[0] in dims else None
        if first is None or dims[first:first + len(group)] != [d for d in dims if d in group]:
            return False
    return True


def _gather_program(program: Program, windowed: Expr, k: list[str], m: list[str]) -> Program:
    """The pointwise program writing the windowed operand's value at [k..., m...]."""
    dims = tuple(k + m)
    name = next(ld.buffer for ld in loads(windowed))
    stage = Stage("t0", dims, (), None, windowed, windowed.dtype, dims)
    return Program((_input(name, program),), (stage,), program.sizes)


def _merged(buffer: Buffer, dims: list[str], group: list[str]) -> tuple[int, int] | None:
    """(stride, position) of `group`'s axes of `buffer` merged into one, where they lie back to back."""
    axes = [dims.index(d) for d in group]
    for outer, inner in zip(axes, axes[1:]):
        if buffer.strides[outer] != buffer.strides[inner] * buffer.shape[inner]:
            return None
    return buffer.strides[axes[-1]], axes[0]


def _product_program(program: Program, stage: Stage, gather: Program, other: Buffer, other_dims: list[str],
                     k: list[str], m: list[str], n: list[str], w_side: int) -> Program | None:
    """result[m, n] (or [n, m], as the contraction's result lays them out) = sum over k of
    gathered[k, m] * other[k, n] (the other's axes merged in their own order), in the contraction's
    operand order and casts."""
    size = {d: program.size(d) for d in k + m + n}
    km, mm, nm = "k", "m", "n"
    extents = {km: math.prod(size[d] for d in k), mm: math.prod(size[d] for d in m),
               nm: math.prod(size[d] for d in n)}
    gathered = Buffer("in0", (km, mm), (extents[km], extents[mm]), gather.output.dtype, (extents[mm], 1))
    merged = {}
    for group, name in ((k, km), (n, nm)):
        found = _merged(other, other_dims, group)
        if found is None:
            return None
        merged[name] = found
    order = sorted(merged, key=lambda name: merged[name][1])
    second = Buffer("in1", tuple(order), tuple(extents[d] for d in order), other.dtype,
                    tuple(merged[d][0] for d in order))
    a = _recast((stage.expr.a, stage.expr.b)[w_side], Load("in0", (Affine.var(km), Affine.var(mm)), gather.output.dtype))
    b = _recast((stage.expr.a, stage.expr.b)[1 - w_side],
                Load("in1", tuple(Affine.var(d) for d in order), other.dtype))
    dims = (mm, nm) if stage.dims[0] in m else (nm, mm)
    expr = Binary("mul", *((a, b) if w_side == 0 else (b, a)))
    loop_dims = tuple(dict.fromkeys((km, mm) + tuple(order) if w_side == 0 else tuple(order) + (km, mm)))
    product = Stage(stage.name, dims, (km,), "sum", expr, stage.dtype, loop_dims)
    return Program((gathered, second), (product,), tuple(extents.items()))
