"""The loop tree: a program under a schedule, as concrete nested loops and statements.

This is what the interpreter and the code generators walk and what users print.
Each statement knows the index of every dimension as an affine function of the
loop variables around it; each buffer knows its (possibly shrunk) shape and
where it lives.  Transforms on a `LoopTree` return a new tree.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import NamedTuple

from .. import ir
from ..hooks import Hook
from ..ir import Affine, Program
from .printing import buffer_text, loop_text, stmt_text
from .steps import BLOCK_AXES, COPIERS, GPU_AXES, Loop, Schedule, Tail, pipeline_annotation

LEGALITY = Hook("the legality check (LoopTree.check, assert_legal)", "looptool.analysis")
AUTOSCHEDULE = Hook("the automatic scheduler (LoopTree.auto)", "looptool.autoschedule")



@dataclass(frozen=True)
class Limit:
    """coeff * loop + rest < bound, with `rest` over outer loop variables."""

    rest: Affine
    coeff: int
    bound: int

    def count(self, outer: dict[str, int]) -> int:
        """The trip count this limit allows, given outer loop values."""
        room = self.bound - _eval_affine(self.rest, outer)
        return max(0, -(-room // self.coeff))


@dataclass(eq=False)
class LoopNode:
    loop: Loop
    limits: tuple[Limit, ...]
    body: list = field(default_factory=list)


@dataclass(eq=False)
class StmtNode:
    """kind: 'assign' (pure stage), 'init' or 'update' (reduction stage)."""

    stage: ir.Stage
    kind: str
    index: dict[str, Affine]


@dataclass(frozen=True)
class BufferPlan:
    """Where a buffer lives and how a full-coordinate index maps into it.

    kind: 'input', 'output', 'temp' (full size, made by the runtime) or 'local'
    (shrunk to one tile of the loops it is placed in). `offsets[d]` is subtracted
    from dimension d's index, `strides` are in elements. A temp with `block` (dim, size, outer
    stride) keeps that dim in blocks (`Schedule.block`): index i is at (i // size) * outer stride +
    (i % size) * its stride."""

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    kind: str
    offsets: tuple[tuple[str, Affine], ...] = ()
    block: tuple[str, int, int] | None = None

    @property
    def size(self) -> int:
        """Elements from the first to the last one (0 for a buffer with a dimension of size 0)."""
        if 0 in self.shape:
            return 0
        if self.block:
            return self.storage_shape[0] * self.block[2]
        return 1 + sum((n - 1) * abs(s) for n, s in zip(self.shape, self.strides))

    @property
    def storage_shape(self) -> tuple[int, ...]:
        """The shape of the memory the buffer takes, row-major: its shape, or with a block, the blocks
        (ceil(n / size): a `Size` for a dynamic dim) first and the blocked dim `size` long in its place."""
        if not self.block:
            return self.shape
        dim, size, _ = self.block
        n = self.shape[self.dims.index(dim)]
        blocks = n.divided(size) if isinstance(n, ir.Size) else -(-n // size)
        return (blocks, *(size if d == dim else extent for d, extent in zip(self.dims, self.shape)))

    def element_index(self, index: tuple[Affine, ...]) -> tuple[Affine, ...]:
        """Per-axis index into this buffer, for a load/store at full coordinates `index`."""
        offs = dict(self.offsets)
        return tuple(ix + offs[d].scale(-1) if d in offs else ix for d, ix in zip(self.dims, index))

    def linear_offset(self, index: tuple[Affine, ...]) -> Affine:
        """The element offset (in elements from the buffer's start) of an access at full coordinates
        (over loop variables, for a blocked buffer: its dim's block read off the terms `blocked` splits)."""
        linear = Affine()
        for d, ix, stride in zip(self.dims, self.element_index(index), self.strides):
            if self.block and d == self.block[0]:
                outer, ix = blocked(ix, self.block[1])
                linear = linear + outer.scale(self.block[2])
            linear = linear + ix.scale(stride)
        return linear


def blocked(index: Affine, size: int) -> tuple[Affine, Affine]:
    """(block, place in it) of an index over loop variables into a dim kept in blocks of `size`: the
    terms whose coefficients are multiples of `size` (and the constant's multiple) move the block, the
    rest the place (`LoopTree` checks that the rest stays within one block)."""
    outer = Affine.of({v: c // size for v, c in index.terms if c % size == 0}, index.const // size)
    inner = Affine.of({v: c for v, c in index.terms if c % size}, index.const % size)
    return outer, inner


@dataclass(frozen=True)
class ThreadSlice:
    """A block-level buffer each GPU thread touches only its own part of: the element offset is
    sum(coeffs[axis] * thread index) + a rest in [low, low + size) that is the thread's own slice."""

    coeffs: tuple[tuple[str, int], ...]
    low: int
    size: int


class LoopTree:
    """A program under a schedule: inspect it with str(), reshape it with the transform methods."""

    def __init__(self, program: Program, schedule: Schedule | None = None, reasons: tuple[str, ...] = ()):
        self.schedule = schedule or Schedule.default(program)
        self.reasons = reasons
        self.program = self.schedule.program
        self.buffers = _plan_buffers(self.program, self.schedule)

    # Building --------------------------------------------------------------------
    @property
    def root(self) -> list:
        """The loop nest: its top-level nodes."""
        return self._nest[0]

    @property
    def local_buffers(self) -> dict[int, list[BufferPlan]]:
        """The local buffers by the id of the loop node they are allocated in."""
        return self._nest[1]

    @cached_property
    def _nest(self) -> tuple[list, dict[int, list[BufferPlan]]]:
        """(root, local buffers), built on first use: a transform makes a tree of its schedule at each
        step, and the automatic rules read the nests of only some of them."""
        root: list = []
        local: dict[int, list[BufferPlan]] = {}
        for stage in self.program.stages:
            if self.schedule.of(stage.name).consumer is None:
                self._emit_stage(stage, root, [], local)
        return root, local

    def _emit_stage(self, stage: ir.Stage, container: list, path: list[LoopNode], local: dict):
        sched = self.schedule.of(stage.name)
        loops = self.schedule.effective_loops(stage.name)
        tails = self.schedule.effective_tails(stage.name)
        first_reduce = next((i for i, lp in enumerate(loops) if lp.dim in stage.reduce_dims), len(loops))
        if self.buffers[stage.name].kind == "local":
            local.setdefault(id(path[-1]), []).append(self.buffers[stage.name])

        def nest(depth: int, body: list, path: list[LoopNode]):
            hosted = self._hosted(stage.name, depth)
            for other in self.program.stages:
                if other.name in hosted:
                    self._emit_stage(other, body, path, local)
            if stage.reduce_op and depth == max(first_reduce, sched.at):
                pure = [lp for lp in loops[depth:] if lp.dim not in stage.reduce_dims]
                body.append(self._plain_nest(stage, "init", pure, tails, path))
            if depth == len(loops):
                body.append(StmtNode(stage, "update" if stage.reduce_op else "assign", _index_of(path)))
                return
            node = LoopNode(loops[depth], _limits(loops[depth], tails, path))
            body.append(node)
            nest(depth + 1, node.body, path + [node])

        nest(sched.at, container, path)

    def _hosted(self, stage: str, depth: int) -> set[str]:
        """Stages emitted at `depth` of `stage`'s nest: those placed there, and those placed at that
        depth in a stage that is itself placed deeper in `stage` (they share the same loops)."""
        hosted = set()
        for other in self.schedule.placed_in(stage):
            at = self.schedule.of(other).at
            if at == depth:
                hosted.add(other)
            elif at > depth:
                hosted |= self._hosted(other, depth)
        return hosted

    def _plain_nest(self, stage, kind, loops, tails, path):
        if not loops:
            return StmtNode(stage, kind, _index_of(path))
        node = LoopNode(loops[0], _limits(loops[0], tails, path))
        node.body.append(self._plain_nest(stage, kind, loops[1:], tails, path + [node]))
        return node

    # GPU memory ------------------------------------------------------------------
    @cached_property
    def thread_slices(self) -> dict[str, ThreadSlice]:
        """Local buffers placed outside thread-bound loops whose every access is inside them, with the
        same nonzero coefficient on each thread axis and a per-thread rest that keeps threads apart
        (mixed-radix): the GPU backend keeps each thread's slice in its registers, and the legality
        check refuses any dependence on them between threads."""
        by_buffer: dict[str, list] = {}
        for stmt, path in self.statements():
            for access in accesses(stmt):
                by_buffer.setdefault(access.buffer, []).append((stmt, path, access))
        slices = {}
        for node, path in self.walk():
            if not isinstance(node, LoopNode):
                continue
            for plan in self.local_buffers.get(id(node), []):
                found = _thread_slice(plan, by_buffer.get(plan.name, []), len(path) + 1)
                if found is not None:
                    slices[plan.name] = found
        return slices

    @cached_property
    def thread_private(self) -> dict[str, LoopNode]:
        """Local buffers placed in the body of a thread-bound loop or deeper, by the loop they are placed at:
        the GPU backend gives each thread its own copy."""
        private = {}
        for node, path in self.walk():
            if isinstance(node, LoopNode) and any(thread_bound(n) for n in path + [node]):
                private |= {plan.name: node for plan in self.local_buffers.get(id(node), [])}
        return private

    # Walking ---------------------------------------------------------------------
    def walk(self):
        """Yield (node, path of enclosing LoopNodes) for every node, depth first."""
        return walk(self.root)

    def statements(self) -> list[tuple[StmtNode, list[LoopNode]]]:
        return [(n, p) for n, p in self.walk() if isinstance(n, StmtNode)]

    # Transforms (each returns a new tree) -----------------------------------------
    def _stage(self, stage: str | None) -> str:
        return stage or self.program.output.name

    def split(self, loop: str, factor: int, stage: str | None = None) -> "LoopTree":
        """Split `loop` by `factor` into `loop.0` and `loop.1`; non-dividing factors get a tail."""
        return LoopTree(self.program, self.schedule.split(self._stage(stage), loop, factor))

    def reorder(self, *loops: str, stage: str | None = None) -> "LoopTree":
        """Put the named loops in the given order (in the positions they hold now)."""
        return LoopTree(self.program, self.schedule.reorder(self._stage(stage), *loops))

    def unroll(self, loop: str, stage: str | None = None) -> "LoopTree":
        """Fully unroll `loop`."""
        return LoopTree(self.program, self.schedule.annotate(self._stage(stage), loop, "unroll"))

    def vectorize(self, loop: str, stage: str | None = None) -> "LoopTree":
        """Run `loop` (an innermost loop) as SIMD lanes."""
        return LoopTree(self.program, self.schedule.annotate(self._stage(stage), loop, "vectorize"))

    def parallel(self, loop: str, stage: str | None = None) -> "LoopTree":
        """Run the iterations of `loop` on several CPU threads."""
        return LoopTree(self.program, self.schedule.annotate(self._stage(stage), loop, "parallel"))

    def cache(self, buffer: str, stage: str | None = None, order=None, readers=()) -> "LoopTree":
        """Read `buffer` in `stage` (and in the stages `readers`) through a copy stage `<buffer>.<stage>`
        laid out in `order` (then `place` the copy to pack just the tile a loop uses)."""
        return LoopTree(self.program, self.schedule.cache(self._stage(stage), buffer, order, tuple(readers)))

    def block(self, dim: str, size: int, stage: str | None = None) -> "LoopTree":
        """Store the temp `stage` computes with `dim` in blocks of `size` (see `Schedule.block`): fixed
        strides for a temp whose dynamic dim is not its first."""
        return LoopTree(self.program, self.schedule.block(self._stage(stage), dim, size))

    def cache_write(self, stage: str | None = None) -> "LoopTree":
        """Compute `stage` into a new stage `<stage>.acc` and make `stage` a copy of it; place the
        `.acc` stage inside the copy's loops to keep one tile of results (e.g. in GPU registers)."""
        return LoopTree(self.program, self.schedule.cache_write(self._stage(stage)))

    def rfactor(self, dim: str, factor: int, stage: str | None = None, interleaved: bool = False) -> "LoopTree":
        """Reduce over `dim` in two steps: a new stage `<stage>.rf` of one partial result per `factor`
        values of `dim` (every `parts`-th value, `interleaved`), then `stage` over the partials (see
        `Schedule.rfactor`)."""
        return LoopTree(self.program, self.schedule.rfactor(self._stage(stage), dim, factor, interleaved))

    def hoist(self, stage: str | None = None) -> "LoopTree":
        """Compute the factor of a reduction's product that leaves out some of its dims once, into a
        new stage `<stage>.f` (see `Schedule.hoist`): softmax values, not once per output column."""
        return LoopTree(self.program, self.schedule.hoist(self._stage(stage)))

    def share(self, stage: str) -> "LoopTree":
        """Compute the exp (log, tanh, erf) value that reduction `stage` and later stages all compute once,
        into a new stage `<stage>.e` that they read (see `Schedule.share`): a softmax's exp, not twice."""
        return LoopTree(self.program, self.schedule.share(stage))

    def epilogue(self, stage: str | None = None) -> "LoopTree":
        """Compute a pointwise stage in the write-back of the accumulator it reads (a contraction's bias,
        relu, scale or cast on the register tile, no second kernel; see `Schedule.epilogue`)."""
        return LoopTree(self.program, self.schedule.epilogue(self._stage(stage)))

    def inline(self, stage: str) -> "LoopTree":
        """Compute the pointwise `stage` where it is read, with no buffer of its own (see `Schedule.inline`)."""
        return LoopTree(self.program, self.schedule.inline(stage))

    def pad(self, multiples: dict[str, int], stage: str | None = None) -> "LoopTree":
        """Compute a sum of products on operands padded with zeros to whole `multiples` of the named
        dims (see `Schedule.pad`): matrix instructions that take whole tiles then run at any size."""
        return LoopTree(self.program, self.schedule.pad(self._stage(stage), multiples))

    def bind(self, loop: str, axis: str, stage: str | None = None) -> "LoopTree":
        """Map a loop's iterations onto GPU blocks or threads: axis 'block.x' ... 'thread.z'."""
        if axis not in GPU_AXES:
            raise ValueError(f"bind: unknown GPU axis {axis!r}; use one of {GPU_AXES}")
        return LoopTree(self.program, self.schedule.annotate(self._stage(stage), loop, axis))

    def pipeline(self, loop: str, stages: int = 2, in_flight: int | None = None,
                 stage: str | None = None, copier: str = "cp.async", persistent: int = 0) -> "LoopTree":
        """On a GPU, copy the input tiles placed inside block-level `loop` into shared memory
        asynchronously (cp.async), `stages - 1` iterations ahead, in `stages` rotating buffers.
        Each iteration waits until at most `in_flight` groups of copies are still running
        (default and most that is legal: stages - 2), then the block synchronizes. With
        copier='tma' (Hopper, wgmma operand tiles) one thread copies each tile with the tensor
        memory accelerator, and each iteration waits on its buffer's mbarrier instead. With
        `persistent` blocks (TMA), a grid of at most that many blocks runs every tile of the
        block-bound loops around `loop` (in groups of block.y rows), each block its tiles in turn,
        issuing the copies of its next tile while it finishes the current one."""
        if copier not in COPIERS:
            raise ValueError(f"pipeline: copier must be one of {COPIERS}, got {copier!r}")
        if not isinstance(stages, int) or stages < 2:
            raise ValueError(f"pipeline: stages must be an integer >= 2, got {stages!r}")
        in_flight = stages - 2 if in_flight is None else in_flight
        if not isinstance(in_flight, int) or in_flight < 0:
            raise ValueError(f"pipeline: in_flight must be a non-negative integer, got {in_flight!r}")
        if not isinstance(persistent, int) or persistent < 0 or (persistent and copier != "tma"):
            raise ValueError(f"pipeline: persistent must be a number of blocks >= 1 with copier='tma' (or 0: "
                             f"a block a tile), got {persistent!r} with copier {copier!r}")
        return LoopTree(self.program,
                        self.schedule.annotate(self._stage(stage), loop,
                                               pipeline_annotation(stages, in_flight, copier, persistent)))

    def tensorize(self, loops, instruction: str, stage: str | None = None) -> "LoopTree":
        """Compute the tile of the loops `(m, n, k)` of a contraction with one matrix instruction on
        the GPU, e.g. `t.tensorize(("m.1", "n.1", "k.1"), "mma.m16n8k16")` (a warp) or
        "wgmma.m64n256k16" (a warpgroup, Hopper, operands in shared memory); two loops
        `(m, n)` of a stage that copies such a contraction's accumulator (`cache_write`) copy it out of
        the lanes' fragments. The CPU and the interpreter run them as plain loops. `check()` says
        what the instruction needs."""
        if len(loops) not in (2, 3):
            raise ValueError(f"tensorize: give the (m, n, k) loops of the tile, three names (or the (m, n) "
                             f"loops of a copy of its accumulator, two); got {loops!r}")
        m, n, k = (*loops, None)[:3]
        return LoopTree(self.program, self.schedule.tensorize(self._stage(stage), m, n, k, instruction))

    def place(self, stage: str, consumer: str | None, depth: int = 0) -> "LoopTree":
        """Compute `stage` inside the first `depth` loops of `consumer` (None: at the root)."""
        return LoopTree(self.program, self.schedule.place(stage, consumer, depth))

    def check(self) -> tuple[bool, str]:
        """(legal, reason): the isl verdict on this schedule, without raising."""
        return LEGALITY.get().check(self)

    def assert_legal(self) -> None:
        """Raise IllegalScheduleError (a ValueError) naming the dependence this schedule breaks."""
        LEGALITY.get().assert_legal(self)

    def auto(self) -> "LoopTree":
        """The automatic schedule of this tree's computation for this CPU (any reshaping of this
        tree is replaced); `explain()` on the result says why each choice was made."""
        return AUTOSCHEDULE.get().auto_tree(self.program)

    def explain(self) -> str:
        """One line per choice the automatic scheduler made for this tree, with its reason."""
        if not self.reasons:
            return "no automatic choices: this tree was not made by auto() (or was reshaped since)"
        return "\n".join(self.reasons)

    # Printing --------------------------------------------------------------------
    def __str__(self):
        lines = []
        for buf in self.buffers.values():
            if buf.kind != "local":
                lines.append(f"{buf.name}: {buffer_text(buf)}")

        def rec(body, indent):
            for node in body:
                pad = "  " * indent
                if isinstance(node, LoopNode):
                    lines.append(pad + loop_text(node))
                    for buf in self.local_buffers.get(id(node), []):
                        lines.append(pad + f"  {buf.name}: {buffer_text(buf)}")
                    rec(node.body, indent + 1)
                else:
                    lines.append(pad + stmt_text(node))
        rec(self.root, 0)
        return "\n".join(lines)

    def __repr__(self):
        return str(self)

    def _repr_pretty_(self, p, cycle):
        p.text(str(self))


def walk(body: list, path: list[LoopNode] | None = None):
    """Yield (node, path of enclosing LoopNodes below `body`) for every node in `body`, depth first."""
    path = path or []
    for node in body:
        yield node, path
        if isinstance(node, LoopNode):
            yield from walk(node.body, path + [node])


def thread_bound(node: LoopNode) -> bool:
    """Whether a loop is bound to GPU threads."""
    return node.loop.annotation.startswith("thread")


ATOMIC_SUMS = ("float32", "float64")     # sums the GPU adds into memory atomically


def across_blocks(stmt: StmtNode, path: list[LoopNode]) -> bool:
    """Whether a reduction's update runs inside a loop over a reduction dim bound to GPU blocks: each block
    then adds its terms into the result in memory (split-k's parts), zeroed before by the init's own kernel."""
    return stmt.kind == "update" and any(node.loop.annotation in BLOCK_AXES and node.loop.dim in stmt.stage.reduce_dims
                                         for node in path)


class Access(NamedTuple):
    """One buffer access of a statement, at full coordinates over the statement's dims."""

    buffer: str
    index: tuple[Affine, ...]
    write: bool


def accesses(stmt: StmtNode) -> list[Access]:
    """Every access of a statement, reads first (an update also reads its target)."""
    stage = stmt.stage
    own = Affine.identity(stage.dims)
    if stmt.kind == "init":
        return [Access(stage.name, own, True)]
    reads = [Access(ld.buffer, ld.index, False) for ld in ir.loads(stage.expr)]
    if stmt.kind == "update":
        reads.append(Access(stage.name, own, False))
    return reads + [Access(stage.name, own, True)]


def _thread_slice(plan: BufferPlan, accesses: list, depth: int) -> ThreadSlice | None:
    """The slice of each thread of the thread-bound loops below `depth` (the loops around the buffer's
    placement and its own), or None where an access lies outside them or threads' parts overlap."""
    coeffs, low, high = None, None, None
    for stmt, path, access in accesses:
        linear = plan.linear_offset(tuple(ix.substitute(stmt.index) for ix in access.index))
        terms = linear.coeffs()
        threads = [n for n in path[depth:] if thread_bound(n)]
        axes = {n.loop.annotation: terms.get(n.loop.name, 0) for n in threads}
        if not threads or len(axes) < len(threads) or 0 in axes.values() or coeffs not in (None, axes):
            return None
        coeffs = axes
        rest = [(c, n.loop.extent) for n in path if not thread_bound(n) for c in [terms.get(n.loop.name, 0)]]
        rest_low = linear.const + sum(c * (e - 1) for c, e in rest if c < 0)
        rest_high = linear.const + sum(c * (e - 1) for c, e in rest if c > 0)
        low = rest_low if low is None else min(low, rest_low)
        high = rest_high if high is None else max(high, rest_high)
        radix = sorted([(abs(c), n.loop.extent) for n in threads for c in [axes[n.loop.annotation]]] +
                       [(abs(c), e) for c, e in rest if c])
        reach = 0
        for c, e in radix:
            if c <= reach:
                return None
            reach += c * (e - 1)
    if coeffs is None:
        return None
    return ThreadSlice(tuple(sorted(coeffs.items())), low, high - low + 1)


def _eval_affine(a: Affine, values: dict[str, int]) -> int:
    return a.const + sum(c * values[v] for v, c in a.terms)


def _index_of(path: list[LoopNode]) -> dict[str, Affine]:
    index: dict[str, Affine] = {}
    for node in path:
        lp = node.loop
        index[lp.dim] = index.get(lp.dim, Affine()) + Affine.var(lp.name, lp.stride)
    return index


def _limits(loop: Loop, tails: tuple[Tail, ...], path: list[LoopNode]) -> tuple[Limit, ...]:
    """Tails whose innermost loop is `loop` (all others are already on the path)."""
    outer = {node.loop.name for node in path}
    out = []
    for tail in tails:
        names = dict(tail.terms)
        if loop.name in names and all(n in outer for n in names if n != loop.name):
            rest = Affine.of({n: c for n, c in names.items() if n != loop.name})
            out.append(Limit(rest, names[loop.name], tail.bound))
    return tuple(out)


def _plan_buffers(program: Program, schedule: Schedule) -> dict[str, BufferPlan]:
    plans = {b.name: BufferPlan(b.name, b.dims, b.shape, b.strides, b.dtype, "input") for b in program.inputs}
    for stage in program.stages:
        full = tuple(program.size(d) for d in stage.dims)
        sched = schedule.of(stage.name)
        kind = "output" if stage is program.output else "temp"
        plan = BufferPlan(stage.name, stage.dims, full, ir.row_major_strides(full), stage.dtype, kind)
        if sched.consumer is not None:
            plan = _shrunk(program, schedule, stage, plan) or plan
        if sched.blocks:
            plan = _blocked_plan(plan, *sched.blocks[0])
        plans[stage.name] = plan
    return plans


def _blocked_plan(plan: BufferPlan, dim: str, size: int) -> BufferPlan:
    """A full-size temp's plan with `dim` kept in blocks of `size` (`Schedule.block`)."""
    if plan.kind != "temp":
        raise ValueError(f"block: {plan.name} is a {plan.kind} buffer; only a temp made by the runtime takes blocks")
    inner = tuple(size if d == dim else n for d, n in zip(plan.dims, plan.shape))
    if any(isinstance(n, ir.Size) for n in inner):
        raise ValueError(f"block of {plan.name}: its other dims must have fixed sizes, got {plan.shape}")
    strides = ir.row_major_strides(inner)
    return replace(plan, strides=strides, block=(dim, size, inner[0] * strides[0]))


def _inside(schedule: Schedule, stage: str, consumer: str, depth: int) -> bool:
    """Whether `stage` is `consumer`, or runs inside its first `depth` loops (placed there, or placed in a
    stage that runs there)."""
    sched = schedule.of(stage)
    if stage == consumer or sched.consumer is None:
        return stage == consumer
    if sched.consumer == consumer:
        return sched.at >= depth
    return _inside(schedule, sched.consumer, consumer, depth)


def _shrunk(program: Program, schedule: Schedule, stage: ir.Stage, plan: BufferPlan) -> BufferPlan | None:
    """The local buffer of a placed stage, or None when it must stay full size."""
    sched = schedule.of(stage.name)
    readers = program.readers(stage.name)
    if not readers or any(not _inside(schedule, r.name, sched.consumer, sched.at) for r in readers):
        return None
    shared = schedule.effective_loops(stage.name)[:sched.at]
    own = schedule.effective_loops(stage.name)[sched.at:]
    shapes, offsets = [], []
    for axis, d in enumerate(stage.dims):
        plain = all(ld.index[axis] == Affine.var(d)
                    for r in readers for ld in ir.loads(r.expr) if ld.buffer == stage.name)
        shared_d = [lp for lp in shared if lp.dim == d]
        if plain and shared_d:
            span = 1 + sum(lp.stride * (lp.extent - 1) for lp in own if lp.dim == d)
            size = program.size(d)
            if isinstance(size, ir.Size):   # a tile of fixed loops, or the whole dynamic dim (refused by legality)
                dynamic = any(isinstance(lp.extent, ir.Size) for lp in own if lp.dim == d)
                shapes.append(size if dynamic else span)
            else:
                shapes.append(min(span, size))
            offsets.append((d, Affine.of({lp.name: lp.stride for lp in shared_d})))
        else:
            shapes.append(program.size(d))
    if not offsets:
        return None
    shape = tuple(shapes)
    return BufferPlan(stage.name, stage.dims, shape, ir.row_major_strides(shape), stage.dtype, "local", tuple(offsets))
