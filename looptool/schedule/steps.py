"""Schedules: how each stage's loops are ordered, split, annotated and placed.

A schedule is data.  It is kept as the list of transform steps that produced it
(JSON-serializable, replayable on the same computation built again) together
with the per-stage state those steps lead to.  Every transform returns a new
Schedule; nothing is mutated.

Loops are named after their dimension; splitting loop `k` makes `k.0` (outer)
and `k.1` (inner), splitting `k.1` makes `k.1.0` and `k.1.1`, and so on, so
names survive later transforms.  A loop contributes `stride * value` to its
dimension's index.  Splits by factors that do not divide the extent record a
`Tail` bound, which the loop tree turns into a cheap trip-count limit.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace

from .. import ir
from ..ir import Program

BLOCK_AXES = ("block.x", "block.y", "block.z")
GPU_AXES = BLOCK_AXES + ("thread.x", "thread.y", "thread.z")
ANNOTATIONS = ("", "unroll", "vectorize", "parallel") + GPU_AXES
PIPELINE = "pipeline"      # annotation 'pipeline.<stages>.<in flight>[.tma[.<blocks>]]': see `pipeline_depth`
COPIERS = ("cp.async", "tma")


def pipeline_annotation(stages: int, in_flight: int, copier: str = "cp.async", persistent: int = 0) -> str:
    """The annotation of a loop whose copies into shared memory run `stages - 1` iterations ahead,
    waiting each iteration until at most `in_flight` groups of copies are still running; with
    copier 'tma', each tile is one bulk tensor copy that completes on its buffer's mbarrier; with
    `persistent` blocks (TMA only), that many blocks run every tile of the block-bound loops around
    it in turn, the copies of a block's next tile issued during its current one."""
    return f"{PIPELINE}.{stages}.{in_flight}" + (".tma" if copier == "tma" else "") \
        + (f".{persistent}" if persistent else "")


def pipeline_depth(annotation: str) -> tuple[int, int] | None:
    """(stages, copy groups left in flight at each wait) of a pipelined loop, or None for other loops."""
    parts = annotation.split(".")
    if len(parts) < 3 or parts[0] != PIPELINE or not (parts[1].isdigit() and parts[2].isdigit()) \
            or not (parts[3:] in ([], ["tma"]) or (len(parts) == 5 and parts[3] == "tma" and parts[4].isdigit())):
        return None
    return int(parts[1]), int(parts[2])


def pipeline_copier(annotation: str) -> str | None:
    """How a pipelined loop copies its tiles ('cp.async' or 'tma'); None for other loops."""
    if pipeline_depth(annotation) is None:
        return None
    return "tma" if annotation.split(".")[3:4] == ["tma"] else "cp.async"


def pipeline_persistent(annotation: str) -> int:
    """The blocks that run the tiles around a persistent pipelined loop in turn; 0 for other loops."""
    parts = annotation.split(".")
    return int(parts[4]) if pipeline_depth(annotation) and len(parts) == 5 else 0


# The matrix instructions `tensorize` maps a contraction's innermost loops onto, the tile each
# computes and the warps that run it together: mma.sync on one warp, and Hopper's wgmma on a
# warpgroup (4 warps) with both operands in shared memory. Its loops are annotated
# "<instruction>.m", ".n" and ".k".
# mma.sync's one shape; wgmma's 64 x N x 16 for every N it takes with 2-byte inputs (multiples of 8 to 256)
TENSOR_INSTRUCTIONS = {"mma.m16n8k16": {"m": 16, "n": 8, "k": 16, "warps": 1},
                       **{f"wgmma.m64n{n}k16": {"m": 64, "n": n, "k": 16, "warps": 4} for n in range(8, 257, 8)}}


@dataclass(frozen=True)
class Loop:
    """One loop of a stage: `extent` iterations, each adding `stride` to dimension `dim`."""

    name: str
    dim: str
    extent: int
    stride: int
    annotation: str = ""


def tensor_role(loop: "Loop") -> tuple[str, str] | None:
    """(instruction, role 'm', 'n' or 'k') of a tensorized loop; None for any other loop."""
    instruction, _, role = loop.annotation.rpartition(".")
    return (instruction, role) if instruction in TENSOR_INSTRUCTIONS else None


@dataclass(frozen=True)
class Tail:
    """sum(coeff * loop value) < bound: the constraint a non-dividing split leaves."""

    terms: tuple[tuple[str, int], ...]
    bound: int


@dataclass(frozen=True)
class StageSchedule:
    """A stage's own loops (outer to inner) and tails; placed inside the first `at` loops of `consumer`."""

    loops: tuple[Loop, ...]
    tails: tuple[Tail, ...] = ()
    at: int = 0
    consumer: str | None = None
    blocks: tuple[tuple[str, int], ...] = ()      # (dim, size): its buffer stores dim in blocks (`Schedule.block`)


@dataclass(frozen=True)
class Schedule:
    """Per-stage schedules of one program plus the steps that made them."""

    program: Program
    stages: tuple[tuple[str, StageSchedule], ...]
    steps: tuple[tuple, ...] = ()

    @staticmethod
    def default(program: Program) -> "Schedule":
        """Every stage at the root, loops in the order its expression's dims appeared, no splits."""
        return Schedule(program, tuple((st.name, _default_stage(program, st)) for st in program.stages))

    def of(self, stage: str) -> StageSchedule:
        for name, sched in self.stages:
            if name == stage:
                return sched
        raise ValueError(f"no stage named {stage!r}; stages are {[n for n, _ in self.stages]}")

    def effective_loops(self, stage: str) -> tuple[Loop, ...]:
        """All loops around the stage's statements: the shared ones of its consumer, then its own."""
        sched = self.of(stage)
        shared = self.effective_loops(sched.consumer)[:sched.at] if sched.consumer else ()
        return shared + sched.loops

    def effective_tails(self, stage: str) -> tuple[Tail, ...]:
        """The stage's own tails plus those of its consumer that involve only the shared loops."""
        sched = self.of(stage)
        if sched.consumer is None:
            return sched.tails
        shared = {lp.name for lp in self.effective_loops(sched.consumer)[:sched.at]}
        inherited = tuple(t for t in self.effective_tails(sched.consumer) if all(n in shared for n, _ in t.terms))
        return tuple(dict.fromkeys(inherited + sched.tails))

    def placed_in(self, stage: str) -> list[str]:
        """Stages placed inside `stage`'s loops."""
        return [name for name, s in self.stages if s.consumer == stage]

    def _with(self, stage: str, sched: StageSchedule, step: tuple | None) -> "Schedule":
        """This schedule with one stage's schedule replaced, and `step` (if any) recorded."""
        stages = tuple((n, sched if n == stage else s) for n, s in self.stages)
        return Schedule(self.program, stages, self.steps + ((step,) if step else ()))

    def _loop(self, stage: str, loop: str) -> tuple[int, Loop]:
        loops = self.of(stage).loops
        for i, lp in enumerate(loops):
            if lp.name == loop:
                return i, lp
        shared = [lp.name for lp in self.effective_loops(stage)[:self.of(stage).at]]
        where = f" ('{loop}' belongs to its consumer {self.of(stage).consumer})" if loop in shared else ""
        raise ValueError(f"stage {stage} has no loop '{loop}' of its own{where}; its loops are "
                         f"{[lp.name for lp in loops]}")

    def _check_not_shared(self, stage: str, position: int, what: str):
        """Refuse to reshape the own loop at `position` where a stage placed inside `stage` shares it
        (depths count the loops `stage` itself shares with its consumer first)."""
        for other in self.placed_in(stage):
            at = self.of(other).at
            if position + self.of(stage).at < at:
                loop = self.of(stage).loops[position].name
                raise ValueError(f"cannot {what} loop '{loop}' of stage {stage}: stage {other} is placed inside "
                                 f"it (at depth {at}); reshape {stage}'s outer loops before placing {other}")

    # Transforms ------------------------------------------------------------------
    def split(self, stage: str, loop: str, factor: int) -> "Schedule":
        """Split `loop` into `loop.0` (outer) and `loop.1` (inner, `factor` iterations)."""
        if not isinstance(factor, int) or factor < 1:
            raise ValueError(f"split of '{loop}' in stage {stage}: factor must be a positive integer, got {factor!r}")
        i, lp = self._loop(stage, loop)
        self._check_not_shared(stage, i, "split")
        sched = self.of(stage)
        factor = int(factor) if isinstance(lp.extent, ir.Size) else max(1, min(int(factor), lp.extent))
        tails = tuple(_split_tail(t, lp.name, f"{lp.name}.0", f"{lp.name}.1", factor) for t in sched.tails)
        tails = tuple(_inner_free(t, f"{lp.name}.1", factor) for t in tails)
        if isinstance(lp.extent, ir.Size):   # a dynamic extent: the tail is kept for every size
            outer = Loop(f"{lp.name}.0", lp.dim, lp.extent.divided(factor), lp.stride * factor, "")
            d = lp.extent.divisor      # x < ceil(n / d) is d*x < n
            tails += (Tail(((outer.name, factor * d), (f"{lp.name}.1", d)), lp.extent.whole()),)
        else:   # an empty loop splits into 0 x 1
            outer = Loop(f"{lp.name}.0", lp.dim, -(-lp.extent // factor), lp.stride * factor, "")
            if lp.extent % factor:
                tails += (Tail(((outer.name, factor), (f"{lp.name}.1", 1)), lp.extent),)
        inner = Loop(f"{lp.name}.1", lp.dim, factor, lp.stride, lp.annotation)
        loops = sched.loops[:i] + (outer, inner) + sched.loops[i + 1:]
        return self._with(stage, replace(sched, loops=loops, tails=tails), ("split", stage, loop, factor))

    def reorder(self, stage: str, *order: str) -> "Schedule":
        """Put the named loops in this order, in the positions they occupy now."""
        sched = self.of(stage)
        positions = sorted(self._loop(stage, name)[0] for name in order)
        if len(set(order)) != len(order):
            raise ValueError(f"reorder of stage {stage} names a loop twice: {order}")
        for pos in positions:
            self._check_not_shared(stage, pos, "reorder")
        loops = list(sched.loops)
        for pos, name in zip(positions, order):
            loops[pos] = self._loop(stage, name)[1]
        return self._with(stage, replace(sched, loops=tuple(loops)), ("reorder", stage, *order))

    def annotate(self, stage: str, loop: str, annotation: str) -> "Schedule":
        """Mark a loop 'unroll', 'vectorize', 'parallel', a GPU axis ('block.x', 'thread.y', ...),
        a pipeline ('pipeline.<stages>.<in flight>') or '' to clear it. CPU backends run GPU-bound and
        pipelined loops as plain loops."""
        if annotation not in ANNOTATIONS and pipeline_depth(annotation) is None:
            raise ValueError(f"unknown loop annotation {annotation!r}; use one of {ANNOTATIONS}")
        i, lp = self._loop(stage, loop)
        if isinstance(lp.extent, ir.Size) and annotation not in ("", "parallel", *BLOCK_AXES):
            raise ValueError(f"cannot mark loop '{loop}' of stage {stage} {annotation!r}: it runs {lp.extent} "
                             f"iterations, a number known only at run time (dynamic dim '{lp.dim}'); split it and "
                             f"mark the inner loop (or bind it to blocks: the grid is sized at launch)")
        sched = self.of(stage)
        loops = sched.loops[:i] + (replace(lp, annotation=annotation),) + sched.loops[i + 1:]
        return self._with(stage, replace(sched, loops=loops), ("annotate", stage, loop, annotation))

    def tensorize(self, stage: str, m: str, n: str, k: str | None, instruction: str) -> "Schedule":
        """Mark loops `m`, `n` and `k` of `stage` as the tile of one warp-level matrix instruction
        (`TENSOR_INSTRUCTIONS`); with `k` None, loops `m` and `n` of a copy of an accumulator, which
        each lane then writes from its own fragment. What the instruction needs (tile sizes, operand
        dtypes, innermost loops, the warp's lanes) is checked with the legality of the whole tree."""
        if instruction not in TENSOR_INSTRUCTIONS:
            raise ValueError(f"tensorize: unknown instruction {instruction!r}; use one of {tuple(TENSOR_INSTRUCTIONS)}")
        names = (m, n) if k is None else (m, n, k)
        if len(set(names)) != len(names):
            raise ValueError(f"tensorize: the m, n and k loops must be different loops, got {names}")
        sched = self.of(stage)
        loops = list(sched.loops)
        for role, name in zip("mnk", names):
            i, lp = self._loop(stage, name)
            loops[i] = replace(lp, annotation=f"{instruction}.{role}")
        return self._with(stage, replace(sched, loops=tuple(loops)), ("tensorize", stage, m, n, k, instruction))

    def place(self, stage: str, consumer: str | None, depth: int = 0) -> "Schedule":
        """Compute `stage` inside the first `depth` loops of `consumer` (None or depth 0: at the root).

        The stage keeps its own loops for whatever of its dims the shared loops do
        not cover, so its buffer shrinks to one tile of the consumer's loops.  Stages
        already placed inside `stage` are placed again at their depth of its new loops."""
        return self._placed(stage, consumer, depth)._with_steps(self.steps + (("place", stage, consumer, depth),))

    def _placed(self, stage: str, consumer: str | None, depth: int) -> "Schedule":
        if consumer is None or depth == 0:
            own_dims = self.program.stage(stage).loop_dims
            dims = [d for d in dict.fromkeys(lp.dim for lp in self.effective_loops(stage)) if d in own_dims]
            dims += [d for d in own_dims if d not in dims]
            moved = self._with(stage, StageSchedule(tuple(Loop(d, d, self.program.size(d), 1) for d in dims)), ())
        else:
            moved = self._with(stage, self._placement(stage, consumer, depth), ())
        for inner in moved.placed_in(stage):
            at = min(moved.of(inner).at, len(moved.effective_loops(stage)))
            moved = moved._placed(inner, stage, at)
        return moved

    def _placement(self, stage: str, consumer: str, depth: int) -> StageSchedule:
        consumer_loops = self.effective_loops(consumer)
        if not 0 <= depth <= len(consumer_loops):
            raise ValueError(f"cannot place {stage} at depth {depth} of {consumer}: it has "
                             f"{len(consumer_loops)} loops {[lp.name for lp in consumer_loops]}")
        if self._reaches(consumer, stage):
            raise ValueError(f"cannot place {stage} inside {consumer}: {consumer} is computed inside {stage}")
        shared = consumer_loops[:depth]
        shared_dims = {lp.dim for lp in shared}
        own_dims = set(self.program.stage(stage).loop_dims)
        current = self._own_cover(stage)
        own = tuple(lp for lp in current if lp.dim not in shared_dims)
        inner = tuple(replace(lp, annotation="") for lp in consumer_loops[depth:]
                      if lp.dim in shared_dims and lp.dim in own_dims)
        own_names, inner_names = {lp.name for lp in own}, {lp.name for lp in inner}
        from_consumer = tuple(t for t in self.effective_tails(consumer)
                              if {n for n, _ in t.terms} <= {lp.name for lp in shared} | inner_names
                              and any(n in inner_names for n, _ in t.terms))
        loops = {lp.name: lp for lp in shared + inner}
        from_consumer = tuple(t for t in from_consumer if not self._inside_blocks(stage, t, loops))
        kept = tuple(t for t in self.effective_tails(stage) if {n for n, _ in t.terms} <= own_names)
        return StageSchedule(inner + own, tuple(dict.fromkeys(from_consumer + kept)), depth, consumer)

    def _inside_blocks(self, stage: str, tail: Tail, loops: dict[str, Loop]) -> bool:
        """Whether a consumer's tail over a dynamic dim can be left out of a copy placed in it: the copy
        reads a temp kept in blocks along that dim (`block`), and the tail's loops stay inside one block
        besides whole blocks, so the rows past the dim's end that the copy then takes are the last
        block's, inside the temp's memory; the consumer's own tail still keeps them out of its results."""
        expr = self.program.stage(stage).expr
        if not isinstance(expr, ir.Load) or not _has_stage(self.program, expr.buffer) \
                or not self.of(expr.buffer).blocks or not isinstance(tail.bound, ir.Size):
            return False
        dim, size = self.of(expr.buffer).blocks[0]
        terms = [(loops[name], coeff) for name, coeff in tail.terms]
        if tail.bound.dim != dim or tail.bound.divisor != 1 or any(lp.dim != dim for lp, _ in terms):
            return False
        inside = [(lp, coeff) for lp, coeff in terms if coeff % size]
        return all(0 < coeff and not isinstance(lp.extent, ir.Size) for lp, coeff in inside) \
            and sum(coeff * (lp.extent - 1) for lp, coeff in inside) < size

    def _own_cover(self, stage: str) -> tuple[Loop, ...]:
        """The stage's loops over its own dims; dims its current loops do not cover get a plain loop."""
        own_dims = self.program.stage(stage).loop_dims
        loops = tuple(lp for lp in self.effective_loops(stage) if lp.dim in own_dims)
        covered = {lp.dim for lp in loops}
        return loops + tuple(Loop(d, d, self.program.size(d), 1) for d in own_dims if d not in covered)

    def _with_steps(self, steps: tuple) -> "Schedule":
        return Schedule(self.program, self.stages, steps)

    def cache(self, stage: str, buffer: str, order: tuple[str, ...] | None = None,
              readers: tuple[str, ...] = ()) -> "Schedule":
        """Read `buffer` in `stage` (and in the stages `readers`) through a copy: a new stage
        `<buffer>.<stage>` with the dims in `order`, before the first of them.

        Placed inside the stage's loops, the copy shrinks to the tile those loops
        use: this packs a panel of a matrix or relayouts filters contiguously; with `readers` placed
        there too, one copy of a row serves every stage that reads it."""
        consumers = [self.program.stage(name) for name in (stage, *readers)]
        loads = [ld for consumer in consumers for ld in ir.loads(consumer.expr) if ld.buffer == buffer]
        unread = [c.name for c in consumers if buffer not in ir.loaded_buffers(c.expr)]
        if unread:
            raise ValueError(f"cannot cache {buffer} in stage {unread[0]}: the stage does not read it")
        dims = self.program.buffer_dims(buffer)
        order = tuple(order) if order else dims
        if sorted(order) != sorted(dims):
            raise ValueError(f"cache of {buffer}: order {order} must list its dims {dims}")
        name = f"{buffer}.{stage}"
        if _has_stage(self.program, name):
            raise ValueError(f"stage {stage} already reads {buffer} through the copy {name}")
        dtype = loads[0].dtype
        copy = ir.Stage(name, order, (), None, ir.Load(buffer, ir.Affine.identity(dims), dtype),
                        dtype, order)
        position = min(self.program.stages.index(c) for c in consumers)
        program = self.program
        for consumer in consumers:
            rewired = ir.Stage(consumer.name, consumer.dims, consumer.reduce_dims, consumer.reduce_op,
                               _redirect(consumer.expr, buffer, name, dims, order), consumer.dtype,
                               consumer.loop_dims)
            program = _replaced(program, consumer, [rewired])
        program = replace(program, stages=program.stages[:position] + (copy,) + program.stages[position:])
        stages = list(self.stages)
        stages.insert(position, (name, _default_stage(program, copy)))
        step = ("cache", stage, buffer, list(order)) + ((list(readers),) if readers else ())
        return Schedule(program, tuple(stages), self.steps + (step,))

    def block(self, stage: str, dim: str, size: int) -> "Schedule":
        """Store the temp that `stage` computes with `dim` in blocks of `size`: dim // size before its
        first axis, dim % size in dim's place. A temp laid out (k, b) over a dynamic b then has fixed
        strides (its rows of b would be as long as b's run-time size): (ceil(B/size), k, size). Every
        access to it must keep dim % size within one block's loops (`LoopTree` checks)."""
        st = self.program.stage(stage)
        if st is self.program.output:
            raise ValueError(f"block: stage {stage} is the program's result, laid out as the caller's array")
        if dim not in st.dims or self.of(stage).blocks:
            raise ValueError(f"block of stage {stage}: '{dim}' must be one of its dims {st.dims}, "
                             f"and a stage takes one block")
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"block of stage {stage}: size must be a positive integer, got {size!r}")
        return self._with(stage, replace(self.of(stage), blocks=((dim, size),)), ("block", stage, dim, size))

    def cache_write(self, stage: str) -> "Schedule":
        """Compute `stage` into a new stage `<stage>.acc` that takes over its loops, and make
        `stage` a plain copy of it (same name, so its readers and the result are unchanged).

        Placed inside the copy's loops, `.acc` shrinks to one tile: a register tile of
        accumulators that survives a block-level reduction loop on a GPU."""
        original = self.program.stage(stage)
        name = f"{stage}.acc"
        if _has_stage(self.program, name):
            raise ValueError(f"stage {stage} already writes through {name}")
        acc = replace(original, name=name)
        copy = ir.Stage(stage, original.dims, (), None,
                        ir.Load(name, ir.Affine.identity(original.dims), original.dtype),
                        original.dtype, original.dims)
        program = _replaced(self.program, original, [acc, copy])
        sched = self.of(stage)
        kept = tuple(lp for lp in sched.loops if lp.dim in original.dims)
        kept_names = {lp.name for lp in kept}
        copy_sched = replace(sched, loops=kept, tails=tuple(t for t in sched.tails
                                                            if all(n in kept_names for n, _ in t.terms)))
        acc_sched = StageSchedule(self.effective_loops(stage), self.effective_tails(stage))
        stages = []
        for other, other_sched in self.stages:
            if other == stage:
                stages += [(name, acc_sched), (stage, copy_sched)]
            else:
                stages.append((other, replace(other_sched, consumer=name) if other_sched.consumer == stage
                               else other_sched))
        return Schedule(program, tuple(stages), self.steps + (("cache_write", stage),))

    def rfactor(self, stage: str, dim: str, factor: int, interleaved: bool = False) -> "Schedule":
        """Split the reduction over `dim` of `stage` in two: a new stage `<stage>.rf` keeps one partial
        result per block of `factor` values of `dim` (its new dim `<dim>_o`, reducing over `<dim>_i`),
        and `stage` reduces the partials over `<dim>_o`. The partials are independent, so they can run
        on different GPU blocks (a grid-wide reduction, split-k). `interleaved` partials each take every
        `parts`-th value instead (`dim` = `<dim>_o` + parts * `<dim>_i`), so neighbouring partials read
        neighbouring values at each step. Both stages start from their default loops, so rfactor comes
        before the stage's other steps."""
        original = self.program.stage(stage)
        if dim not in original.reduce_dims:
            raise ValueError(f"rfactor: {dim} is not a reduction dim of stage {stage} (it reduces over "
                             f"{original.reduce_dims or 'nothing'})")
        if not isinstance(factor, int) or factor < 1:
            raise ValueError(f"rfactor of {dim} in stage {stage}: factor must be a positive integer, got {factor!r}")
        self._check_untouched(stage, "rfactor")
        name = f"{stage}.rf"
        if _has_stage(self.program, name):
            raise ValueError(f"stage {stage} already reduces through {name}")
        size = self.program.size(dim)
        if isinstance(size, ir.Size):
            raise ValueError(f"rfactor of stage {stage}: '{dim}' is a dynamic dim; its last block of {factor} "
                             f"would be cut at {dim.upper()}, and the guards of the IR (which read a block's "
                             f"values only inside the dim) take fixed bounds only; rfactor a fixed reduction dim, "
                             f"or split '{dim}' (a split keeps its tail for every size)")
        factor = min(factor, max(size, 1))
        outer, inner = self.program.fresh_dim(f"{dim}_o"), self.program.fresh_dim(f"{dim}_i")
        parts = -(-size // factor)
        index = ir.Affine.of({outer: 1, inner: parts} if interleaved else {outer: factor, inner: 1})
        partial, final = _rfactored(original, name, dim, outer, inner, index, size, parts * factor != size)
        program = replace(_replaced(self.program, original, [partial, final]),
                          sizes=self.program.sizes + ((outer, parts), (inner, factor)))
        step = ("rfactor", stage, dim, factor) + ((True,) if interleaved else ())
        return self._replacing(stage, program, [partial, final], step)

    def pad(self, stage: str, multiples: dict[str, int] | list) -> "Schedule":
        """Compute the sum-of-products `stage` on its operands padded with zeros so that each dim in
        `multiples` is a whole number of that many: every input it reads along a padded dim is first
        copied into `<input>.<stage>.pad` (zeros past its end), the stage itself is computed into
        `<stage>.pad` over the padded dims (its extra results computed and dropped), and `stage`
        becomes a copy of the part of it inside the original sizes. Matrix instructions that take
        only whole tiles (mma, wgmma) then run at any size. Comes before the stage's other steps."""
        multiples = dict(multiples)
        original = self.program.stage(stage)
        if original.reduce_op != "sum" and set(multiples) & set(original.reduce_dims):
            raise ValueError(f"pad: stage {stage} takes the {original.reduce_op} over "
                             f"{original.reduce_dims}; zeros pad only a sum")
        unknown = [d for d in multiples if d not in original.loop_dims]
        if unknown or any(not isinstance(m, int) or m < 1 for m in multiples.values()):
            raise ValueError(f"pad of stage {stage}: {multiples} must map its dims {original.loop_dims} to "
                             f"positive integers")
        self._check_untouched(stage, "pad")
        dynamic = [d for d in multiples if isinstance(self.program.size(d), ir.Size)]
        if dynamic:
            raise ValueError(f"pad of stage {stage}: '{dynamic[0]}' is a dynamic dim; pad needs its size")
        program, new_stages = _padded(self.program, original, multiples)
        return self._replacing(stage, program, new_stages, ("pad", stage, [[d, m] for d, m in multiples.items()]))

    def hoist(self, stage: str) -> "Schedule":
        """Compute once the factor of `stage`'s product that does not vary along all of its loop dims:
        a new stage `<stage>.f` over the dims that factor uses (in `stage`'s loop order), which `stage`
        then reads. An attention head's weighted sum, sum over j of softmax(s)[i, j] * v[j, d], then
        takes each softmax value once, not once for every d as well. Comes before the stage's other steps."""
        original = self.program.stage(stage)
        factor, other = _hoistable_factor(original)
        self._check_untouched(stage, "hoist")
        name = f"{stage}.f"
        if _has_stage(self.program, name):
            raise ValueError(f"stage {stage} already reads its hoisted factor {name}")
        used = ir.index_vars(factor)
        dims = tuple(d for d in original.loop_dims if d in used)
        hoisted = ir.Stage(name, dims, (), None, factor, factor.dtype, dims)
        product = ir.Binary("mul", ir.Load(name, ir.Affine.identity(dims), factor.dtype), other)
        rewritten = replace(original, expr=product)
        program = _replaced(self.program, original, [hoisted, rewritten])
        return self._replacing(stage, program, [hoisted, rewritten], ("hoist", stage))

    def share(self, stage: str) -> "Schedule":
        """Compute once the transcendental value (exp, log, tanh, erf) in the body of the reduction `stage`
        that later stages compute again: a new stage `<stage>.e` over the dims that value uses (in `stage`'s
        loop order), which `stage` and those stages then read. A softmax's exp(x - max), which its sum and
        its division both compute, then costs one exp a value, not two. The other stages keep their names.
        Comes before the other steps of `stage` and of the stages that read the value."""
        original = self.program.stage(stage)
        value, readers = _shared_value(self.program, original)
        for name in (stage, *readers):
            self._check_untouched(name, "share")
        name = f"{stage}.e"
        if _has_stage(self.program, name):
            raise ValueError(f"stage {stage} already shares its value as {name}")
        dims = tuple(d for d in original.loop_dims if d in ir.index_vars(value))
        shared = ir.Stage(name, dims, (), None, value, value.dtype, dims)
        load = ir.Load(name, ir.Affine.identity(dims), value.dtype)
        program = _replaced(self.program, original, [shared, original])
        program = replace(program, stages=tuple(replace(st, expr=_replaced_value(st.expr, value, load))
                                                if st.name == stage or st.name in readers else st
                                                for st in program.stages))
        return self._replacing(stage, program, [shared, program.stage(stage)], ("share", stage))

    def epilogue(self, stage: str) -> "Schedule":
        """Compute the pointwise `stage` in the write-back of the accumulator it reads: where `stage`
        reads, over its own dims, the copy `c` that `cache_write` made of `c.acc` (and nothing else
        reads `c`), `stage` reads `c.acc` instead and takes over `c`'s loops, `c.acc` is placed in it
        as it was in `c`, and `c` is gone. A contraction's bias, relu, scaling or cast then happen on
        the tile of results while it is in registers, with no second kernel. Comes before `stage`'s
        other steps."""
        consumer = self.program.stage(stage)
        copy = _written_back(self.program, consumer)
        self._check_untouched(stage, "epilogue")
        acc = f"{copy.name}.acc"
        program = self.program

        def load(ld: ir.Load) -> ir.Load:
            return ir.Load(acc, ld.index, program.stage(acc).dtype) if ld.buffer == copy.name else ld
        fused = replace(consumer, expr=ir.rewritten(consumer.expr, load))
        program = replace(program, stages=tuple(fused if st.name == stage else st
                                                for st in program.stages if st.name != copy.name))
        stages = []
        for name, sched in self.stages:
            if name == copy.name:
                continue
            if name == stage:
                sched = self.of(copy.name)
            elif sched.consumer == copy.name:
                sched = replace(sched, consumer=stage)
            stages.append((name, sched))
        return Schedule(program, tuple(stages), self.steps + (("epilogue", stage),))

    def inline(self, stage: str) -> "Schedule":
        """Compute the pointwise `stage` where it is read: each load of it in another stage becomes its
        expression at that index, and the stage (and its buffer) is gone. A zero-padded operand copy
        (`pad`) inlined into the shared-memory copy of a wgmma tile becomes a TMA copy of the operand
        itself, its edges zero-filled by TMA. Comes before `stage`'s other steps."""
        original = self.program.stage(stage)
        if original.reduce_dims:
            raise ValueError(f"inline: stage {stage} reduces over {original.reduce_dims}; only a pointwise stage "
                             f"can be computed where it is read")
        if original is self.program.output:
            raise ValueError(f"inline: stage {stage} is the result; only a stage that another stage reads can be "
                             f"computed where it is read")
        self._check_untouched(stage, "inline")
        placed = [name for name, sched in self.stages if sched.consumer == stage]
        if placed:
            raise ValueError(f"inline: stages {placed} are placed in stage {stage}'s loops")

        def load(ld: ir.Load) -> ir.Expr:
            if ld.buffer != stage:
                return ld
            values = dict(zip(original.dims, ld.index))
            return ir.substituted(original.expr, values, clamp=ld.clamped)
        program = replace(self.program, stages=tuple(replace(st, expr=ir.rewritten(st.expr, load))
                                                     for st in self.program.stages if st.name != stage))
        stages = tuple((name, sched) for name, sched in self.stages if name != stage)
        return Schedule(program, stages, self.steps + (("inline", stage),))

    def _check_untouched(self, stage: str, step: str):
        """Refuse a step that rewrites `stage` in the program once its loops are reshaped or placed."""
        if self.of(stage) != _default_stage(self.program, self.program.stage(stage)) or self.placed_in(stage):
            raise ValueError(f"{step} of stage {stage} must come before its other steps (its loops are reshaped, "
                             f"placed, or hold another stage)")

    def _replacing(self, stage: str, program: Program, new_stages: list[ir.Stage], step: tuple) -> "Schedule":
        """This schedule on `program`, where `new_stages` (with their default loops) replace `stage`."""
        stages = []
        for other, other_sched in self.stages:
            stages += [(st.name, _default_stage(program, st)) for st in new_stages] if other == stage \
                else [(other, other_sched)]
        return Schedule(program, tuple(stages), self.steps + (step,))

    def _reaches(self, stage: str, target: str) -> bool:
        consumer = self.of(stage).consumer
        return consumer is not None and (consumer == target or self._reaches(consumer, target))

    # Data -----------------------------------------------------------------------
    def to_json(self) -> str:
        """The steps as JSON; `Schedule.from_json(text, program)` replays them."""
        return json.dumps({"format": 1, "steps": [list(s) for s in self.steps]})

    @staticmethod
    def from_json(text: str, program: Program) -> "Schedule":
        """Replay the steps stored by `to_json` on `program`'s default schedule."""
        data = json.loads(text)
        return Schedule.default(program).apply(data["steps"])

    def apply(self, steps) -> "Schedule":
        """Apply a list of steps like ("split", stage, loop, factor) in order."""
        sched = self
        for step in steps:
            op, *args = step
            if op not in ("split", "reorder", "annotate", "tensorize", "place", "cache", "cache_write", "rfactor", "block",
                          "pad", "hoist", "share", "epilogue", "inline"):
                raise ValueError(f"unknown schedule step {op!r}")
            sched = getattr(sched, op)(*args)
        return sched


def _has_stage(program: Program, name: str) -> bool:
    return any(st.name == name for st in program.stages)


def _replaced(program: Program, stage: ir.Stage, new_stages: list[ir.Stage]) -> Program:
    """`program` with `stage` replaced by `new_stages`, in its place."""
    position = program.stages.index(stage)
    return replace(program, stages=program.stages[:position] + tuple(new_stages) + program.stages[position + 1:])


def _shared_value(program: Program, stage: ir.Stage) -> tuple[ir.Expr, tuple[str, ...]]:
    """(the transcendental value `Schedule.share` computes once, the later stages that compute it too) of a
    reduction stage; a ValueError saying why where there is none."""
    if not stage.reduce_dims:
        raise ValueError(f"share: stage {stage.name} is not a reduction")
    later = program.stages[program.stages.index(stage) + 1:]
    for value in ir.subexpressions(stage.expr):
        if isinstance(value, ir.Unary) and value.op in ir.TRANSCENDENTAL:
            readers = tuple(st.name for st in later if value in ir.subexpressions(st.expr))
            if readers:
                return value, readers
    raise ValueError(f"share: no later stage computes an exp, log, tanh or erf value of stage {stage.name}'s body")


def _replaced_value(expr: ir.Expr, value: ir.Expr, load: ir.Load) -> ir.Expr:
    """`expr` with every occurrence of `value` replaced by `load`."""
    if expr == value:
        return load
    if isinstance(expr, ir.Select):
        return ir.Select(expr.guards, _replaced_value(expr.then, value, load),
                         _replaced_value(expr.otherwise, value, load))
    if isinstance(expr, ir.Unary):
        return ir.Unary(expr.op, _replaced_value(expr.x, value, load))
    if isinstance(expr, ir.Cast):
        return ir.Cast(_replaced_value(expr.x, value, load), expr.dtype)
    if isinstance(expr, ir.Binary):
        return ir.Binary(expr.op, _replaced_value(expr.a, value, load), _replaced_value(expr.b, value, load))
    return expr


def _written_back(program: Program, consumer: ir.Stage) -> ir.Stage:
    """The copy of an accumulator (`cache_write`) that the pointwise `consumer` reads at its own
    dims, which nothing else reads and which is not placed; a ValueError saying why where none."""
    if consumer.reduce_dims:
        raise ValueError(f"epilogue: stage {consumer.name} reduces over {consumer.reduce_dims}; only a pointwise "
                         f"stage can run in an accumulator's write-back")
    for ld in ir.loads(consumer.expr):
        copy = next((st for st in program.stages if st.name == ld.buffer), None)
        if copy is None or copy.expr != ir.Load(f"{copy.name}.acc", ir.Affine.identity(copy.dims), copy.expr.dtype):
            continue
        readers = {st.name for st in program.readers(copy.name)}
        same_reads = all(other.index == ir.Affine.identity(consumer.dims)
                         for other in ir.loads(consumer.expr) if other.buffer == copy.name)
        if copy.dims == consumer.dims and readers == {consumer.name} and same_reads and copy is not program.output:
            return copy
    raise ValueError(f"epilogue: stage {consumer.name} reads no accumulator's write-back (a stage that cache_write "
                     f"made a copy of <stage>.acc) over its own dims {consumer.dims} that it alone reads")


def _hoistable_factor(stage: ir.Stage) -> tuple[ir.Expr, ir.Expr]:
    """(the factor `Schedule.hoist` computes once, the other factor) of a reduction stage whose
    expression is a product; a ValueError saying why where there is none."""
    expr = stage.expr
    if not stage.reduce_dims or not isinstance(expr, ir.Binary) or expr.op != "mul":
        raise ValueError(f"hoist: stage {stage.name} is not a reduction of a product")
    found = ir.hoistable_factor(stage)
    if found is not None:
        return found
    raise ValueError(f"hoist: neither factor of stage {stage.name}'s product is computed from loads that "
                     f"leave out one of its dims {stage.loop_dims} (nothing would be computed fewer times)")


def _rfactored(original: ir.Stage, name: str, dim: str, outer: str, inner: str, index: ir.Affine, size: int,
               ragged: bool) -> tuple[ir.Stage, ir.Stage]:
    """(the stage of partial results over `outer`, the stage reducing them) that replace `original`, `dim`
    at `index` of the two (past `size` somewhere where `ragged`)."""
    expr = ir.substituted(original.expr, {dim: index}, clamp=ragged)
    if ragged:     # index runs past the end of `dim`: values there add the reduction's identity
        expr = ir.Select((ir.Guard(index, 0, size),), expr,
                         ir.Const(ir.REDUCE_IDENTITY[original.reduce_op], expr.dtype))
    swap = {dim: inner}
    partial = ir.Stage(name, (outer,) + original.dims, tuple(swap.get(d, d) for d in original.reduce_dims),
                       original.reduce_op, expr, original.expr.dtype,
                       (outer,) + tuple(swap.get(d, d) for d in original.loop_dims))
    final = ir.Stage(original.name, original.dims, (outer,), original.reduce_op,
                     ir.Load(name, ir.Affine.identity((outer,) + original.dims), partial.dtype), original.dtype,
                     original.dims + (outer,))
    return partial, final


def _padded(program: Program, original: ir.Stage, multiples: dict[str, int]) -> tuple[Program, list[ir.Stage]]:
    """The program with `original` computed over zero-padded operands (see `Schedule.pad`), and the
    stages that replace it, in order."""
    grown = {d: -(-program.size(d) // m) * m for d, m in multiples.items()}
    grown = {d: n for d, n in grown.items() if n != program.size(d)}
    names = {d: program.fresh_dim(f"{d}_p") for d in grown}
    sizes = program.sizes + tuple((names[d], n) for d, n in grown.items())
    rename = {d: ir.Affine.var(names.get(d, d)) for d in original.loop_dims}
    copies, redirected = [], {}
    for load in dict.fromkeys(ir.loads(original.expr)):
        dims = [_plain_dim(axis, load, original) for axis in load.index]
        if not set(dims) & set(grown):
            continue
        name = f"{load.buffer}.{original.name}.pad"
        inside = tuple(ir.Guard(ir.Affine.var(names[d]), 0, program.size(d)) for d in dims if d in grown)
        body = ir.Load(load.buffer, tuple(rename[d] for d in dims), load.dtype, True)
        padded_dims = tuple(names.get(d, d) for d in dims)
        copies.append(ir.Stage(name, padded_dims, (), None, ir.Select(inside, body, ir.Const(0.0, load.dtype)),
                               load.dtype, padded_dims))
        redirected[load] = ir.Load(name, ir.Affine.identity(padded_dims), load.dtype)
    expr = ir.rewritten(original.expr, lambda ld: redirected.get(ld, ld))
    pad_name = f"{original.name}.pad"
    compute = ir.Stage(pad_name, tuple(names.get(d, d) for d in original.dims),
                       tuple(names.get(d, d) for d in original.reduce_dims), original.reduce_op,
                       ir.substituted(expr, {d: ir.Affine.var(names[d]) for d in grown}),
                       original.expr.dtype, tuple(names.get(d, d) for d in original.loop_dims))
    inner: ir.Expr = ir.Load(pad_name, ir.Affine.identity(original.dims), compute.dtype)
    if compute.dtype != original.dtype:
        inner = ir.Cast(inner, original.dtype)
    result = ir.Stage(original.name, original.dims, (), None, inner, original.dtype, original.dims)
    new_stages = copies + [compute, result]
    return replace(_replaced(program, original, new_stages), sizes=sizes), new_stages


def _plain_dim(axis: ir.Affine, load: ir.Load, stage: ir.Stage) -> str:
    """The one dim an index axis of a padded load reads (pad copies only plain reads)."""
    dim = axis.bare_dim()
    if dim is None:
        raise ValueError(f"pad of stage {stage.name}: {load.buffer} is read at {axis}; pad copies only reads "
                         f"of one dim each")
    return dim


def _split_tail(tail: Tail, name: str, outer: str, inner: str, factor: int) -> Tail:
    terms: dict[str, int] = {}
    for n, c in tail.terms:
        if n == name:
            terms[outer] = terms.get(outer, 0) + c * factor
            terms[inner] = terms.get(inner, 0) + c
        else:
            terms[n] = terms.get(n, 0) + c
    return Tail(tuple(terms.items()), tail.bound)


def _inner_free(tail: Tail, inner: str, factor: int) -> Tail:
    """`tail` without the term of `inner` (a loop of `factor` iterations) where that term can never decide it:
    the bound (a fixed size) and every other coefficient multiples of `factor` times its own (k < 300 in tiles
    of 32 cut into 4s: whole runs of 4 in or out), the rest divided by that; `tail` itself elsewhere."""
    terms = dict(tail.terms)
    step = terms.get(inner, 0) * factor
    if not step or isinstance(tail.bound, ir.Size) or tail.bound % step or len(terms) < 2 \
            or any(c % step for n, c in terms.items() if n != inner):
        return tail
    return Tail(tuple((n, c // step) for n, c in terms.items() if n != inner), tail.bound // step)


def _default_stage(program: Program, stage: ir.Stage) -> StageSchedule:
    return StageSchedule(tuple(Loop(d, d, program.size(d), 1) for d in stage.loop_dims))


def _redirect(expr: ir.Expr, buffer: str, copy: str, dims: tuple[str, ...], order: tuple[str, ...]) -> ir.Expr:
    """`expr` with every load of `buffer` reading the copy (axes permuted to `order`) instead."""
    def load(ld: ir.Load) -> ir.Load:
        if ld.buffer != buffer:
            return ld
        index = dict(zip(dims, ld.index))
        return ir.Load(copy, tuple(index[d] for d in order), ld.dtype, ld.clamped)
    return ir.rewritten(expr, load)
