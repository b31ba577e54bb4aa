"""Flattening a pointwise program's two innermost dims into one, where every array it touches lays
them out as one run of elements: a 1000 x 3001 pointwise chain becomes one loop of 3,003,000 elements,
which a GPU reads in 16-byte vectors although no row of 3001 floats starts aligned. Likewise a reduction's
two innermost reduced dims: a global pool's mean over (h, w) of an NCHW array becomes a mean over rows of
h * w contiguous elements, which the row rules take a block a row.
"""
from __future__ import annotations

from dataclasses import replace

from .program import Affine, Buffer, Load, Program, Stage, guards, loads, rewritten


def flattened(program: Program) -> Program:
    """`program` with its result's innermost dims merged into one, two at a time while `merged_last_two`
    can (a whole contiguous array becomes one flat dim), and a reduction's innermost reduced dims while
    `merged_reduced_pair` can; `program` itself where none can be."""
    merged = merged_last_two(program)
    if merged is program:
        merged = merged_reduced_pair(program)
    return program if merged is program else flattened(merged)


def merged_reduced_pair(program: Program) -> Program:
    """`program` with the last two loop dims (y, x) of a stage that reduces both merged into one dim `y_x` in
    every stage that runs over them, where that reads and writes the same elements: each such stage runs over y
    then x as its last two loop dims, reducing both (a global pool's mean) or neither (an instance norm's
    result, over them as its own last two dims), each read along them is at exactly [..., y, x] of a whole
    array with rows back to back (`_flat_read`), and no guard tests them. Else `program`."""
    if program.dynamic:
        return program
    inputs = {buffer.name: buffer for buffer in program.inputs}
    for stage in program.stages:
        if len(stage.loop_dims) < 2 or not set(stage.loop_dims[-2:]) <= set(stage.reduce_dims):
            continue
        y, x = stage.loop_dims[-2:]
        over = [st for st in program.stages if {y, x} & set(st.loop_dims)]
        if all(_flat_over(st, y, x) for st in over) and \
                all(_flat_read(ld, inputs, program, y, x) for st in program.stages for ld in loads(st.expr)):
            return _merged(program, over, y, x)
    return program


def _flat_over(stage: Stage, y: str, x: str) -> bool:
    """Whether a stage runs over y then x as its last two loop dims, reducing both (one after the other) or
    neither (then its own last two dims), and tests neither in a guard."""
    tested = {v for g in guards(stage.expr) for v, _ in g.expr.terms}
    reduced = y in stage.reduce_dims
    pair = stage.reduce_dims[-2:] == (y, x) if reduced else stage.dims[-2:] == (y, x)
    return stage.loop_dims[-2:] == (y, x) and pair and (x in stage.reduce_dims) == reduced and not tested & {y, x}


def _merged(program: Program, over: list[Stage], y: str, x: str) -> Program:
    """`program` with dims y and x (the last two of each stage in `over`, in its loops and in its dims or reduced
    dims) merged into one, in those stages, their reads and the inputs laid out so."""
    merged = program.fresh_dim(f"{y}_{x}")
    size = program.size(y) * program.size(x)
    sizes = tuple(item for item in program.sizes if item[0] not in (y, x)) + ((merged, size),)

    def merge(dims: tuple[str, ...]) -> tuple[str, ...]:
        return dims[:-2] + (merged,) if dims[-2:] == (y, x) else dims
    flat = {st.name: replace(st, dims=merge(st.dims), reduce_dims=merge(st.reduce_dims), loop_dims=merge(st.loop_dims),
                             expr=rewritten(st.expr, lambda ld: _flat_load(ld, y, x, merged))) for st in over}
    return Program(tuple(_flat_buffer(buffer, y, x, merged, size) for buffer in program.inputs),
                   tuple(flat.get(st.name, st) for st in program.stages), sizes)


def _flat_load(load: Load, y: str, x: str, merged: str) -> Load:
    if load.index[-2:] != (Affine.var(y), Affine.var(x)):
        return load
    return replace(load, index=load.index[:-2] + (Affine.var(merged),))


def merged_last_two(program: Program) -> Program:
    """`program` with its result's last two dims (y, x) merged into one dim `y_x` of their product, where
    that reads and writes the same elements: the program is pointwise, each input it reads along y or x
    is read at exactly [..., y, x] over its last two axes, whole (its extents y and x) and with rows
    back to back (its y stride is x times its x stride), and no guard tests y or x. Else `program`."""
    stages = program.stages
    if any(st.reduce_dims for st in stages) or len(program.output.dims) < 2 or program.dynamic:
        return program       # (a dynamic size times another would lose its symbol)
    y, x = program.output.dims[-2:]
    inputs = {buffer.name: buffer for buffer in program.inputs}
    flat = all(_flat_over(st, y, x) and all(_flat_read(ld, inputs, program, y, x) for ld in loads(st.expr))
               for st in stages)
    if not flat:
        return program
    return _merged(program, list(stages), y, x)


def _flat_read(load: Load, inputs: dict[str, Buffer], program: Program, y: str, x: str) -> bool:
    """Whether a load reads y and x, if at all, as [..., y, x] of a buffer whose last two dims they are, laid out
    with rows back to back; and a buffer whose last two dims are y and x (merged with them) only so."""
    uses = [i for i, index in enumerate(load.index) if {y, x} & {v for v, _ in index.terms}]
    ends = program.buffer_dims(load.buffer)[-2:] == (y, x)
    if not uses and not ends:
        return True
    if not ends or load.index[-2:] != (Affine.var(y), Affine.var(x)) or uses != [len(load.index) - 2, len(load.index) - 1]:
        return False
    buffer = inputs.get(load.buffer)
    if buffer is None:          # an earlier stage: laid out densely over its dims, which end (y, x)
        return True
    return buffer.shape[-2:] == (program.size(y), program.size(x)) \
        and buffer.strides[-2] == buffer.strides[-1] * program.size(x)


def _flat_buffer(buffer: Buffer, y: str, x: str, merged: str, size: int) -> Buffer:
    if buffer.dims[-2:] != (y, x):
        return buffer
    return Buffer(buffer.name, buffer.dims[:-2] + (merged,), buffer.shape[:-2] + (size,), buffer.dtype,
                  buffer.strides[:-2] + (buffer.strides[-1],))

