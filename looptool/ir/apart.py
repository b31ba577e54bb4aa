"""A weighted sum apart from its weights: a program that ends in a sum over j of (a factor computed by its
earlier stages) x (a plain input), whose factor leaves out a dim of the result (an attention head: the
softmax of the scores, times v, summed over the positions j), becomes two programs. The first computes
the factor (its weights) as its result; the second is the weighted sum alone, a matrix product of that
result and the input, which gets the matrix templates (and split-k where its blocks leave SMs idle).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .program import (Affine, Binary, Buffer, Load, Program, Stage, hoistable_factor, index_vars, loaded_buffers,
                      plain_dims, row_major_strides)


@dataclass(frozen=True)
class Apart:
    """The two programs of `weights_apart`: `first` computes the weights from the original inputs at
    `inputs` (indexes into the original program's inputs, in `first`'s input order); `product` reads
    the weights as its first input and the original input at `other` as its second."""

    first: Program
    product: Program
    inputs: tuple[int, ...]
    other: int


def weights_apart(program: Program) -> Apart | None:
    """`program` as its weights and their weighted sum (see the module's docstring); None where its last
    stage is not a sum over one dim of a computed factor that leaves out one of its dims times a plain
    read of an input, or where the program has a dynamic dim."""
    if len(program.stages) < 2 or program.dynamic:
        return None
    result = program.output
    found = hoistable_factor(result)
    if result.reduce_op != "sum" or len(result.reduce_dims) != 1 or found is None:
        return None
    factor, other = found
    if not isinstance(other, Load) or plain_dims(other) is None or other.buffer not in _names(program.inputs):
        return None
    return _apart(program, factor, other, 0 if factor is result.expr.a else 1)


def _names(buffers) -> list[str]:
    return [buffer.name for buffer in buffers]


def _apart(program: Program, factor, other: Load, side: int) -> Apart | None:
    result = program.output
    dims = tuple(d for d in result.loop_dims if d in index_vars(factor))
    weights = Stage(f"{result.name}.f", dims, (), None, factor, factor.dtype, dims)
    earlier = program.stages[:-1]
    read = set().union(*(loaded_buffers(stage.expr) for stage in (*earlier, weights)))
    if other.buffer in read:            # (the weights read it too: nothing to gain)
        return None
    names = _names(program.inputs)
    inputs = tuple(index for index, name in enumerate(names) if name in read)
    first = Program(tuple(program.inputs[index] for index in inputs), (*earlier, weights), program.sizes)
    shape = tuple(program.size(d) for d in dims)
    matrix = Buffer("in0", dims, shape, weights.dtype, row_major_strides(shape))
    operand = replace(program.inputs[names.index(other.buffer)], name="in1")
    loaded = Load("in0", Affine.identity(dims), weights.dtype)
    moved = replace(other, buffer="in1")
    product_expr = Binary("mul", *((loaded, moved) if side == 0 else (moved, loaded)))
    product = Program((matrix, operand), (replace(result, expr=product_expr),), program.sizes)
    return Apart(first, product, inputs, names.index(other.buffer))
