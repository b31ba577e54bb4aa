"""The compute IR: stages of pointwise-plus-reduction statements over named dimensions.

A `Program` is a list of `Stage`s in dependence order.  Each stage writes one
buffer over its dimensions; a reduction stage also loops over reduction dims.
Pointwise work is inlined into the stage that uses it, so only reductions and the
final result own buffers: `(a * b).sum(k)` is one stage with no m×k×n temporary.
All values are frozen dataclasses, so a program is hashable and serves as the
structural part of the kernel cache key.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import graph


@dataclass(frozen=True)
class Affine:
    """sum(coeff * var) + const over named integer variables."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def var(name: str, coeff: int = 1) -> "Affine":
        return Affine(((name, coeff),), 0)

    @staticmethod
    def identity(dims: tuple[str, ...]) -> tuple["Affine", ...]:
        """The index of every element of an array over `dims`: one variable per dim."""
        return tuple(Affine.var(d) for d in dims)

    @staticmethod
    def of(coeffs: dict[str, int], const: int = 0) -> "Affine":
        return Affine(tuple(sorted((v, c) for v, c in coeffs.items() if c)), const)

    def coeffs(self) -> dict[str, int]:
        return dict(self.terms)

    def __add__(self, other: "Affine | int") -> "Affine":
        if isinstance(other, int):
            return Affine(self.terms, self.const + other)
        merged = self.coeffs()
        for v, c in other.terms:
            merged[v] = merged.get(v, 0) + c
        return Affine.of(merged, self.const + other.const)

    def scale(self, factor: int) -> "Affine":
        return Affine.of({v: c * factor for v, c in self.terms}, self.const * factor)

    def substitute(self, values: dict[str, "Affine"]) -> "Affine":
        out = Affine((), self.const)
        for v, c in self.terms:
            out = out + (values[v].scale(c) if v in values else Affine.var(v, c))
        return out

    def __str__(self):
        parts = [(v if c == 1 else f"{c}*{v}") for v, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts).replace("+ -", "- ")


@dataclass(frozen=True)
class Guard:
    """lo <= expr < hi."""

    expr: Affine
    lo: int
    hi: int

    def __str__(self):
        return f"{self.lo} <= {self.expr} < {self.hi}"


class Expr:
    """Base of the scalar expression tree computed by a statement."""

    dtype: str


@dataclass(frozen=True)
class Const(Expr):
    value: float
    dtype: str


@dataclass(frozen=True)
class Load(Expr):
    """buffer[index]; `clamped` loads clamp each index into bounds (they sit under a guard)."""

    buffer: str
    index: tuple[Affine, ...]
    dtype: str
    clamped: bool = False


@dataclass(frozen=True)
class Select(Expr):
    """`then` where every guard holds, else `otherwise`."""

    guards: tuple[Guard, ...]
    then: Expr
    otherwise: Expr

    @property
    def dtype(self):
        return self.then.dtype


@dataclass(frozen=True)
class Unary(Expr):
    op: str
    x: Expr

    @property
    def dtype(self):
        return self.x.dtype


@dataclass(frozen=True)
class Binary(Expr):
    op: str
    a: Expr
    b: Expr

    @property
    def dtype(self):
        return self.a.dtype


@dataclass(frozen=True)
class Cast(Expr):
    x: Expr
    dtype: str


@dataclass(frozen=True)
class Buffer:
    """An input array: its dims, shape, dtype and strides in elements."""

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...]


@dataclass(frozen=True)
class Stage:
    """buffer `name`[dims] = reduce_op over reduce_dims of `expr` (or just `expr`).

    `loop_dims` is every dim the statement iterates over, in the order the
    expression's dims appeared (the default loop order)."""

    name: str
    dims: tuple[str, ...]
    reduce_dims: tuple[str, ...]
    reduce_op: str | None
    expr: Expr
    dtype: str
    loop_dims: tuple[str, ...]


@dataclass(frozen=True)
class Program:
    """Input buffers, stages in dependence order (the last is the result) and dim sizes."""

    inputs: tuple[Buffer, ...]
    stages: tuple[Stage, ...]
    sizes: tuple[tuple[str, int], ...]

    def size(self, dim: str) -> int:
        return dict(self.sizes)[dim]

    @property
    def output(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        for st in self.stages:
            if st.name == name:
                return st
        raise KeyError(f"no stage named {name!r}; stages are {[s.name for s in self.stages]}")

    def buffer_shape(self, name: str) -> tuple[int, ...]:
        for buf in self.inputs:
            if buf.name == name:
                return buf.shape
        return tuple(self.size(d) for d in self.stage(name).dims)

    def readers(self, buffer: str) -> list[Stage]:
        """Stages whose expression loads `buffer`."""
        return [st for st in self.stages if buffer in loaded_buffers(st.expr)]


def loaded_buffers(expr: Expr) -> set[str]:
    """Names of all buffers an expression reads."""
    out: set[str] = set()
    for load in loads(expr):
        out.add(load.buffer)
    return out


def loads(expr: Expr):
    """Every Load in an expression, in evaluation order."""
    if isinstance(expr, Load):
        yield expr
    elif isinstance(expr, Select):
        yield from loads(expr.then)
        yield from loads(expr.otherwise)
    elif isinstance(expr, Unary | Cast):
        yield from loads(expr.x)
    elif isinstance(expr, Binary):
        yield from loads(expr.a)
        yield from loads(expr.b)


def element_strides(array: np.ndarray) -> tuple[int, ...]:
    return tuple(s // array.itemsize for s in array.strides)


class _Lowering:
    """Turns a graph into a Program, collecting the input arrays it reads."""

    def __init__(self, on_device: bool):
        self.on_device = on_device
        self.inputs: list[Buffer] = []
        self.arrays: list[np.ndarray] = []
        self.input_ids: dict[int, str] = {}
        self.stages: list[Stage] = []
        self.stage_ids: dict[int, Stage] = {}

    def input_buffer(self, node: graph.Input) -> Buffer:
        name = self.input_ids.get(id(node))
        if name is None:
            array = node.array
            if hasattr(array, "__cuda_array_interface__") and not self.on_device:
                from .runtime_gpu import to_host
                array = to_host(array)
            if any(s % array.itemsize for s in array.strides):
                array = np.ascontiguousarray(array)
            name = f"in{len(self.inputs)}"
            self.input_ids[id(node)] = name
            self.inputs.append(Buffer(name, node.dims, array.shape, array.dtype.name, element_strides(array)))
            self.arrays.append(array)
        return next(b for b in self.inputs if b.name == name)

    def stage_for(self, node: graph.Reduce) -> Stage:
        if id(node) not in self.stage_ids:
            identity = {d: Affine.var(d) for d in node.src.dims}
            expr = self.expr(node.src, identity, False)
            stage = Stage(f"t{len(self.stages)}", node.dims, node.reduce_dims, node.op, expr, node.dtype.name,
                          node.src.dims)
            self.stages.append(stage)
            self.stage_ids[id(node)] = stage
        return self.stage_ids[id(node)]

    def expr(self, node: graph.Node, index: dict[str, Affine], guarded: bool) -> Expr:
        """The value of `node` at `index` (dim name -> affine in loop dims)."""
        dtype = node.dtype.name
        if isinstance(node, graph.Input):
            buf = self.input_buffer(node)
            return Load(buf.name, tuple(index[d] for d in node.dims), dtype, guarded)
        if isinstance(node, graph.Scalar):
            return Const(node.value, dtype)
        if isinstance(node, graph.Map):
            args = [self.cast(self.expr(a, index, guarded), dtype) for a in node.args]
            return Unary(node.op, *args) if len(args) == 1 else Binary(node.op, *args)
        if isinstance(node, graph.Reduce):
            stage = self.stage_for(node)
            return Load(stage.name, tuple(index[d] for d in node.dims), dtype, guarded)
        if isinstance(node, graph.Pad):
            pos = index[node.new_dim] + (-node.before)
            inner = self.expr(node.src, {**index, node.dim: pos}, True)
            return Select((Guard(pos, 0, node.src.sizes[node.dim]),), inner, Const(node.value, dtype))
        if isinstance(node, graph.Window):
            pos = index[node.out_dim].scale(node.stride) + index[node.kernel_dim].scale(node.dilation) + (-node.before)
            if node.before == 0 and node.after == 0:
                return self.expr(node.src, {**index, node.dim: pos}, guarded)
            inner = self.expr(node.src, {**index, node.dim: pos}, True)
            return Select((Guard(pos, 0, node.src.sizes[node.dim]),), inner, Const(0.0, dtype))
        if isinstance(node, graph.Concat):
            return self.concat(node, index, guarded)
        raise TypeError(f"cannot lower graph node {type(node).__name__}")

    def concat(self, node: graph.Concat, index: dict[str, Affine], guarded: bool) -> Expr:
        dtype = node.dtype.name
        parts, start = [], 0
        for src, d in zip(node.srcs, node.src_dims):
            pos = index[node.new_dim] + (-start)
            parts.append((Guard(index[node.new_dim], start, start + src.sizes[d]),
                          self.cast(self.expr(src, {**index, d: pos}, True), dtype)))
            start += src.sizes[d]
        result = parts[-1][1]
        for guard, value in reversed(parts[:-1]):
            result = Select((guard,), value, result)
        return result

    @staticmethod
    def cast(expr: Expr, dtype: str) -> Expr:
        return expr if expr.dtype == dtype else Cast(expr, dtype)


def lower(node: graph.Node, on_device: bool = False) -> tuple[Program, list[np.ndarray]]:
    """Lower a graph to a Program plus the input arrays, in the order of `Program.inputs`.

    GPU arrays among the inputs are copied to the host unless `on_device`."""
    lowering = _Lowering(on_device)
    if isinstance(node, graph.Reduce):
        lowering.stage_for(node)
    else:
        identity = {d: Affine.var(d) for d in node.dims}
        expr = lowering.expr(node, identity, False)
        lowering.stages.append(Stage(f"t{len(lowering.stages)}", node.dims, (), None, expr, node.dtype.name,
                                     node.dims))
    sizes = tuple(sorted(node.sizes.items()))
    return Program(tuple(lowering.inputs), tuple(lowering.stages), sizes), lowering.arrays
