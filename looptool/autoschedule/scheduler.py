"""The automatic scheduler: a schedule for any program, derived from its structure and the target.

Stages are scheduled from the result backwards.  A contraction (a sum of products with reuse)
gets a register tile, cache blocks, a packed panel of its reused operand and a parallel loop
(`tiled`); any other stage gets its most contiguous dim vectorized, its loops ordered by
stride and a parallel loop (`streamed`).  A producer that only feeds the stage around it, read
at the plain index, is computed inside that stage's loops over its own dims (`placed`), so
its rows stay in cache.  Every schedule is checked by isl; a refused one is rebuilt with
fewer choices (no placement, or no packing, or no threads, then fewer and fewer), logged at DEBUG
on the `looptool` logger.

Every decision goes through `Builder.decide` under a name (`choices.py`), so the same rules also
build the schedule for any other values of those decisions (`drawn_tree`: the tuner's space).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from .. import ir
from ..analysis.target import Target, host
from ..ir import Program
from ..schedule import LoopTree, Schedule
from . import choices, model, structure
from .choices import Choice, Pick

log = logging.getLogger("looptool")


@dataclass(frozen=True)
class Allowed:
    """Which kinds of choice the rules may make (fallbacks turn them off one by one)."""

    place: bool = True
    pack: bool = True
    threads: bool = True
    tile: bool = True

    def describe(self) -> str:
        """'all choices' or 'without place, pack', for logs and explanations."""
        off = [name for name, on in vars(self).items() if not on]
        return "all choices" if not off else "without " + ", ".join(off)


# Each kind of choice left out alone first, then more and more of them together.
FALLBACKS = (Allowed(), Allowed(place=False), Allowed(pack=False), Allowed(threads=False),
             Allowed(place=False, pack=False), Allowed(place=False, pack=False, threads=False),
             Allowed(place=False, pack=False, threads=False, tile=False))


def auto_tree(program: Program, target: Target | None = None) -> LoopTree:
    """The automatic schedule of `program` for `target` (default: this machine) as a loop tree whose
    `explain()` gives the reason for every choice."""
    return automatic(program, target or host())[0]


def automatic_choices(program: Program, target: Target | None = None) -> dict[str, Choice]:
    """What the automatic schedule of `program` for `target` chose: every decision with more than one
    option, by name, with its value and its neighbours.  `drawn_tree` with these values builds the
    automatic schedule again."""
    return automatic(program, target or host())[1]


def automatic(program: Program, target: Target) -> tuple[LoopTree, dict[str, Choice]]:
    """The automatic loop tree and its choices (the first schedule of FALLBACKS that isl accepts)."""
    for allowed in FALLBACKS:
        try:
            builder = build(program, target, allowed, choices.automatic)
        except ValueError as err:
            log.debug("automatic schedule (%s) could not be built: %s", allowed.describe(), err)
            continue
        reasons = builder.reasons
        if allowed != FALLBACKS[0]:
            reasons.append(f"fell back to a schedule {allowed.describe()}: richer ones were refused")
        tree = LoopTree(program, builder.schedule, tuple(reasons))
        legal, why = tree.check()
        if legal:
            return tree, {name: c for name, c in builder.choices.items() if len(c.options) > 1}
        log.debug("automatic schedule (%s) refused by the isl check: %s", allowed.describe(), why)
    tree = LoopTree(program, None, (target.describe(), "default schedule: every automatic schedule was refused"))
    return tree, {}


def drawn_tree(program: Program, target: Target, pick: Pick) -> LoopTree:
    """The schedule the rules build when `pick(name, value, options)` makes every decision (not
    checked by isl; a transform that refuses a drawn value raises ValueError)."""
    builder = build(program, target, Allowed(), pick)
    return LoopTree(program, builder.schedule, tuple(builder.reasons))


def build(program: Program, target: Target, allowed: Allowed, pick: Pick) -> "Builder":
    """The rules applied to every stage, from the result backwards."""
    builder = built(program, target, allowed, pick, share=True)
    return built(program, target, allowed, pick, share=False) if builder.streamed_shares() else builder


def built(program: Program, target: Target, allowed: Allowed, pick: Pick, share: bool) -> "Builder":
    """The rules applied to every stage, from the result backwards, after `Builder.shared` (where `share`)."""
    builder = Builder(Schedule.default(program), target, allowed, pick)
    for stage in program.stages:
        builder.shared(stage, share)
    for stage in reversed(builder.program.stages):
        builder.schedule_stage(stage.name)
    builder.thread_streamed()
    return builder


class Builder:
    """Applies the rules stage by stage, keeping the schedule and the reasons so far."""

    def __init__(self, schedule: Schedule, target: Target, allowed: Allowed, pick: Pick):
        self.schedule, self.target, self.allowed, self.pick = schedule, target, allowed, pick
        self.reasons = [target.describe()]
        self.choices: dict[str, Choice] = {}
        self.shares: list[str] = []     # the stages `shared` made
        self.unthreaded: list[tuple[str, list[str]]] = []    # streamed stages and their loops threads may run

    @property
    def program(self) -> Program:
        """The program as scheduled so far (packing adds copy stages)."""
        return self.schedule.program

    def note(self, stage: str, text: str):
        """Record the reason for a choice made for `stage`."""
        self.reasons.append(f"{stage}: {text}")

    def decide(self, name: str, value, options: tuple):
        """The value of decision `name`: the pick's, given the rules' `value` and its neighbours."""
        options = tuple(dict.fromkeys((value, *options))) if value not in options else options
        chosen = self.pick(name, value, options)
        self.choices[name] = Choice(chosen, options)
        return chosen

    def shared(self, stage: ir.Stage, share: bool):
        """Rule: where the body of reduction `stage` computes an exp (log, tanh, erf) value that later stages
        compute again (a softmax's exp(x - max): its sum and its division), compute it once in a stage of
        its own (`Schedule.share`), read from cache by them: `build` keeps it where the schedule computes
        it a row at a time in its readers' loop, or where its whole buffer fits in L2."""
        try:
            shared = self.schedule.share(stage.name)
        except ValueError:
            return
        if not self.decide(f"{stage.name}.share", share, (share, not share)):
            return
        self.schedule = shared
        self.shares.append(f"{stage.name}.e")

    def streamed_shares(self) -> bool:
        """Whether a stage of `shared` is computed whole (not placed in its readers' loop) and does not fit
        in L2, so that its readers would read it back from memory; else note why each one is kept."""
        reasons = []
        for name in self.shares:
            value = self.program.stage(name)
            size = math.prod(self.program.size(d) for d in value.dims) * np.dtype(value.dtype).itemsize
            placed = self.schedule.of(name).consumer
            if placed is None and size > self.target.l2:
                return True
            where = f"placed in {placed}'s loops, a block at a time" if placed else \
                f"whole: {size // 1024} KiB, within L2's {self.target.l2 // 1024} KiB"
            readers = ", ".join(r.name for r in self.program.readers(name))
            reasons.append(f"{name}: the {value.expr.op} that {readers} all compute is computed once, in a stage "
                           f"of its own ({where}), not once in each")
        self.reasons[1:1] = reasons
        return False

    def schedule_stage(self, name: str):
        """Place the stage inside its consumer if the rules allow, else give it loops of its own."""
        stage = self.program.stage(name)
        self.explain_separate(stage)
        self.explain_sigmoid_forms(stage)
        if self.placed(stage):
            self.streamed(stage, threads=False)
            return
        found = structure.contraction(self.program, stage)
        # A contraction is tiled; a search leaves it streamed only where the rules fell back to that.
        tile = self.allowed.tile
        if found and self.decide(f"{name}.tiled", tile, (True,) if tile else (False, True)):
            self.tiled(stage, found)
        else:
            self.streamed(stage, threads=self.allowed.threads)

    def explain_separate(self, stage: ir.Stage):
        """Say why a stage holds a costly value alone: the CPU's lowering computes a transcendental value
        that two reductions read, or a costly factor of a contraction, once, at full vector width
        (`ir.lower(..., separate_costly=True)`)."""
        readers = [r.name for r in self.program.readers(stage.name) if r.reduce_op]
        op = stage.expr.op if isinstance(stage.expr, ir.Unary | ir.Binary) else None
        own = stage.name not in self.shares and stage is not self.program.output and stage.reduce_op is None
        if own and op in ir.COSTLY and readers:
            self.note(stage.name, f"its {op} is computed once here, at full vector width, for the reduction"
                                  f"{'s' if len(readers) > 1 else ''} {', '.join(readers)} that read it, not "
                                  f"inside {'them' if len(readers) > 1 else 'it'} (lowered as its own stage)")

    def explain_sigmoid_forms(self, stage: ir.Stage):
        """Say where the lowering computes 1 ± tanh(u) as 2 / (1 + exp(∓2u)) (`ir.sigmoid_form`)."""
        found = sum(1 for e in ir.subexpressions(stage.expr) if ir.is_sigmoid_form(e))
        if found:
            places = f"{found} place{'s' if found > 1 else ''}"
            self.note(stage.name, f"1 ± tanh(u) computed as 2 / (1 + exp(∓2u)), 0.5x times it as "
                                  f"x / (1 + exp(∓2u)) ({places}, lowered so): one exp and one division instead of "
                                  f"tanh's polynomial, exp and division, and no cancellation where tanh(u) nears ∓1")

    # Placement -----------------------------------------------------------------------
    def placed(self, stage: ir.Stage) -> bool:
        """Compute a producer inside the loops of its last reader over the producer's dims."""
        where = self.placement(stage)
        place = self.allowed.place
        if where is None or not self.decide(f"{stage.name}.place", place, (place, not place)):
            return False
        host_stage, depth = where
        self.schedule = self.schedule.place(stage.name, host_stage, depth)
        self.note(stage.name, f"computed inside {host_stage}'s first {depth} loop(s), over its own dims "
                              f"{', '.join(stage.dims)}: each result is made just before it is read, in cache")
        return True

    def placement(self, stage: ir.Stage) -> tuple[str, int] | None:
        """(consumer, depth) where the stage could be computed: its last reader's loops over exactly
        its own dims (or, where that reader is itself computed in another stage's loops, those), when
        every other reader is placed there too and reads it at the plain index, and that stage is not a
        contraction (inside its register tile the producer would be computed one element at a time). A
        softmax's row max is so computed in the row loop of its result, beside the exp that reads it."""
        readers = self.program.readers(stage.name)
        if stage is self.program.output or not readers or structure.contraction(self.program, stage):
            return None
        host_stage = self.schedule.of(readers[-1].name).consumer or readers[-1].name
        if self.schedule.of(host_stage).consumer is not None or not structure.is_plain_read(self.program, stage):
            return None
        if structure.contraction(self.program, self.program.stage(host_stage)):   # register tiles: one element a time
            return None
        if any(r.name != host_stage and self.schedule.of(r.name).consumer != host_stage for r in readers):
            return None
        depth = covering_depth([lp.dim for lp in self.schedule.effective_loops(host_stage)], stage.dims)
        if depth is None:
            return None
        # computed before the readers placed in the host's outer loops: a softmax's shared exp, a row at a time
        return host_stage, min([depth] + [self.schedule.of(r.name).at for r in readers if r.name != host_stage])

    # Streaming stages (no register reuse) ------------------------------------------------
    def streamed(self, stage: ir.Stage, threads: bool):
        """Vectorize the most contiguous dim, order loops by stride, run the outermost big pure loop on threads."""
        own = [lp.dim for lp in self.schedule.of(stage.name).loops]
        vector = structure.vector_dim(self.program, stage, tuple(own))
        pure = structure.by_stride(self.program, stage, [d for d in own if d not in stage.reduce_dims and d != vector])
        reductions = structure.by_stride(self.program, stage, [d for d in own if d in stage.reduce_dims and d != vector])
        if vector is None:
            order, outer = pure + reductions, []
        else:
            order, outer = self.vector_loops(stage, vector, pure, reductions)
        self.reorder(stage.name, [lp for lp in order if lp])
        if threads:
            self.unthreaded.append((stage.name, outer))

    def thread_streamed(self):
        """Run on threads a pure loop (`parallel`'s pick) of each streamed stage with loops of its own, once
        every stage is scheduled: the stages placed in its loops (a softmax's exp and sums) count toward the
        work that must pay for the threads, as the kernel's own check counts them for a loop of dynamic
        extent. (Counting the result alone kept softmax 300x256 on one thread of two: 69 us, against 28.)"""
        for name, outer in self.unthreaded:
            order = [lp.name for lp in self.schedule.of(name).loops]
            regions = {lp: self.regions(name, order, lp) for lp in outer}
            loop = self.parallel(name, {lp: lp for lp in outer}, self.nest_work(name), regions)
            if loop:
                self.schedule = self.schedule.annotate(name, loop, "parallel")

    def regions(self, stage: str, order: list[str], loop: str) -> int:
        """The parallel regions `loop` opens a call with the stage's loops in `order`: an iteration of those
        outside it each."""
        return math.prod(int(self.extent(stage, lp)) for lp in order[:order.index(loop)])

    def nest_work(self, name: str) -> int:
        """Scalar iterations of stage `name` and of the stages placed in its loops, however deep."""
        nest = {name}
        for stage in reversed(self.program.stages):
            if self.schedule.of(stage.name).consumer in nest:
                nest.add(stage.name)
        return sum(math.prod(self.program.size(d) for d in stage.loop_dims)
                   for stage in self.program.stages if stage.name in nest)

    def vector_loops(self, stage: ir.Stage, vector: str, pure: list[str], reductions: list[str]):
        """Split and vectorize `vector`; (the stage's loop order, the loops outside its reductions that
        threads may take, outer first)."""
        extent, lanes = self.program.size(vector), self.target.lanes(stage.dtype)
        along = structure.gathered_along(self.program, stage, vector) if not reductions else None
        # Gathered lanes load one by one: more vectors in flight would only spread more lines.
        reduced = stage.reduce_op if vector in stage.reduce_dims else None
        width = min(lanes, extent) if along in pure else model.vector_width(self.target, stage.dtype, extent, reduced)
        width = self.decide(f"{stage.name}.{vector}.lanes", width,
                            choices.halves_and_doubles(width, extent, min(lanes, extent)))
        kind = "reduction, kept as vector partial sums" if vector in stage.reduce_dims else "pure"
        if reduced in model.CHAINED_REDUCTIONS and width > lanes * model.INDEPENDENT_VECTORS:
            kind = f"reduction, kept as {width // lanes} vectors of partial results: a {reduced} combines in a chain"
        scattered = structure.scatter_cost(self.program, stage, vector)
        self.note(stage.name, f"vectorize {vector} by {width} lanes ({kind}): "
                              f"{structure.unit_stride_count(self.program, stage, vector)} of its accesses "
                              f"are contiguous along it{f', {scattered} lane-by-lane (fewest)' if scattered else ''}; "
                              f"{lanes} lanes per register")
        if vector in stage.reduce_dims:
            outer, inner = self.split(stage.name, vector, width)
            order, free = pure + reductions + [outer, inner], pure
        elif reductions:
            block, rest = self.accumulators(stage, vector, width)
            outer, inner = self.split(stage.name, rest, width)
            order, free = pure + [block] + reductions + [outer, inner], pure + [block]
        else:
            outer, inner = self.split(stage.name, vector, width)
            rows, block = self.gather_block(stage, vector, width, along, pure)
            order, free = rows + [outer, block] + [inner], rows + [outer]
        self.schedule = self.schedule.annotate(stage.name, inner, "vectorize")
        return order, [lp for lp in free if lp]

    def accumulators(self, stage: ir.Stage, vector: str, width: int) -> tuple[str | None, str | None]:
        """A reduction over outer dims, vectorized along a kept dim: block the kept dim so that the
        accumulators of one pass fill the share of L1 the model allows ((block loop, the rest))."""
        extent, itemsize = self.program.size(vector), np.dtype(stage.dtype).itemsize
        block = model.accumulator_block(self.target, itemsize, extent, width)
        block = self.decide(f"{stage.name}.{vector}.block", block, choices.halves_and_doubles(block, extent, width))
        outer, rest = self.split(stage.name, vector, block)
        self.note(stage.name, f"reduction over outer dims: {vector} in blocks of {block}, whose {block * itemsize // 1024} "
                              f"KiB of accumulators stay in L1 (at most half of its {self.target.l1 // 1024} KiB"
                              f"{', one block a core at least' if self.target.cores > 1 else ''}) while each pass "
                              f"reads {block}-long stretches of rows")
        return outer, rest

    def gather_block(self, stage: ir.Stage, vector: str, width: int, along: str | None,
                     pure: list[str]) -> tuple[list[str], str | None]:
        """Where the vector's loads are gathers (a transpose, vectorized along its contiguous store), block
        `along`, the dim along which they are contiguous, inside the vector's outer loop, so that the
        `width` gathered rows of a block fill the share of L1 the model allows and each of their lines is
        read once: (the outer loops, the block's loop or None)."""
        if along not in pure:
            return pure, None
        itemsize = np.dtype(stage.dtype).itemsize
        block = model.balanced(self.program.size(along), self.target.l1 // model.CACHE_SHARE // (width * itemsize))
        block = self.decide(f"{stage.name}.{along}.block", block,
                            choices.halves_and_doubles(block, self.program.size(along)))
        outer, inner = self.split(stage.name, along, block)
        self.note(stage.name, f"{vector}'s loads are gathered, one vector of {width} lanes at a time; {along}, along "
                              f"which they are contiguous, in blocks of {block} inside {vector}'s outer loop: the "
                              f"{width}x{block} slice they read takes {width * block * itemsize // 1024} KiB, half of "
                              f"L1 at most, so each of its lines is read once")
        return [outer if d == along else d for d in pure], inner

    # Contractions ------------------------------------------------------------------------
    def tiled(self, stage: ir.Stage, found: structure.Contraction):
        """Register tile, reduction block for L1, column block and packed panel for L2, threads."""
        name, itemsize, size = stage.name, np.dtype(stage.dtype).itemsize, self.program.size
        tile = self.register_tile(stage, found)
        self.note(name, tile.reason(self.target) + f" (rows {found.row}, vectors along {found.col})")
        reductions = structure.by_stride(self.program, stage, list(stage.reduce_dims))
        first, rest = reductions[0], reductions[1:]
        rest_length = math.prod(size(d) for d in rest)
        results = math.prod(size(d) for d in stage.dims) * itemsize // self.target.cores
        reused = math.prod(self.program.buffer_shape(found.reused)) * itemsize // self.target.cores
        extent = math.prod(size(d) for d in reductions)

        def traffic(kc: int) -> int:
            return model.l3_traffic(self.target, tile, kc, itemsize, extent, results, size(found.row), reused)
        # (a convolution's reduction, c kh kw, keeps L1's block: held to AVX2 on the Xeon, a 3x3 conv's whole
        # reduction in one pass ran 5 % faster on one core, 12 % slower on two)
        kc = model.reduction_block(self.target, tile, itemsize, None if rest else traffic, extent)
        block = model.balanced(size(first), max(1, kc // rest_length))
        block = self.decide(f"{name}.{first}.block", block, choices.halves_and_doubles(block, size(first)))
        reduce_outer, reduce_inner = self.split(name, first, block)
        kc = block * rest_length
        in_l1 = model.reduction_block(self.target, tile, itemsize)
        from_l2 = model.results_leave_l2(self.target, results) and kc > in_l1
        if from_l2:
            passes = f"reduction block {first} by {block}" if reduce_outer else f"whole reduction {first}, one pass"
            self.note(name, f"{passes} ({kc} products per result per pass): the {results // 1024} KiB of results a "
                            f"core updates would leave L2 between passes, so fewer passes, each "
                            f"{kc}x{tile.columns} micro-panel ({tile.columns * kc * itemsize // 1024} KiB) read from L2")
        elif reduce_outer:
            ways = model.panel_ways(self.target, tile)
            self.note(name, f"reduction block {first} by {block} ({kc} products per result per pass): "
                            f"a {kc}x{tile.columns} micro-panel takes {tile.columns * kc * itemsize // 1024} KiB, "
                            f"at most {ways} of L1's {self.target.l1_ways} ways; the {tile.rows}x{kc} slice it "
                            f"meets and the results share the rest")
        col_outer, col_rest = self.cache_block(name, found.col, kc, itemsize, tile.columns, found.reused,
                                               (model.panel_room(self.target), "half of its share of L3 at most"))
        col_tiles, col_tile = self.split(name, col_rest, tile.columns)
        vectors, lanes = self.split(name, col_tile, tile.lanes)
        ways = model.block_ways(self.target, tile, kc, itemsize)
        packed_room = model.block_room(self.target, tile, kc, itemsize, in_place=False)
        in_place = not self.packs_broadcast(stage, found, packed_room, {first: block, **{d: size(d) for d in rest}},
                                            ways, itemsize)
        room = model.block_room(self.target, tile, kc, itemsize, in_place)
        capped = " and half of L2 (read in place)" if room < packed_room else ""
        row_blocks, row_rest = self.cache_block(name, found.row, kc, itemsize, tile.rows, found.broadcast,
                                                (room, f"{ways} of L2's {self.target.l2_ways} ways{capped} at most "
                                                       f"(one way is left to the results, some to the "
                                                       f"{kc}x{tile.columns} micro-panels passing through)"))
        block_rows = self.extent(name, row_rest)
        row_tiles, rows = self.split(name, row_rest, tile.rows)
        others = structure.by_stride(self.program, stage, [d for d in stage.dims if d not in (found.row, found.col)])
        reused_dims = structure.dims_read(self.program, stage, found.reused)
        before = [d for d in others if d in reused_dims]
        after = [d for d in others if d not in reused_dims]
        roles = {**{d: d for d in before}, f"{found.col}.block": col_outer, f"{first}.block": reduce_outer,
                 f"{found.row}.block": row_blocks, f"{found.col}.tiles": col_tiles, **{d: d for d in after},
                 f"{found.row}.tiles": row_tiles}
        present = [role for role, loop in roles.items() if loop]
        order = self.decide(f"{name}.order", " ".join(roles), choices.adjacent_orders(list(roles), present))
        outer = [roles[role] for role in order.split() if roles.get(role)]
        if len(outer) != len(present):
            raise ValueError(f"loop order {order!r} of stage {name} does not name its loops {list(roles)}")
        # in vector instructions (a multiply-add of `tile.lanes` lanes each), the unit WORK_PER_THREAD counts
        work = math.prod(size(d) for d in stage.loop_dims) // tile.lanes
        candidates = {role: roles[role] for role in order.split() if roles.get(role) and roles[role] != reduce_outer}

        def moves_out(loop: str) -> bool:
            return loop not in (row_blocks, row_tiles) and (
                self.sweep_fits(found, reduce_outer, itemsize) or self.splits_broadcast(stage, found, loop))
        regions = {role: 1 if moves_out(loop) else self.regions(name, outer, loop) for role, loop in candidates.items()}
        parallel = self.parallel(name, candidates, work, regions)
        if parallel and moves_out(parallel):
            outer = [parallel] + [lp for lp in outer if lp != parallel]
            self.note(name, f"parallel {parallel} outermost: one parallel region per call (the packed "
                            f"panels it encloses are made by each thread)")
        self.reorder(name, [lp for lp in outer + [reduce_inner] + rest + [rows, vectors, lanes] if lp])
        self.note(name, f"loops: {found.col} tiles outside {found.row} tiles, so each {tile.columns}-column "
                        f"micro-panel of {found.reused} stays in {'L2' if from_l2 else 'L1'} "
                        f"while {found.broadcast} streams past")
        for loop, annotation in ((rows, "unroll"), (vectors, "unroll"), (lanes, "vectorize")):
            if loop:
                self.schedule = self.schedule.annotate(name, loop, annotation)
        if row_blocks or row_tiles:
            pays = self.allowed.pack and self.packing_pays(stage, found, itemsize)
            if self.decide(f"{name}.pack.{found.reused}", pays, (pays, not pays)):
                enclosing = set(before + [col_outer, reduce_outer, row_blocks, col_tiles])
                depth = max((i + 1 for i, lp in enumerate(outer) if lp in enclosing), default=0)
                self.pack(stage, found, outer[:depth], reductions, (vectors, lanes))
            self.pack_broadcast(stage, found, outer, set(before + [col_outer, reduce_outer, row_blocks]), col_tiles,
                                {found.row: block_rows, first: block, **{d: size(d) for d in rest}}, ways)
        if parallel:
            self.schedule = self.schedule.annotate(name, parallel, "parallel")

    def pack_broadcast(self, stage: ir.Stage, found: structure.Contraction, outer: list[str], enclosing: set,
                       col_tiles: str | None, block: dict[str, int], ways: int):
        """Copy the broadcast operand's row block (rows outer, reductions inner) inside the loops
        `enclosing` when every column tile re-reads the copy and the block, as it lies in the operand
        (`block`: its extent along each dim), would not stay in L2: some set of L2 would hold more of its
        lines than the `ways` the model gives the block (`model.block_ways`), so each column tile would
        read it again from L3 (rows a power of two apart share sets: 1024³ on AVX2, 344 rows 4 KiB apart,
        22 lines a set). Packed, its lines are consecutive and spread over all sets. Not for an operand
        read under padding guards (a guarded copy costs what it saves). (Until issue #27 the rule packed
        a block spanning more than half of L2, however its lines fell: 257x511x129's 257 rows 2044 bytes
        apart, 2 lines a set at most, were copied once per reduction block, 5 % of the call.)"""
        depth = max((i + 1 for i, lp in enumerate(outer) if lp in enclosing), default=0)
        placed = col_tiles is not None and col_tiles in outer[depth:]
        needed = self.broadcast_set_load(stage, found, block, np.dtype(stage.dtype).itemsize) if placed else None
        candidate = needed is not None
        pays = candidate and needed > ways
        shape = "x".join(str(block[d]) for d in block)
        if not self.decide(f"{stage.name}.pack.{found.broadcast}", pays, (pays, not pays) if candidate else (False,)):
            if candidate:
                self.note(stage.name, f"{found.broadcast} read in place: its {shape} block puts at most {needed} "
                                      f"lines in one set of L2, within the {ways} of its {self.target.l2_ways} ways "
                                      f"the block gets")
            return
        dims = self.program.buffer_dims(found.broadcast)
        order = tuple([d for d in dims if d not in stage.reduce_dims and d != found.row] + [found.row]
                      + [d for d in dims if d in stage.reduce_dims])
        copy = self.copy_operand(stage.name, found.broadcast, order, depth)
        self.copy_in_layout_order(copy, order)
        self.note(stage.name, f"pack {found.broadcast} as ({', '.join(order)}) {_once_per(outer[:depth])}: every "
                              f"{found.col} tile re-reads the copy; read in place, its {shape} block would put "
                              f"{needed} lines in one set of L2, more than the {ways} of its {self.target.l2_ways} "
                              f"ways the block gets; packed its lines are consecutive")

    def packs_broadcast(self, stage: ir.Stage, found: structure.Contraction, room: int, reductions: dict[str, int],
                        ways: int, itemsize: int) -> bool:
        """Whether `pack_broadcast` would copy the broadcast operand's row block as `room` bytes of L2 hold it
        (`reductions`: the block's extent along each reduction dim): plain reads whose lines crowd some set of
        L2 beyond the block's `ways`."""
        kc = math.prod(reductions.values())
        rows = model.balanced(self.program.size(found.row), model.cache_block(room, kc, itemsize))
        needed = self.broadcast_set_load(stage, found, {found.row: rows, **reductions}, itemsize)
        return needed is not None and needed > ways

    def broadcast_set_load(self, stage: ir.Stage, found: structure.Contraction, block: dict[str, int],
                           itemsize: int) -> int | None:
        """The most lines of L2 one set holds of the broadcast operand's `block` read in place (`set_load`);
        None where it is not to be packed whatever it holds: packing is off, or it is read under padding
        guards (a guarded copy costs what it saves)."""
        reads = broadcast_reads(stage.expr, found.broadcast)
        if not self.allowed.pack or not all(isinstance(e, ir.Load) and not e.clamped for e in reads):
            return None
        return self.set_load(reads, block, itemsize)

    def set_load(self, reads: list[ir.Expr], block: dict[str, int], itemsize: int) -> int:
        """The most lines of L2 one set holds of the block of `block`'s extents that `reads` (loads) read
        in place (`model.set_load`)."""
        most = 0
        for load in reads:
            strides = structure.load_strides(self.program, load)
            offsets = np.zeros((), dtype=np.int64)
            for dim, extent in block.items():
                offsets = np.add.outer(offsets, np.arange(extent, dtype=np.int64) * strides.get(dim, 0) * itemsize)
            most = max(most, model.set_load(self.target, offsets))
        return most

    def sweep_fits(self, found: structure.Contraction, reduce_outer: str | None, itemsize: int) -> bool:
        """Whether a parallel column loop may move outside the reduction blocks: there each thread
        re-reads the whole broadcast operand once per column tile, which stays in cache only if it
        fits in half of this thread's share of L3, where the model keeps what is re-read by column tile
        (`model.panel_room`); else each reduction block gets its own parallel region. (Held to half
        of L2 before, 1024³ opened 14 regions a call: 2 threads on the Zen 4 EPYC, interleaved, 12.9 ms
        against 11.7 ms outermost, XLA 10.5; 512³ 1.58 against 1.27 ms.)"""
        size = math.prod(self.program.buffer_shape(found.broadcast)) * itemsize
        return reduce_outer is None or size <= self.target.l3 // self.target.cores // model.CACHE_SHARE

    def splits_broadcast(self, stage: ir.Stage, found: structure.Contraction, loop: str) -> bool:
        """Whether the parallel loop's dim indexes the broadcast operand: each thread then reads only
        its own part of it (a convolution's output rows, their input rows), never the whole, so the
        loop may run outermost however large the operand is. Kept inside the reduction blocks, a
        3x3 conv's parallel rows ran in 12 outlined regions per call whose code ran 3.4x slower
        than the same loops serial (2 threads: 6.0 ms against 3.4 ms on one, AVX2 EPYC)."""
        dim = next(lp.dim for lp in self.schedule.of(stage.name).loops if lp.name == loop)
        return any(index.coeffs().get(dim) for read in broadcast_reads(stage.expr, found.broadcast)
                   for load in ir.loads(read) for index in load.index)

    def register_tile(self, stage: ir.Stage, found: structure.Contraction) -> model.RegisterTile:
        """The model's register tile, or the rows and columns the pick takes instead."""
        size, lanes = self.program.size, self.target.lanes(stage.dtype)
        batched = any(d not in (found.row, found.col) for d in stage.dims)      # (threads then take a batch dim)
        column_cores = 1 if batched else self.target.cores
        tile = model.register_tile(self.target, lanes, size(found.row), size(found.col), column_cores)
        rows = self.decide(f"{stage.name}.{found.row}.tile", tile.rows,
                           choices.steps_around(tile.rows, 1, 1, size(found.row)))
        columns = self.decide(f"{stage.name}.{found.col}.tile", tile.columns,
                              choices.steps_around(tile.columns, lanes, lanes, -(-size(found.col) // lanes) * lanes))
        if columns % lanes or rows < 1:
            raise ValueError(f"register tile {rows}x{columns} of stage {stage.name}: rows must be positive and "
                             f"columns a multiple of {lanes} lanes")
        return model.RegisterTile(rows, columns // lanes, lanes)

    def cache_block(self, stage: str, dim: str, kc: int, itemsize: int, multiple: int, operand: str,
                    room: tuple[int, str]):
        """Block `dim` (by a multiple of the tile) so that the kc-long slices of `operand` along it
        fill `room` (bytes, and in words) at most; (outer, inner) loop names."""
        extent = self.program.size(dim)
        block = model.balanced(extent, model.cache_block(room[0], kc, itemsize), multiple)
        block = self.decide(f"{stage}.{dim}.block", block, choices.halves_and_doubles(block, extent, multiple))
        block = min(extent, -(-block // multiple) * multiple)
        outer, inner = self.split(stage, dim, block)
        if outer:
            self.note(stage, f"{dim} block {block}: the {kc}x{block} panel of {operand} takes "
                             f"{kc * block * itemsize // 1024} KiB, {room[1]}")
        return outer, inner

    def packing_pays(self, stage: ir.Stage, found: structure.Contraction, itemsize: int) -> bool:
        """Packing the reused operand pays when its vectors are not contiguous (a transposed operand)
        or when it does not fit in the share of L1 the model allows (its rows would evict each other)."""
        footprint = math.prod(self.program.buffer_shape(found.reused)) * itemsize
        return self.gathered(stage, found) or footprint > self.target.l1 // model.CACHE_SHARE

    def gathered(self, stage: ir.Stage, found: structure.Contraction) -> bool:
        """Whether the reused operand's vectors are not contiguous along the columns (a transposed operand)."""
        loads = [ld for ld in ir.loads(stage.expr) if ld.buffer == found.reused]
        return any(abs(structure.load_strides(self.program, ld).get(found.col, 0)) != 1 for ld in loads)

    def pack(self, stage: ir.Stage, found: structure.Contraction, blocks: list[str], reductions: list[str],
             tile_loops: tuple[str | None, str | None]):
        """Copy the reused operand's micro-panel (reductions outer, columns innermost) inside the loops
        `blocks`, the last of which steps over column tiles: one contiguous panel per tile, each of its
        rows copied as the register tile reads it (`tile_loops`: the tile's vector and lane loops)."""
        dims = self.program.buffer_dims(found.reused)
        order = tuple([d for d in reductions if d in dims] + [d for d in dims if d not in reductions and d != found.col]
                      + [found.col])
        if sorted(order) != sorted(dims):
            return
        contiguous = not self.gathered(stage, found)
        copy = self.copy_operand(stage.name, found.reused, order, len(blocks))
        if contiguous:
            self.copy_in_layout_order(copy, order)
        by_vectors = self.vector_copy(copy, tile_loops) if contiguous else ""
        self.note(stage.name, f"pack {found.reused} as ({', '.join(order)}) {_once_per(blocks)}: it is re-read by "
                              f"every row tile, and packed its micro-panel is one contiguous block{by_vectors}")

    def copy_in_layout_order(self, copy: str, order: tuple[str, ...]):
        """Run the loops of a packed copy in the order of its layout (`order`; a micro-panel's: reductions outer,
        columns innermost), so that each row is copied along the columns, where both the operand and the copy
        are contiguous. Where a micro-panel's reduction is not split into blocks, the copy's loops came columns outer and the
        whole reduction innermost: a scalar copy down each column (257x129x511 on the AVX-512 Xeon: 8 panels
        of 129x64 a call, each element read from another row of the operand)."""
        loops = sorted(self.schedule.of(copy).loops, key=lambda lp: order.index(lp.dim))
        self.reorder(copy, [lp.name for lp in loops])

    def vector_copy(self, copy: str, tile_loops: tuple[str | None, str | None]) -> str:
        """Copy each row of a packed micro-panel by the register tile's vectors where the tile's lanes are the
        copy's innermost loop: its lane loop vectorized, its vector loop unrolled, so that a tile cut by the edge
        of the columns has its tail tested once per tile (`codegen.llvm.hoisted_tail_checks`) and a full one
        copies whole vectors. Left scalar, the copy's last vector was tested in every row, and LLVM made each
        row's copy a call of memcpy of variable length (matmul 997x1001x1003, AVX2: 168 157 calls a call, now
        6 996). The caller asks only where the operand is contiguous along the columns: a transposed one would
        be gathered lane by lane into each vector (on the AVX-512 host 512³ with B stored n-major ran 3.18 ms so
        against 2.76 ms copied by scalars, one run each, not side by side). The reason's tail, or ''."""
        own = [lp.name for lp in self.schedule.of(copy).loops]
        vectors, lanes = tile_loops
        if not own or own[-1] != lanes:      # a convolution's filter copy runs its window inside the columns
            return ""
        self.schedule = self.schedule.annotate(copy, lanes, "vectorize")
        if own[-2:-1] == [vectors]:
            self.schedule = self.schedule.annotate(copy, vectors, "unroll")
        return ", each row copied by the register tile's vectors"

    def copy_operand(self, stage: str, buffer: str, order: tuple[str, ...], depth: int) -> str:
        """Read `buffer` in `stage` through a copy laid out in `order`, made inside the stage's first
        `depth` loops (0: once); the copy's name."""
        copy = f"{buffer}.{stage}"
        self.schedule = self.schedule.cache(stage, buffer, order)
        if depth:
            self.schedule = self.schedule.place(copy, stage, depth)
        return copy

    # Shared steps ------------------------------------------------------------------------
    def split(self, stage: str, loop: str | None, factor: int) -> tuple[str | None, str | None]:
        """(outer, inner) names after splitting `loop` by `factor`; no split (outer None) when it
        would not divide the loop."""
        if loop is None:
            return None, None
        extent = self.extent(stage, loop)
        if factor >= extent:
            return None, loop
        self.schedule = self.schedule.split(stage, loop, factor)
        return f"{loop}.0", f"{loop}.1"

    def extent(self, stage: str, loop: str) -> int:
        """The trip count of one of the stage's loops."""
        return next(lp.extent for lp in self.schedule.of(stage).loops if lp.name == loop)

    def reorder(self, stage: str, order: list[str]):
        """Put the stage's loops in `order` (nothing to do for a single loop)."""
        if len(order) > 1:
            self.schedule = self.schedule.reorder(stage, *order)

    def parallel(self, stage: str, candidates: dict[str, str], work: int,
                 regions: dict[str, int] | None = None) -> str | None:
        """The loop to run on threads: of the `candidates` (role -> loop name, outer first) with enough
        iterations and work for the cores, the rules take the one whose busiest core finishes first
        (`model.threaded_time`: whole iterations a core, and a start and join for each of the role's
        `regions`, parallel regions a call; 1 where not given), the outermost of equals; the pick may take
        another or none."""
        if self.target.cores < 2:
            return None
        extents = {lp.name: lp.extent for lp in self.schedule.of(stage).loops}
        # a loop of dynamic extent may run on threads: the kernel checks at run time that a call's size
        # gives them enough work (`model.worth_threads` there), and runs it serially where not
        dynamic = [role for role, loop in candidates.items() if isinstance(extents[loop], ir.Size)]
        busy = [role for role, loop in candidates.items() if extents[loop] >= self.target.cores or role in dynamic]
        worth = [role for role in busy if model.worth_threads(self.target, extents[candidates[role]], work)]
        regions = regions or {}
        fastest = min(worth, key=lambda role: model.threaded_time(self.target, extents[candidates[role]], work,
                                                                  regions.get(role, 1)), default="none")
        first = next((role for role in busy if role in dynamic or role in worth), "none")
        rule = (first if dynamic else fastest) if self.allowed.threads else "none"
        role = self.decide(f"{stage}.parallel", rule, ("none", *busy))
        if role not in candidates:
            return None
        loop = candidates[role]
        when = " when a call's size gives each enough work" if role in dynamic else ""
        opened = regions.get(role, 1)
        times = f", opened {opened} times a call" if opened > 1 else ""
        self.note(stage, f"parallel {loop}: {extents[loop]} iterations for {self.target.cores} cores{when}{times}")
        return loop


def broadcast_reads(expr: ir.Expr, buffer: str) -> list[ir.Expr]:
    """The sub-expressions through which `expr` reads `buffer`: its loads, or the guarded selects
    around them (a padded read)."""
    if isinstance(expr, ir.Load):
        return [expr] if expr.buffer == buffer else []
    if isinstance(expr, ir.Select):
        return [expr] if buffer in ir.loaded_buffers(expr) else []
    if isinstance(expr, ir.Binary):
        return broadcast_reads(expr.a, buffer) + broadcast_reads(expr.b, buffer)
    if isinstance(expr, ir.Unary | ir.Cast):
        return broadcast_reads(expr.x, buffer)
    return []


def covering_depth(loop_dims: list[str], dims: tuple[str, ...]) -> int | None:
    """The number of outer loops that run over exactly `dims` (every loop of them), or None."""
    depth = 0
    while depth < len(loop_dims) and loop_dims[depth] in dims:
        depth += 1
    if depth == 0 or set(loop_dims[:depth]) != set(dims) or any(d in dims for d in loop_dims[depth:]):
        return None
    return depth


def _once_per(loops: list[str]) -> str:
    """How often a copy made inside `loops` is made, in words."""
    return f"once per {', '.join(loops)}" if loops else "once"
