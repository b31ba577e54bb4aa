"""Register tiles kept in registers across their reduction loop, edge tiles included.

A plain loop whose body is only unrolled and vectorized loops around updates of results that do
not move with it (a matmul's k loop around its mr x nr tile), or a nest of such plain loops, each
the only node of the one around it (a convolution's c, kh, kw), loads each result once before the
outermost loop, updates it in a register (an alloca that LLVM promotes) and stores it once after.  LLVM
does this itself for a full tile, but not for an edge tile, whose vectorized loops stop short:
there the shared builder branches per vector between a full vector and a scalar tail loop, and
the updates go through memory every iteration.  Here an edge tile's short vector is one masked
vector (`llvm.masked.load`/`store`: no lane past the trip count is read or written) and an
unrolled copy past its trip count is skipped by a branch, so the tile's loop runs at the speed of
a full one.  Updates keep the loop tree's order, so results are the same bit for bit.
"""
from __future__ import annotations

import contextlib
from collections import defaultdict

from llvmlite import ir as llir

from .. import ir
from ..schedule import Limit, LoopNode, StmtNode, walk
from .llvm import I32, MEMORY_TYPE, VALUE_TYPE, ZERO, FunctionBuilder, Lanes, constant, shaped

Key = tuple  # (buffer, the offset's terms outside the tile, its constant)


class Accumulators:
    """The results one reduction loop's register tile updates, each in a register slot."""

    def __init__(self, builder: FunctionBuilder, nest: list[LoopNode]):
        self.builder, self.nest = builder, nest
        self.loops = {node.loop.name for node in nest}
        self.slots: dict[Key, llir.Value] = {}
        self.counts: dict[int, int] = {}      # unrolled loops emitted for one known trip count (`run_in_registers`)

    @classmethod
    def of(cls, builder: FunctionBuilder, node: LoopNode, versioned: bool = False,
           nested: bool = False) -> "Accumulators | None":
        """The accumulators of a plain loop around a register tile, or where `nested` of the nest of plain
        loops it heads (`nest`), or None for any other loop (and for one whose body has a guard-free copy,
        unless `versioned`: the caller chose the copy around it)."""
        if node.loop.annotation or (builder.versioned(node) and not versioned) or not node.body:
            return None
        found = cls(builder, nest(builder, node) if nested else [node])
        keys: list[tuple[Key, int]] = []
        tile = found.nest[-1].body
        if not found.fits(tile, {}, None, keys):
            return None
        return found if disjoint(keys) and not found.reads_results(tile, {k[0] for k, _ in keys}) else None

    # The loops it accepts ---------------------------------------------------------------
    def fits(self, nodes: list, copy: dict[str, int], lanes: Lanes | None, keys: list) -> bool:
        """Whether `nodes` are only unrolled and vectorized loops (their trip counts not moving with
        the reduction loop) around updates it can keep in registers; collects their (key, width)."""
        for node in nodes:
            if isinstance(node, StmtNode):
                if not self.fits_statement(node, copy, lanes):
                    return False
                keys.append((self.key(node, copy, lanes), lanes.width if lanes else 1))
                continue
            kind = node.loop.annotation
            if kind not in ("unroll", "vectorize") or \
                    any(self.loops & {v for v, _ in lim.rest.terms} for lim in node.limits):
                return False
            if kind == "vectorize":
                inner = Lanes(node.loop.name, node.loop.extent)
                if not all(isinstance(s, StmtNode) for s in node.body) or not self.fits(node.body, copy, inner, keys):
                    return False
                if self.tail(node) and not all(self.packed(s.stage.expr, s, inner) for s in node.body):
                    return False
                continue
            for k in range(node.loop.extent):
                if not self.fits(node.body, {**copy, node.loop.name: k}, None, keys):
                    return False
        return True

    def fits_statement(self, stmt: StmtNode, copy: dict[str, int], lanes: Lanes | None) -> bool:
        """An update of a float32/float64 result that the reduction loops do not move (packed along
        the vectorized loop, if any)."""
        stage = stmt.stage
        if stmt.kind != "update" or MEMORY_TYPE[stage.dtype] != VALUE_TYPE[stage.dtype]:
            return False
        coeffs = self.offset(stmt).coeffs()
        return not any(coeffs.get(name) for name in self.loops) and (lanes is None or coeffs.get(lanes.name) == 1)

    def packed(self, e: ir.Expr, stmt: StmtNode, lanes: Lanes) -> bool:
        """Whether `vector_expr` computes `e` from whole vectors (no lane computed alone)."""
        if isinstance(e, ir.Const):
            return True
        if isinstance(e, ir.Load) and not e.clamped and \
                self.builder.linear_offset(e.buffer, e.index, stmt).coeffs().get(lanes.name, 0) in (0, 1):
            return True
        if isinstance(e, ir.Load | ir.Select):
            return self.builder.lane_invariant(e, stmt, lanes)
        if isinstance(e, ir.Binary):
            return self.packed(e.a, stmt, lanes) and self.packed(e.b, stmt, lanes)
        return self.packed(e.x, stmt, lanes)

    def reads_results(self, nodes: list, buffers: set[str]) -> bool:
        """Whether any statement below reads a result kept in registers (it would read a stale value)."""
        for node in nodes:
            if isinstance(node, StmtNode):
                if ir.loaded_buffers(node.stage.expr) & buffers:
                    return True
            elif self.reads_results(node.body, buffers):
                return True
        return False

    def tail(self, node: LoopNode) -> bool:
        """Whether the loop may stop short here (a limit not known to hold in this copy of the code)."""
        return bool(node.limits) and id(node) not in self.builder.full

    def offset(self, stmt: StmtNode) -> ir.Affine:
        stage = stmt.stage
        return self.builder.linear_offset(stage.name, ir.Affine.identity(stage.dims), stmt)

    def key(self, stmt: StmtNode, copy: dict[str, int], lanes: Lanes | None) -> Key:
        """The result's place: its buffer, and its offset with the unrolled copy's values put in and
        the vectorized loop left out (its lanes follow from the first)."""
        offset = self.offset(stmt).substitute({name: ir.Affine.of({}, k) for name, k in copy.items()})
        terms = tuple(sorted((v, c) for v, c in offset.terms if lanes is None or v != lanes.name))
        return stmt.stage.name, terms, offset.const

    # Emitting ---------------------------------------------------------------------------
    def visit(self, nodes: list, env: dict, action, copy: dict[str, int] | None = None, lanes: Lanes | None = None):
        """Run `action(stmt, env, lanes, key)` for every statement copy below `nodes`, in the loop
        tree's order: unrolled copies past their trip count skipped, short vectors masked."""
        b, copy = self.builder.builder, copy or {}
        for node in nodes:
            if isinstance(node, StmtNode):
                action(node, env, lanes, self.key(node, copy, lanes))
                continue
            count = self.builder.trip_count(node, env)
            name, extent = node.loop.name, node.loop.extent
            if node.loop.annotation == "vectorize":
                mask = self.lane_mask(count, extent) if self.tail(node) else None
                self.visit(node.body, env, action, copy, Lanes(name, extent, mask))
                continue
            known = self.counts.get(id(node))
            for k in range(extent if known is None else known):
                value = constant(count.type, k)
                tail = self.tail(node) and known is None
                guard = b.if_then(b.icmp_signed("<", value, count)) if tail else contextlib.nullcontext()
                with guard:
                    self.visit(node.body, {**env, name: value}, action, {**copy, name: k}, lanes)

    def lane_mask(self, count: llir.Value, width: int) -> llir.Value:
        """<width x i1>: lane < count."""
        b = self.builder.builder
        lanes = constant(llir.VectorType(I32, width), list(range(width)))
        return b.icmp_signed("<", lanes, self.builder.splat(b.trunc(count, I32), width))

    def address(self, stmt: StmtNode, env: dict, lanes: Lanes | None):
        stage = stmt.stage
        first = env if lanes is None else {**env, lanes.name: ZERO}
        return self.builder.access(stage.name, ir.Affine.identity(stage.dims), False, stmt, first)

    def load(self, stmt: StmtNode, env: dict, lanes: Lanes | None, key: Key):
        """Before the loop: the result into its slot (inactive lanes zero)."""
        if key in self.slots:
            return
        stage, fb = stmt.stage, self.builder
        ty = shaped(VALUE_TYPE[stage.dtype], lanes.width if lanes else None)
        self.slots[key] = slot = fb.allocas.alloca(ty)
        value = fb.load_value(self.address(stmt, env, lanes), stage.dtype, None,
                              lanes.width if lanes else None, lanes.mask if lanes else None)
        fb.builder.store(value, slot)

    def update(self, stmt: StmtNode, env: dict, lanes: Lanes | None, key: Key):
        """In the loop: the slot updated by the statement's expression."""
        fb, stage, slot = self.builder, stmt.stage, self.slots[key]
        if lanes is None:
            evaluate = lambda e: fb.expr(e, stmt, env)  # noqa: E731
        else:
            evaluate = lambda e: fb.vector_expr(e, stmt, env, lanes)  # noqa: E731
        old = fb.builder.load(slot, typ=slot.allocated_type)
        fb.builder.store(fb.accumulate(stage.reduce_op, old, stage.expr, evaluate), slot)

    def store(self, stmt: StmtNode, env: dict, lanes: Lanes | None, key: Key):
        """After the loop: the slot back into the result (active lanes only), once."""
        slot = self.slots.pop(key, None)
        if slot is None:
            return
        fb = self.builder
        fb.store_value(fb.builder.load(slot, typ=slot.allocated_type), self.address(stmt, env, lanes),
                       stmt.stage.dtype, None, lanes.mask if lanes else None)


def run_in_registers(builder: FunctionBuilder, node: LoopNode, env: dict, count: llir.Value,
                     versioned: bool = False, nested: bool = False) -> bool:
    """Emit a plain reduction loop around a register tile with the tile's accumulators in registers
    (loaded before it, stored once after); False, emitting nothing, where `Accumulators.of` refuses it.
    `nested`: also across the nest of plain loops below it (the CPU; the GPU emits some plain loops its
    own way, a pipelined one among them, and keeps a tile across the innermost loop only)."""
    accumulators = Accumulators.of(builder, node, versioned, nested)
    if accumulators is None:
        return False
    edge = dynamic_edge(accumulators, node) or vector_edge(accumulators)
    if edge is None:
        _tile_loop(accumulators, node, env, count)
        return True
    unrolled, counted = edge
    b = builder.builder
    copies = builder.trip_count(counted, {**env, node.loop.name: ZERO})
    done = builder.fn.append_basic_block(f"{node.loop.name}.edges.done")
    switch = b.switch(copies, done)
    for known in range(1, unrolled.loop.extent + 1):
        block = builder.fn.append_basic_block(f"{node.loop.name}.edge{known}")
        switch.add_case(constant(copies.type, known), block)
        b.position_at_end(block)
        accumulators.counts[id(unrolled)] = known
        _tile_loop(accumulators, node, env, count)
        b.branch(done)
    b.position_at_end(done)
    return True


def _tile_loop(accumulators: Accumulators, node: LoopNode, env: dict, count: llir.Value):
    """The reduction loops with their tile's results loaded before them, updated in registers, stored after."""
    builder, loops = accumulators.builder, accumulators.nest
    tile = loops[-1].body
    outside = {**env, **{loop.loop.name: ZERO for loop in loops}}
    accumulators.visit(tile, outside, accumulators.load)

    def level(depth: int, here: dict, trips: llir.Value):
        loop = loops[depth]

        def step(i):
            inside = {**here, loop.loop.name: i}
            if depth + 1 == len(loops):
                accumulators.visit(tile, inside, accumulators.update)
            else:
                level(depth + 1, inside, builder.trip_count(loops[depth + 1], inside))
        builder.counted_loop(ZERO, trips, step, loop.loop.name, builder.around_register_tile(loop))
    level(0, env, count)
    accumulators.visit(tile, outside, accumulators.store)


# An edge tile's unrolled loop with a trip count known only at run time is emitted once per possible count
# up to this extent.
EDGE_COPIES = 16


def dynamic_edge(accumulators: Accumulators, node: LoopNode) -> tuple[LoopNode, LoopNode] | None:
    """The one unrolled loop of a register tile that may stop short at a bound known only at run time (a
    dynamic size), when its extent is at most EDGE_COPIES: the tile's loop is then emitted once per trip
    count it may run (a switch), each copy with no test per unrolled copy, as LLVM makes of a fixed size's
    edge tile by folding its constant count. None where there is no such loop (or more than one, or one
    whose count moves with another loop of the tile: it is then not one count for the whole tile); else
    the loop, twice (as `vector_edge`: the unrolled loop, and the loop whose trip count the switch takes)."""
    inside = {node.loop.name} | {inner.loop.name for inner, _ in walk(node.body) if isinstance(inner, LoopNode)}
    found = [inner for inner, _ in walk(node.body) if isinstance(inner, LoopNode)
             and inner.loop.annotation == "unroll" and accumulators.tail(inner)]
    if len(found) != 1 or found[0].loop.extent > EDGE_COPIES or \
            not any(isinstance(lim.bound, ir.Size) for lim in found[0].limits) or \
            any(name in inside for lim in found[0].limits for name, _ in lim.rest.terms):
        return None
    return found[0], found[0]


def vector_edge(accumulators: Accumulators) -> tuple[LoopNode, LoopNode] | None:
    """Where a register tile may be cut by the end of its vectorized dim: the unrolled loop over its vectors,
    and a loop of that extent whose trip count is the number of those vectors with a lane before the end
    (the switch of `run_in_registers` then emits the tile loop once per count, and a vector wholly past the
    end is neither loaded, multiplied nor stored). Before, such a vector was multiplied with every lane
    masked off: matmul 257x511x129's edge tile of 49 columns ran the 5 vectors of a full 5x80 tile for 4
    (Zen 4, AVX-512, 1 thread: 0.88x OpenBLAS, 0.96x without them). A switch, not a branch per vector: the
    count depends on loops outside the tile, unknown in the outlined body of a parallel loop over column
    tiles, and a branch per vector there made each multiply-add of the reduction loop a block of its own.
    None where there is no such loop, or more than one, or one whose count moves with the tile's loops."""
    nest = accumulators.nest
    inside = {n.loop.name for n in nest} | {n.loop.name for n, _ in walk(nest[-1].body) if isinstance(n, LoopNode)}
    found = []
    for unrolled, _ in walk(nest[-1].body):
        if not isinstance(unrolled, LoopNode) or unrolled.loop.annotation != "unroll" or len(unrolled.body) != 1:
            continue
        vector, name = unrolled.body[0], unrolled.loop.name
        if not isinstance(vector, LoopNode) or vector.loop.annotation != "vectorize" or not accumulators.tail(vector):
            continue
        limits = tuple(Limit(ir.Affine.of({v: c for v, c in lim.rest.terms if v != name}, lim.rest.const),
                             lim.rest.coeffs()[name], lim.bound)
                       for lim in vector.limits if lim.rest.coeffs().get(name, 0) > 0)
        if limits:
            found.append((unrolled, LoopNode(unrolled.loop, unrolled.limits + limits)))
    if len(found) != 1 or found[0][0].loop.extent > EDGE_COPIES or \
            any(v in inside for lim in found[0][1].limits for v, _ in lim.rest.terms):
        return None
    return found[0]


def nest(builder: FunctionBuilder, node: LoopNode) -> list[LoopNode]:
    """`node` and the plain loops below it, each the only node of the one around it and with no
    guard-free copy of its own, down to the first loop whose body is something else (the tile)."""
    loops = [node]
    while len(loops[-1].body) == 1 and isinstance(inner := loops[-1].body[0], LoopNode) and \
            not inner.loop.annotation and not builder.versioned(inner):
        loops.append(inner)
    return loops


def disjoint(keys: list[tuple[Key, int]]) -> bool:
    """Whether the results are one place each or do not overlap: per buffer, the same terms, and
    constants equal (one result) or at least a vector apart."""
    by_buffer: dict[str, dict[tuple, int]] = defaultdict(dict)
    for (buffer, terms, const), width in keys:
        places = by_buffer[buffer]
        if places and next(iter(places))[0] != terms:
            return False
        if places.setdefault((terms, const), width) != width:
            return False
    for places in by_buffer.values():
        spans = sorted((const, width) for (_, const), width in places.items())
        if any(c1 + w1 > c2 for (c1, w1), (c2, _) in zip(spans, spans[1:])):
            return False
    return True
