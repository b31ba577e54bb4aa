"""The automatic scheduler: a schedule for any program, derived from its structure and the target.

Stages are scheduled from the result backwards.  A contraction (a sum of products with reuse)
gets a register tile, cache blocks, a packed panel of its reused operand and a parallel loop
(`tiled`); any other stage gets its most contiguous dim vectorized, its loops ordered by
stride and a parallel loop (`streamed`).  A producer that only feeds the stage around it, read
at the plain index, is computed inside that stage's loops over its own dims (`placed`), so
its rows stay in cache.  Every schedule is checked by isl; a refused one is rebuilt with
fewer choices (no placement, or no packing, or no threads, then fewer and fewer), logged at DEBUG
on the `looptool` logger.
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
from . import model, structure

log = logging.getLogger("looptool")


@dataclass(frozen=True)
class Choices:
    """Which kinds of choice the scheduler may make (fallbacks turn them off one by one)."""

    place: bool = True
    pack: bool = True
    threads: bool = True
    tile: bool = True

    def describe(self) -> str:
        """'all choices' or 'without place, pack', for logs and explanations."""
        off = [name for name, on in vars(self).items() if not on]
        return "all choices" if not off else "without " + ", ".join(off)


# Each kind of choice left out alone first, then more and more of them together.
FALLBACKS = (Choices(), Choices(place=False), Choices(pack=False), Choices(threads=False),
             Choices(place=False, pack=False), Choices(place=False, pack=False, threads=False),
             Choices(place=False, pack=False, threads=False, tile=False))


def auto_tree(program: Program, target: Target | None = None) -> LoopTree:
    """The automatic schedule of `program` for `target` (default: this machine) as a loop tree whose
    `explain()` gives the reason for every choice."""
    target = target or host()
    for choices in FALLBACKS:
        try:
            schedule, reasons = build(program, target, choices)
        except ValueError as err:
            log.debug("automatic schedule (%s) could not be built: %s", choices.describe(), err)
            continue
        if choices != FALLBACKS[0]:
            reasons.append(f"fell back to a schedule {choices.describe()}: richer ones were refused")
        tree = LoopTree(program, schedule, tuple(reasons))
        legal, why = tree.check()
        if legal:
            return tree
        log.debug("automatic schedule (%s) refused by the isl check: %s", choices.describe(), why)
    return LoopTree(program, None, (target.describe(), "default schedule: every automatic schedule was refused"))


def build(program: Program, target: Target, choices: Choices) -> tuple[Schedule, list[str]]:
    """The schedule and one reason per choice."""
    builder = Builder(Schedule.default(program), target, choices)
    for stage in reversed(program.stages):
        builder.schedule_stage(stage.name)
    return builder.schedule, builder.reasons


class Builder:
    """Applies the rules stage by stage, keeping the schedule and the reasons so far."""

    def __init__(self, schedule: Schedule, target: Target, choices: Choices):
        self.schedule, self.target, self.choices = schedule, target, choices
        self.reasons = [target.describe()]

    @property
    def program(self) -> Program:
        """The program as scheduled so far (packing adds copy stages)."""
        return self.schedule.program

    def note(self, stage: str, text: str):
        """Record the reason for a choice made for `stage`."""
        self.reasons.append(f"{stage}: {text}")

    def schedule_stage(self, name: str):
        """Place the stage inside its consumer if the rules allow, else give it loops of its own."""
        stage = self.program.stage(name)
        if self.choices.place and self.placed(stage):
            self.streamed(stage, threads=False)
            return
        found = structure.contraction(self.program, stage) if self.choices.tile else None
        if found:
            self.tiled(stage, found)
        else:
            self.streamed(stage, threads=self.choices.threads)

    # Placement -----------------------------------------------------------------------
    def placed(self, stage: ir.Stage) -> bool:
        """Compute a producer inside the loops of its last reader over the producer's dims."""
        readers = self.program.readers(stage.name)
        if stage is self.program.output or not readers or structure.contraction(self.program, stage):
            return False
        host_stage = readers[-1].name
        if self.schedule.of(host_stage).consumer is not None or not structure.is_plain_read(self.program, stage):
            return False
        if any(r.name != host_stage and self.schedule.of(r.name).consumer != host_stage for r in readers):
            return False
        depth = covering_depth([lp.dim for lp in self.schedule.effective_loops(host_stage)], stage.dims)
        if depth is None:
            return False
        self.schedule = self.schedule.place(stage.name, host_stage, depth)
        self.note(stage.name, f"computed inside {host_stage}'s first {depth} loop(s), over its own dims "
                              f"{', '.join(stage.dims)}: each result is made just before it is read, in cache")
        return True

    # Streaming stages (no register reuse) ------------------------------------------------
    def streamed(self, stage: ir.Stage, threads: bool):
        """Vectorize the most contiguous dim, order loops by stride, run the outermost big pure loop on threads."""
        own = [lp.dim for lp in self.schedule.of(stage.name).loops]
        vector = structure.vector_dim(self.program, stage, tuple(own))
        pure = structure.by_stride(self.program, stage, [d for d in own if d not in stage.reduce_dims and d != vector])
        reductions = structure.by_stride(self.program, stage, [d for d in own if d in stage.reduce_dims and d != vector])
        outer = None
        if vector is None:
            order = pure + reductions
        else:
            width = model.vector_width(self.target, stage.dtype, self.program.size(vector))
            outer, inner = self.split(stage.name, vector, width)
            if vector in stage.reduce_dims:
                order = pure + reductions + [outer, inner]
            else:
                order = pure + [outer] + reductions + [inner]
            self.schedule = self.schedule.annotate(stage.name, inner, "vectorize")
            kind = "reduction, kept as vector partial sums" if vector in stage.reduce_dims else "pure"
            self.note(stage.name, f"vectorize {vector} by {width} lanes ({kind}): "
                                  f"{structure.unit_stride_count(self.program, stage, vector)} of its accesses "
                                  f"are contiguous along it; {self.target.lanes(stage.dtype)} lanes per register")
        self.reorder(stage.name, [lp for lp in order if lp])
        if threads:
            work = math.prod(self.program.size(d) for d in stage.loop_dims)
            vector_outer = [outer] if outer and vector not in stage.reduce_dims else []
            self.threads(stage.name, pure + vector_outer, work)

    # Contractions ------------------------------------------------------------------------
    def tiled(self, stage: ir.Stage, found: structure.Contraction):
        """Register tile, reduction block for L1, column block and packed panel for L2, threads."""
        itemsize = np.dtype(stage.dtype).itemsize
        size = self.program.size
        tile = model.register_tile(self.target, self.target.lanes(stage.dtype), size(found.row), size(found.col))
        self.note(stage.name, tile.reason(self.target) + f" (rows {found.row}, vectors along {found.col})")
        reductions = structure.by_stride(self.program, stage, list(stage.reduce_dims))
        first, rest = reductions[0], reductions[1:]
        rest_length = math.prod(size(d) for d in rest)
        kc = model.reduction_block(self.target, tile, itemsize)
        block = model.balanced(size(first), max(1, kc // rest_length))
        reduce_outer, reduce_inner = self.split(stage.name, first, block)
        kc = block * rest_length
        if reduce_outer:
            self.note(stage.name, f"reduction block {first} by {block} ({kc} products per result per pass): "
                                  f"a {tile.rows}x{kc} and a {kc}x{tile.columns} panel take "
                                  f"{(tile.rows + tile.columns) * kc * itemsize // 1024} KiB, half of L1 at most")
        col_outer, col_rest = self.l2_block(stage.name, found.col, kc, itemsize, tile.columns, found.reused)
        col_tiles, col_tile = self.split(stage.name, col_rest, tile.columns)
        vectors, lanes = self.split(stage.name, col_tile, tile.lanes)
        row_blocks, row_rest = self.l2_block(stage.name, found.row, kc, itemsize, tile.rows, found.broadcast)
        row_tiles, rows = self.split(stage.name, row_rest, tile.rows)
        others = structure.by_stride(self.program, stage, [d for d in stage.dims if d not in (found.row, found.col)])
        reused_dims = structure.dims_read(self.program, stage, found.reused)
        before = [d for d in others if d in reused_dims]
        after = [d for d in others if d not in reused_dims]
        blocks = [lp for lp in (col_outer, reduce_outer, row_blocks) if lp]
        outer = [lp for lp in before + blocks + [col_tiles] + after + [row_tiles] if lp]
        work = math.prod(size(d) for d in stage.loop_dims)
        parallel = self.parallel_loop(stage.name, [lp for lp in outer if lp != reduce_outer], work) \
            if self.choices.threads else None
        if parallel and parallel not in (row_blocks, row_tiles):
            outer = [parallel] + [lp for lp in outer if lp != parallel]
            self.note(stage.name, f"parallel {parallel} outermost: one parallel region per call (the packed "
                                  f"panels it encloses are made by each thread)")
        order = outer + [reduce_inner] + rest + [rows, vectors, lanes]
        self.reorder(stage.name, [lp for lp in order if lp])
        self.note(stage.name, f"loops: {found.col} tiles outside {found.row} tiles, so each {tile.columns}-column "
                              f"micro-panel of {found.reused} stays in L1 while {found.broadcast} streams past")
        for loop, annotation in ((rows, "unroll"), (vectors, "unroll"), (lanes, "vectorize")):
            if loop:
                self.schedule = self.schedule.annotate(stage.name, loop, annotation)
        if self.choices.pack and (row_blocks or row_tiles) and self.packing_pays(stage, found, itemsize):
            enclosing = set(before + blocks + [col_tiles])
            depth = max((i + 1 for i, lp in enumerate(outer) if lp in enclosing), default=0)
            self.pack(stage, found, outer[:depth], reductions)
        if parallel:
            self.schedule = self.schedule.annotate(stage.name, parallel, "parallel")

    def l2_block(self, stage: str, dim: str, kc: int, itemsize: int, multiple: int, operand: str):
        """Block `dim` (by a multiple of the tile) so that the kc-long slices of `operand` along it
        fill half of L2 at most; (outer, inner) loop names."""
        block = model.balanced(self.program.size(dim), model.l2_block(self.target, kc, itemsize), multiple)
        outer, inner = self.split(stage, dim, block)
        if outer:
            self.note(stage, f"{dim} block {block}: the {kc}x{block} panel of {operand} takes "
                             f"{kc * block * itemsize // 1024} KiB, half of L2 at most")
        return outer, inner

    def packing_pays(self, stage: ir.Stage, found: structure.Contraction, itemsize: int) -> bool:
        """Packing the reused operand pays when its vectors are not contiguous (a transposed operand)
        or when it does not fit in the share of L1 the model allows (its rows would evict each other)."""
        loads = [ld for ld in ir.loads(stage.expr) if ld.buffer == found.reused]
        gathered = any(abs(structure.load_strides(self.program, ld).get(found.col, 0)) != 1 for ld in loads)
        footprint = math.prod(self.program.buffer_shape(found.reused)) * itemsize
        return gathered or footprint > self.target.l1 // model.CACHE_SHARE

    def pack(self, stage: ir.Stage, found: structure.Contraction, blocks: list[str], reductions: list[str]):
        """Copy the reused operand's micro-panel (reductions outer, columns innermost) inside the loops
        `blocks`, the last of which steps over column tiles: one contiguous panel per tile."""
        dims = self.program.buffer_dims(found.reused)
        order = tuple([d for d in reductions if d in dims] + [d for d in dims if d not in reductions and d != found.col]
                      + [found.col])
        if sorted(order) != sorted(dims):
            return
        copy = f"{found.reused}.{stage.name}"
        self.schedule = self.schedule.cache(stage.name, found.reused, order)
        if blocks:
            self.schedule = self.schedule.place(copy, stage.name, len(blocks))
        where = f"once per {', '.join(blocks)}" if blocks else "once"
        self.note(stage.name, f"pack {found.reused} as ({', '.join(order)}) {where}: it is re-read by every row "
                              f"tile, and packed its micro-panel is one contiguous block")

    # Shared steps ------------------------------------------------------------------------
    def split(self, stage: str, loop: str | None, factor: int) -> tuple[str | None, str | None]:
        """(outer, inner) names after splitting `loop` by `factor`; no split (outer None) when it
        would not divide the loop."""
        if loop is None:
            return None, None
        extent = next(lp.extent for lp in self.schedule.of(stage).loops if lp.name == loop)
        if factor >= extent:
            return None, loop
        self.schedule = self.schedule.split(stage, loop, factor)
        return f"{loop}.0", f"{loop}.1"

    def reorder(self, stage: str, order: list[str]):
        """Put the stage's loops in `order` (nothing to do for a single loop)."""
        if len(order) > 1:
            self.schedule = self.schedule.reorder(stage, *order)

    def parallel_loop(self, stage: str, candidates: list[str], work: int) -> str | None:
        """The outermost candidate loop with enough iterations for the cores, or None."""
        extents = {lp.name: lp.extent for lp in self.schedule.of(stage).loops}
        for loop in candidates:
            if model.worth_threads(self.target, extents[loop], work):
                self.note(stage, f"parallel {loop}: {extents[loop]} iterations for {self.target.cores} cores")
                return loop
        return None

    def threads(self, stage: str, candidates: list[str], work: int):
        """Run the outermost candidate loop with enough iterations for the cores on threads."""
        loop = self.parallel_loop(stage, candidates, work)
        if loop:
            self.schedule = self.schedule.annotate(stage, loop, "parallel")


def covering_depth(loop_dims: list[str], dims: tuple[str, ...]) -> int | None:
    """The number of outer loops that run over exactly `dims` (every loop of them), or None."""
    depth = 0
    while depth < len(loop_dims) and loop_dims[depth] in dims:
        depth += 1
    if depth == 0 or set(loop_dims[:depth]) != set(dims) or any(d in dims for d in loop_dims[depth:]):
        return None
    return depth
