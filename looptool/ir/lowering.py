"""Lowering: a lazy graph becomes a Program of stages, plus the input arrays it reads."""
from __future__ import annotations

import numpy as np

from ..frontend import dtypes, graph
from .program import (Affine, Buffer, Cast, Const, Expr, Guard, Load, Program, Select, Stage, Unary, Binary)


def element_strides(array) -> tuple[int, ...]:
    """An array's strides counted in elements, not bytes."""
    return tuple(s // array.itemsize for s in array.strides)


class _Lowering:
    """Turns a graph into a Program, collecting the input arrays it reads."""

    def __init__(self, prepare_input):
        self.prepare_input = prepare_input
        self.inputs: list[Buffer] = []
        self.arrays: list[np.ndarray] = []
        self.input_ids: dict[int, str] = {}
        self.stages: list[Stage] = []
        self.stage_ids: dict[int, Stage] = {}

    def input_buffer(self, node: graph.Input) -> Buffer:
        name = self.input_ids.get(id(node))
        if name is None:
            array = self.prepare_input(node.array)
            if not whole_aligned_elements(array):
                array = array.copy(order="C")  # kernels address whole, aligned elements
            name = f"in{len(self.inputs)}"
            self.input_ids[id(node)] = name
            self.inputs.append(Buffer(name, node.dims, array.shape, array.dtype.name, element_strides(array)))
            self.arrays.append(array)
        return next(b for b in self.inputs if b.name == name)

    def stage_for(self, node: graph.Reduce) -> Stage:
        if id(node) not in self.stage_ids:
            identity = {d: Affine.var(d) for d in node.src.dims}
            # the accumulator is held in node.dtype but updated in the dtype that computes it
            expr = self.cast(self.expr(node.src, identity, False), dtypes.compute_dtype(node.dtype).name)
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
        if isinstance(node, graph.Cast):
            return self.cast(self.expr(node.src, index, guarded), dtype)
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


def whole_aligned_elements(array) -> bool:
    """Every element starts on a multiple of its size (device arrays, which have no `aligned` flag,
    are checked by their strides alone: device allocations are aligned)."""
    aligned = getattr(getattr(array, "flags", None), "aligned", True)
    return aligned and not any(s % array.itemsize for s in array.strides)


def lower(node: graph.Node, prepare_input=None) -> tuple[Program, list]:
    """Lower a graph to a Program plus the input arrays, in the order of `Program.inputs`.

    `prepare_input(array)`, when given, replaces each input array first (the runtime uses it
    to bring device arrays to the host); the IR itself knows nothing of devices."""
    lowering = _Lowering(prepare_input or (lambda array: array))
    if isinstance(node, graph.Reduce):
        lowering.stage_for(node)
    else:
        identity = {d: Affine.var(d) for d in node.dims}
        expr = lowering.expr(node, identity, False)
        lowering.stages.append(Stage(f"t{len(lowering.stages)}", node.dims, (), None, expr, node.dtype.name,
                                     node.dims))
    sizes = tuple(sorted(node.sizes.items()))
    return Program(tuple(lowering.inputs), tuple(lowering.stages), sizes), lowering.arrays
