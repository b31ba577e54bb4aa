"""What the scheduler reads from a program's structure: strides of every access along every dim,
which dim is contiguous, and whether a stage is a contraction (a sum of products with reuse)."""
from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..ir import Program


def buffer_strides(program: Program, buffer: str) -> tuple[int, ...]:
    """Element strides of a buffer: an input's own, a stage's row-major ones."""
    for buf in program.inputs:
        if buf.name == buffer:
            return buf.strides
    shape = program.buffer_shape(buffer)
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def load_strides(program: Program, load: ir.Load) -> dict[str, int]:
    """How many elements the load's address moves when each dim grows by one (dims it uses only)."""
    strides: dict[str, int] = {}
    for axis, stride in zip(load.index, buffer_strides(program, load.buffer)):
        for dim, coeff in axis.terms:
            strides[dim] = strides.get(dim, 0) + coeff * stride
    return {d: s for d, s in strides.items() if s}


def dims_read(program: Program, stage: ir.Stage, buffer: str) -> set[str]:
    """The dims whose loops move the stage's reads of `buffer`."""
    return {d for load in ir.loads(stage.expr) if load.buffer == buffer for d in load_strides(program, load)}


def store_strides(program: Program, stage: ir.Stage) -> dict[str, int]:
    """The strides of a stage's own (row-major) result along its dims."""
    return dict(zip(stage.dims, buffer_strides(program, stage.name)))


def inner_loads(program: Program, stage: ir.Stage) -> list[ir.Load]:
    """The loads of the stage's innermost loop: all of them, except that a reduction reads once per
    result, outside its reduction loops, what none of its reduction dims moves (softmax's row maximum)."""
    loads = list(ir.loads(stage.expr))
    if stage.reduce_op is None:
        return loads
    return [load for load in loads if set(load_strides(program, load)) & set(stage.reduce_dims)]


def unit_stride_count(program: Program, stage: ir.Stage, dim: str) -> int:
    """Accesses in the stage's innermost loop that are contiguous along `dim`: its inner loads, and its
    store when it is pure (a reduction stores once per result, outside its reduction loops)."""
    count = sum(1 for load in inner_loads(program, stage) if abs(load_strides(program, load).get(dim, 0)) == 1)
    return count + (stage.reduce_op is None and store_strides(program, stage).get(dim) == 1)


def scatter_cost(program: Program, stage: ir.Stage, dim: str) -> int:
    """What running `dim` as SIMD lanes costs in lanes gathered one by one: 1 for each inner load strided
    along it (a gather), 2 for a pure stage's store strided along it (a scatter: each lane writes part of
    another cache line, which the cache must read in first, where a contiguous store fills its lines)."""
    gathers = sum(1 for load in inner_loads(program, stage) if abs(load_strides(program, load).get(dim, 0)) > 1)
    return gathers + 2 * (stage.reduce_op is None and abs(store_strides(program, stage).get(dim, 0)) > 1)


def gathered_along(program: Program, stage: ir.Stage, vector: str) -> str | None:
    """For a vector dim whose inner loads are gathers, the other dim of the stage along which those loads
    are contiguous (a transpose's rows), or None: blocking it keeps each gathered line for a whole line."""
    for load in inner_loads(program, stage):
        strides = load_strides(program, load)
        if abs(strides.get(vector, 0)) > 1:
            dim = next((d for d, s in strides.items() if abs(s) == 1 and d != vector), None)
            if dim is not None and dim in stage.dims:
                return dim
    return None


def largest_stride(program: Program, stage: ir.Stage, dim: str) -> int:
    """The largest stride any access of the stage has along `dim` (0 when none uses it)."""
    strides = [abs(load_strides(program, load).get(dim, 0)) for load in ir.loads(stage.expr)]
    return max(strides + [store_strides(program, stage).get(dim, 0)])


@dataclass(frozen=True)
class Contraction:
    """A sum whose body multiplies an operand that does not depend on `row` (the `reused` one, read
    as vectors along `col`) by one that does not depend on `col` (broadcast along `col`): each
    loaded vector and each broadcast serves a whole register tile of rows x columns."""

    row: str
    col: str
    reused: str
    broadcast: str


def contraction(program: Program, stage: ir.Stage) -> Contraction | None:
    """The stage as a contraction, or None.  The columns are the output's innermost dim that pairs
    with a row dim; among rows, the one along which the broadcast operand is closest to contiguous."""
    if stage.reduce_op != "sum" or not stage.reduce_dims:
        return None
    loads = list(ir.loads(stage.expr))
    for col in reversed([d for d in stage.dims if program.size(d) > 1]):
        found = []
        for row in stage.dims:
            if row == col or program.size(row) == 1:
                continue
            reused = [ld for ld in loads if col in load_strides(program, ld) and row not in load_strides(program, ld)]
            broadcast = [ld for ld in loads if row in load_strides(program, ld) and col not in load_strides(program, ld)]
            if reused and broadcast:
                stride = abs(load_strides(program, broadcast[0])[row])
                found.append((stride, -stage.dims.index(row), Contraction(row, col, reused[0].buffer,
                                                                           broadcast[0].buffer)))
        if found:
            return min(found, key=lambda f: f[:2])[2]
    return None


def vector_dim(program: Program, stage: ir.Stage, dims: tuple[str, ...]) -> str | None:
    """Among `dims`, the one to run as SIMD lanes: the fewest lanes gathered or scattered (`scatter_cost`),
    then the most accesses contiguous along it, pure dims (a contiguous store) before reduction dims,
    inner dims before outer ones; None if all have size 1."""
    candidates = [d for d in dims if program.size(d) > 1]
    if not candidates:
        return None
    return max(candidates, key=lambda d: (-scatter_cost(program, stage, d), unit_stride_count(program, stage, d),
                                          d not in stage.reduce_dims, stage.loop_dims.index(d)))


def by_stride(program: Program, stage: ir.Stage, dims) -> list[str]:
    """Dims ordered for locality, outer to inner: the larger an access's stride along a dim, the
    further out its loop (ties keep the stage's own order)."""
    return sorted(dims, key=lambda d: -largest_stride(program, stage, d))


def is_plain_read(program: Program, producer: ir.Stage) -> bool:
    """Every read of `producer`'s result uses the plain index (its own dims, no offsets)."""
    plain = ir.Affine.identity(producer.dims)
    return all(ld.index == plain for reader in program.readers(producer.name)
               for ld in ir.loads(reader.expr) if ld.buffer == producer.name)
