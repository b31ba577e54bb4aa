"""Lowering: a lazy graph becomes a Program of stages, plus the input arrays it reads."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..frontend import dtypes, graph
from .program import (REPRESENTATIVE_SIZE, Affine, Binary, Buffer, Cast, Const, Expr, Guard, Load, Program, Select,
                      Size, Stage, Unary)


# Pointwise functions that cost tens of operations a value, where a load, add or multiply costs one.
TRANSCENDENTAL = ("exp", "log", "tanh", "erf")
# What a value costs many times a multiply for: those, and a division (one scalar division costs as much
# as a vector one, several cycles where a multiply-add issues twice a cycle).
COSTLY = TRANSCENDENTAL + ("div",)


def element_strides(array) -> tuple[int, ...]:
    """An array's strides counted in elements, not bytes."""
    return tuple(s // array.itemsize for s in array.strides)


class _Lowering:
    """Turns a graph into a Program, collecting the input arrays it reads."""

    def __init__(self, prepare_input, shared: set[int] = frozenset()):
        self.prepare_input, self.shared = prepare_input, shared
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
        if isinstance(node, graph.Ones):
            return Const(1.0, dtype)
        if isinstance(node, graph.Map) and id(node) in self.shared:
            stage = self.shared_stage(node)
            return Load(stage.name, tuple(index[d] for d in node.dims), dtype, guarded)
        if isinstance(node, graph.Map):
            return self.pointwise(node, index, guarded)
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

    def pointwise(self, node: graph.Map, index: dict[str, Affine], guarded: bool) -> Expr:
        """The value of a pointwise operation at `index`, its operands inlined (1 ± tanh(u) as
        `sigmoid_form`)."""
        found = halved_tanh_plus_one(node, self.shared) or tanh_plus_one(node, self.shared)
        if found is not None:
            tanh, sign, scaled = found
            u = self.cast(self.expr(tanh.args[0], index, guarded), node.dtype.name)
            numerator = Const(2.0, u.dtype) if scaled is None else self.cast(self.expr(scaled, index, guarded), u.dtype)
            return sigmoid_form(u, sign, numerator)
        args = [self.cast(self.expr(a, index, guarded), node.dtype.name) for a in node.args]
        return Unary(node.op, *args) if len(args) == 1 else Binary(node.op, *args)

    def shared_stage(self, node: graph.Map) -> Stage:
        """The pure stage that computes a costly value once (`separate_stages`)."""
        if id(node) not in self.stage_ids:
            expr = self.pointwise(node, {d: Affine.var(d) for d in node.dims}, False)
            stage = Stage(f"t{len(self.stages)}", node.dims, (), None, expr, node.dtype.name, node.dims)
            self.stages.append(stage)
            self.stage_ids[id(node)] = stage
        return self.stage_ids[id(node)]

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


def tanh_plus_one(node: graph.Node, shared: set[int] = frozenset()) -> tuple[graph.Map, int, None] | None:
    """(the tanh, sign, None) where `node` is 1 + tanh(u) or tanh(u) + 1 (sign 1) or 1 - tanh(u) (sign -1),
    its tanh not lowered as a stage of its own (`shared`); else None."""
    def tanh(arg: graph.Node) -> bool:
        return isinstance(arg, graph.Map) and arg.op == "tanh" and id(arg) not in shared
    if not isinstance(node, graph.Map) or node.op not in ("add", "sub") or len(node.args) != 2:
        return None
    a, b = node.args
    if scalar(a, 1.0) and tanh(b):
        return b, 1 if node.op == "add" else -1, None
    return (a, 1, None) if node.op == "add" and tanh(a) and scalar(b, 1.0) else None


def halved_tanh_plus_one(node: graph.Map, shared: set[int] = frozenset()) -> tuple[graph.Map, int, graph.Node] | None:
    """(the tanh, sign, x) where `node` is 0.5x times 1 ± tanh(u) (`tanh_plus_one`), as GELU's
    0.5x(1 + tanh(u)) has it: x / (1 + exp(∓2u)), with neither the 0.5 nor the 2 multiplied; else None."""
    if node.op != "mul" or len(node.args) != 2:
        return None
    for half, other in (node.args, node.args[::-1]):
        found = tanh_plus_one(other, shared)
        if found and isinstance(half, graph.Map) and half.op == "mul" and len(half.args) == 2:
            x = next((b for a, b in (half.args, half.args[::-1]) if scalar(a, 0.5)), None)
            if x is not None and id(half) not in shared:
                return found[0], found[1], x
    return None


def scalar(node: graph.Node, value: float) -> bool:
    """Whether `node` is the Python number `value`."""
    return isinstance(node, graph.Scalar) and node.value == value


def sigmoid_form(u: Expr, sign: int, numerator: Expr) -> Expr:
    """numerator / (1 + exp(-2 sign u)): with numerator 2, 1 + sign * tanh(u) (twice the logistic sigmoid of
    2 sign u); with x, 0.5x(1 + sign * tanh(u)). One exp and one division where tanh costs a polynomial, an
    exp and a division (GELU's 0.5x(1 + tanh(u)) took 1.6x XLA's time on AVX2), and no cancellation where
    tanh(u) nears -sign, where
    1 + sign * tanh(u) loses every digit (within 3 ulp of float64 where the result is a normal float32
    number, tests/ir/test_sigmoid_form.py). Where it is not (sign u < -43.7), exp(-2 sign u) overflows to
    inf and the result is 0, where 1 + sign * tanh(u) in float32 is 0 from sign u < -9.1 on."""
    grown = Unary("exp", Binary("mul", u, Const(-2.0 * sign, u.dtype)))
    return Binary("div", numerator, Binary("add", grown, Const(1.0, u.dtype)))


def is_sigmoid_form(expr: Expr) -> bool:
    """Whether `expr` is a `sigmoid_form` (what the lowering made of 1 ± tanh(u), or of 0.5x(1 ± tanh(u)))."""
    if not (isinstance(expr, Binary) and expr.op == "div"):
        return False
    total = expr.b
    if not (isinstance(total, Binary) and total.op == "add" and total.b == Const(1.0, total.b.dtype)):
        return False
    grown = total.a
    return isinstance(grown, Unary) and grown.op == "exp" and isinstance(grown.x, Binary) and grown.x.op == "mul" \
        and isinstance(grown.x.b, Const) and abs(grown.x.b.value) == 2.0


def whole_aligned_elements(array) -> bool:
    """Every element starts on a multiple of its size (device arrays, which have no `aligned` flag,
    are checked by their strides alone: device allocations are aligned)."""
    aligned = getattr(getattr(array, "flags", None), "aligned", True)
    return aligned and not any(s % array.itemsize for s in array.strides)


def separate_stages(root: graph.Node) -> set[int]:
    """The ids of the pointwise nodes lowered as stages of their own (never the root): shared
    transcendental values (`shared_transcendentals`) and costly factors of contractions (`costly_factors`)."""
    return (shared_transcendentals(root) | costly_factors(root)) - {id(root)}


def shared_transcendentals(root: graph.Node) -> set[int]:
    """The pointwise nodes whose value involves a transcendental function (exp, log, tanh, erf) that the
    bodies of two or more reductions read (an attention head's exp(scores - max), read by the row sum and
    by the weighted sum of values). Inlined, each reduction would compute them again; lowered as a stage
    of their own they are computed once, at full vector width."""
    readers: dict[int, set[int]] = {}
    for reduction in reductions(root):
        for node in pointwise_body(reduction.src):
            if isinstance(node, graph.Map) and node.op in TRANSCENDENTAL:
                readers.setdefault(id(node), set()).add(id(reduction))
    return {node for node, by in readers.items() if len(by) > 1}


def costly_factors(root: graph.Node) -> set[int]:
    """The factors of summed products (a contraction's operands) that are pointwise values costing a
    division or a transcendental function, and that the sum reads again for every value of one of its
    result's dims (they lack it): an attention head's exp(scores - max) / rowsum, the factor of its
    weighted sum of values. Inlined, the register tile would compute them one scalar at a time, once per
    column tile; lowered as a stage of their own they are computed once, at full vector width."""
    found = set()
    for reduction in reductions(root):
        product = reduction.src
        if reduction.op != "sum" or not isinstance(product, graph.Map) or product.op != "mul":
            continue
        for factor in product.args:
            reused = isinstance(factor, graph.Map) and set(reduction.dims) - set(factor.dims)
            if reused and any(isinstance(n, graph.Map) and n.op in COSTLY for n in pointwise_body(factor)):
                found.add(id(factor))
    return found


def reductions(root: graph.Node) -> list[graph.Reduce]:
    """The reductions of the graph below `root`."""
    return [n for n in graph_nodes(root) if isinstance(n, graph.Reduce)]


def graph_nodes(root: graph.Node) -> list[graph.Node]:
    """Every node of the graph below `root` (and `root`), each once."""
    seen, order, todo = set(), [], [root]
    while todo:
        node = todo.pop()
        if id(node) not in seen:
            seen.add(id(node))
            order.append(node)
            todo.extend(node.children())
    return order


def pointwise_body(node: graph.Node) -> list[graph.Node]:
    """The nodes a stage's expression inlines from `node` down: every node above a reduction's result."""
    body, seen, todo = [], set(), [node]
    while todo:
        here = todo.pop()
        if id(here) in seen:
            continue
        seen.add(id(here))
        body.append(here)
        if not isinstance(here, graph.Reduce):
            todo.extend(here.children())
    return body


def lower(node: graph.Node, prepare_input=None, separate_costly: bool = False,
          planned: dict[str, int] | None = None) -> tuple[Program, list]:
    """Lower a graph to a Program plus the input arrays, in the order of `Program.inputs`.

    `prepare_input(array)`, when given, replaces each input array first (the runtime uses it
    to bring device arrays to the host); the IR itself knows nothing of devices. With
    `separate_costly`, a transcendental value that two reductions read and a costly factor of a
    contraction are stages of their own (`separate_stages`): the CPU runtime lowers so; the GPU's
    rules fuse such programs (an attention head's softmax and weighted sum) into one kernel instead,
    and want them inlined. A dynamic dim is planned at its size in `planned` (dim -> size), else at
    REPRESENTATIVE_SIZE (`with_dynamic_sizes`)."""
    shared = separate_stages(node) if separate_costly else set()
    lowering = _Lowering(prepare_input or (lambda array: array), shared)
    if isinstance(node, graph.Reduce):
        lowering.stage_for(node)
    else:
        identity = {d: Affine.var(d) for d in node.dims}
        expr = lowering.expr(node, identity, False)
        lowering.stages.append(Stage(f"t{len(lowering.stages)}", node.dims, (), None, expr, node.dtype.name,
                                     node.dims))
    sizes = tuple(sorted(node.sizes.items()))
    program = Program(tuple(lowering.inputs), tuple(lowering.stages), sizes)
    return (with_dynamic_sizes(program, node.dynamic, planned or {}) if node.dynamic else program), lowering.arrays


def with_dynamic_sizes(program: Program, dynamic: dict[str, int], planned: dict[str, int]) -> Program:
    """`program` with the sizes of its `dynamic` dims (dim -> minimum) replaced by `Size`s at their
    representative size (`planned`'s where it names the dim, else REPRESENTATIVE_SIZE; never below the
    minimum), so one program (and one kernel) stands for every size. Each array with a dynamic dim must
    have it first: strides then never depend on a dynamic size."""
    sizes = {d: Size(d, 1, max(planned.get(d, REPRESENTATIVE_SIZE), minimum)) for d, minimum in dynamic.items()}
    for dims, what in [(b.dims, f"input {b.name}") for b in program.inputs] + \
            [(st.dims, f"the result of stage {st.name}") for st in program.stages]:
        late = [d for d in dims[1:] if d in sizes]
        if late:
            raise NotImplementedError(f"dynamic dim '{late[0]}' is not the first axis of {what}, dims {dims}: a "
                                      f"dynamic dim must be the outermost axis of every array that has it (put an "
                                      f"operand that has '{late[0]}' first on the left)")
    inputs = tuple(replace(b, shape=tuple(sizes.get(d, n) for d, n in zip(b.dims, b.shape))) for b in program.inputs)
    return replace(program, inputs=inputs, sizes=tuple((d, sizes.get(d, n)) for d, n in program.sizes),
                   dynamic=tuple(sorted(dynamic.items())))


def with_fixed_sizes(program: Program, sizes: dict[str, int]) -> Program:
    """A dynamic program at one size of each dynamic dim (`sizes`: dim -> size): every `Size` of its
    inputs and dims replaced by that size, as if it had been lowered from arrays of those sizes."""
    def fixed(n):
        return -(-sizes[n.dim] // n.divisor) if isinstance(n, Size) else n
    inputs = tuple(replace(b, shape=tuple(fixed(n) for n in b.shape)) for b in program.inputs)
    return replace(program, inputs=inputs, sizes=tuple((d, fixed(n)) for d, n in program.sizes), dynamic=())
