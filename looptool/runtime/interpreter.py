"""A NumPy reference interpreter that executes a loop tree in its scheduled order.

Loops are run one iteration at a time in Python, except that a subtree holding a
single statement is run as one vectorized NumPy operation over all its loop
iterations (reductions through `ufunc.at`, which is exact for any order).  Any
subtree with two or more statements keeps its order, so a schedule that breaks
a dependence gives wrong numbers here too: that makes this a second oracle and
the brute-force side of the legality check's tests.
"""
from __future__ import annotations

import math

import numpy as np

from .. import ir
from ..frontend import dtypes
from ..schedule import LoopNode, LoopTree, Schedule, StmtNode
from .sizes import DynamicSizes

VECTOR_LIMIT = 1 << 18
IDENTITY = {"sum": 0.0, "max": -np.inf, "min": np.inf}
REDUCE_AT = {"sum": np.add.at, "max": np.maximum.at, "min": np.minimum.at}
UNARY = {
    "neg": np.negative, "exp": np.exp, "log": np.log, "tanh": np.tanh, "sqrt": np.sqrt, "abs": np.abs,
    "erf": lambda x: np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype),
    "reciprocal": np.reciprocal, "relu": lambda x: np.maximum(x, x.dtype.type(0)),
}
BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "maximum": np.maximum, "minimum": np.minimum,
}


def interpret(tree: LoopTree, arrays: list[np.ndarray]) -> np.ndarray:
    """Run the loop tree on the input arrays (in `program.inputs` order); return the output. A dynamic
    program runs at the sizes of the arrays: its schedule applied to the program at those sizes."""
    if tree.program.dynamic:
        tree = at_sizes(tree, arrays)
    memory: dict[str, np.ndarray] = {b.name: a for b, a in zip(tree.program.inputs, arrays)}
    for plan in tree.buffers.values():
        if plan.kind != "input":
            memory[plan.name] = np.full(plan.shape or (1,), np.nan, dtype=plan.dtype)
    with np.errstate(all="ignore"):
        _Runner(tree, memory).run(tree.root, {})
    output = tree.program.output.name
    return memory[output].reshape(tree.buffers[output].shape)


def at_sizes(tree: LoopTree, arrays: list[np.ndarray]) -> LoopTree:
    """A dynamic program's loop tree at the sizes of `arrays` (read and checked as a kernel call does):
    the program with those sizes fixed (`ir.with_fixed_sizes`) under the same schedule steps."""
    program = tree.program
    dynamic = DynamicSizes.of_program(program, [f"input {buf.name}" for buf in program.inputs])
    for buf, array in zip(program.inputs, arrays):
        if np.ndim(array) != len(buf.dims):
            raise ValueError(f"input {buf.name} has dims {buf.dims}; got an array of shape {np.shape(array)}")
    fixed = ir.with_fixed_sizes(program, dict(zip(dynamic.dims, dynamic.of(arrays))))
    return LoopTree(fixed, Schedule.default(fixed).apply(tree.schedule.steps))


class _Runner:
    def __init__(self, tree: LoopTree, memory: dict[str, np.ndarray]):
        self.tree, self.memory = tree, memory

    def run(self, body: list, env: dict):
        for node in body:
            if isinstance(node, StmtNode):
                self.statement(node, env, True)
            elif _count_statements(node) == 1 and _grid_size(node) <= VECTOR_LIMIT:
                self.vectorized(node, env)
            else:
                for value in range(_trip_count(node, env)):
                    self.run(node.body, {**env, node.loop.name: value})

    def vectorized(self, node: LoopNode, env: dict):
        """Run a single-statement subtree over the full grid of its loop values at once."""
        loops, mask, stmt = [], True, None
        cur = node
        while isinstance(cur, LoopNode):
            loops.append(cur)
            cur = cur.body[0]
        stmt = cur
        grid = dict(env)
        for axis, lp in enumerate(loops):
            shape = [1] * len(loops)
            shape[axis] = lp.loop.extent
            grid[lp.loop.name] = np.arange(lp.loop.extent).reshape(shape)
        for lp in loops:
            for lim in lp.limits:
                mask = mask & (lim.coeff * grid[lp.loop.name] + _affine(lim.rest, grid) < lim.bound)
        self.statement(stmt, grid, mask)

    def statement(self, stmt: StmtNode, env: dict, mask):
        """Run a statement at every point of `env` (scalars or broadcast grids) where `mask` holds."""
        stage = stmt.stage
        plan = self.tree.buffers[stage.name]
        dims = {d: _affine(a, env) for d, a in stmt.index.items()}
        shape = np.broadcast_shapes(np.shape(mask), *[np.shape(v) for v in (*dims.values(), *env.values())])
        mask = np.broadcast_to(mask, shape)
        values = {k: np.broadcast_to(v, shape)[mask] for k, v in (*env.items(), *dims.items())}
        full = ir.Affine.identity(stage.dims)
        count = int(mask.sum())
        target = tuple(np.broadcast_to(_affine(a, values), (count,)) for a in plan.element_index(full))
        target = target or (np.zeros(count, dtype=np.intp),)
        buf = self.memory[stage.name]
        if stmt.kind == "init":
            buf[target] = IDENTITY[stage.reduce_op]
            return
        value = np.broadcast_to(self.expr(stage.expr, values), (count,))
        if stmt.kind == "assign":
            buf[target] = value
        else:
            REDUCE_AT[stage.reduce_op](buf, target, value)

    def expr(self, e: ir.Expr, dims: dict):
        dtype = np.dtype(e.dtype)
        if isinstance(e, ir.Const):
            return dtype.type(e.value)
        if isinstance(e, ir.Load):
            plan = self.tree.buffers[e.buffer]
            index = [_affine(a, dims) for a in plan.element_index(e.index)]
            if e.clamped:
                index = [np.clip(ix, 0, n - 1) for ix, n in zip(index, plan.shape)]
            return self.memory[e.buffer][tuple(index) if index else 0]
        if isinstance(e, ir.Select):
            ok = True
            for g in e.guards:
                v = _affine(g.expr, dims)
                ok = ok & (v >= g.lo) & (v < g.hi)
            return np.where(ok, self.expr(e.then, dims), self.expr(e.otherwise, dims)).astype(dtype)
        if isinstance(e, ir.Cast):
            value = np.asarray(self.expr(e.x, dims))
            if dtype in dtypes.HALF_DTYPES:   # rounded from float32, as the compiled code does
                value = value.astype(np.float32)
            return value.astype(dtype)
        if isinstance(e, ir.Unary):
            return UNARY[e.op](np.asarray(self.expr(e.x, dims)))
        return BINARY[e.op](self.expr(e.a, dims), self.expr(e.b, dims))


def _affine(a: ir.Affine, values: dict):
    out = a.const
    for v, c in a.terms:
        out = out + c * values[v]
    return out


def _trip_count(node: LoopNode, env: dict) -> int:
    return min([node.loop.extent] + [lim.count(env) for lim in node.limits])


def _count_statements(node) -> int:
    if isinstance(node, StmtNode):
        return 1
    return sum(_count_statements(child) for child in node.body)


def _grid_size(node) -> int:
    size = 1
    while isinstance(node, LoopNode):
        size *= node.loop.extent
        node = node.body[0]
    return size
