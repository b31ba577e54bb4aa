"""The search space: schedules of a loop tree, drawn with Optuna's define-by-run API.

The output stage is tiled for the memory hierarchy: every dim gets a cache block
(`d.0` outer, permuted freely; reductions `k.0`/`k.1`), every pure dim a middle
level (`d.1.0`, permuted freely) and a register tile (`d.1.1`): unrolled, with the
output's contiguous dim innermost as SIMD lanes.  Inputs may be packed through a
copy placed at any cache-level depth, the outermost loop may run in parallel, and
producer stages are placed at a chosen depth of their consumer.  Parameter names carry
the stage and dim, so each one's choices are fixed for a study.
"""
from __future__ import annotations

import itertools

import optuna

from looptool import ir
from looptool.looptree import LoopTree

TILE_FACTORS = (1, 2, 3, 4, 5, 6, 8)
LANE_FACTORS = (8, 16, 32, 48, 64)
BLOCK_FACTORS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
UNROLL_LIMIT = 8


class InvalidDraw(ValueError):
    """A drawn combination of transforms that the schedule API refused."""


def sample(trial: optuna.Trial, tree: LoopTree, threads: int = 1) -> LoopTree:
    """Draw one schedule for `tree` (illegal ones are possible: the caller checks them)."""
    placed: set[str] = set()
    try:
        for stage in reversed(tree.program.stages):
            sched = tree.schedule.of(stage.name)
            if sched.consumer is None and stage is tree.program.output:
                tree = _tile_stage(trial, tree, stage.name, threads)
            for producer in _producers(tree, stage.name):
                if producer not in placed and tree.schedule.of(producer).consumer is None:
                    placed.add(producer)
                    tree = _place_producer(trial, tree, producer, stage.name)
    except ValueError as err:
        raise InvalidDraw(str(err)) from None
    return tree


def _producers(tree: LoopTree, stage: str) -> list[str]:
    program = tree.program
    consumer = program.stage(stage)
    reads = {ld.buffer for ld in _loads(consumer)}
    return [st.name for st in program.stages if st.name in reads]


def _loads(stage):
    return list(ir.loads(stage.expr))


def _tile_stage(trial: optuna.Trial, tree: LoopTree, stage_name: str, threads: int) -> LoopTree:
    """Cache-block every dim; give pure dims a register tile, the contiguous one as SIMD lanes."""
    stage = tree.program.stage(stage_name)
    lanes_dim = stage.dims[-1] if stage.dims else None
    outer, middle, register = [], [], []
    for dim in stage.loop_dims:
        size = tree.program.size(dim)
        if dim in stage.reduce_dims:
            block = _choose(trial, f"{stage_name}.{dim}.block", [g for g in BLOCK_FACTORS if g <= size])
            tree = tree.split(dim, block, stage=stage_name)
            outer.append(f"{dim}.0")
            middle.append(f"{dim}.1")
            continue
        options = [w for w in LANE_FACTORS if w <= size] if dim == lanes_dim else \
            [f for f in TILE_FACTORS if f <= size]
        tile = _choose(trial, f"{stage_name}.{dim}.tile", options or [size])
        block = _choose(trial, f"{stage_name}.{dim}.block", [g for g in BLOCK_FACTORS if g <= size])
        tree = tree.split(dim, tile * block, stage=stage_name).split(f"{dim}.1", tile, stage=stage_name)
        outer.append(f"{dim}.0")
        middle.append(f"{dim}.1.0")
        register.append(f"{dim}.1.1")
    outer = _permutation(trial, f"{stage_name}.order0", outer)
    middle = _permutation(trial, f"{stage_name}.order1", middle)
    register = sorted(register, key=lambda loop: loop.split(".")[0] == lanes_dim)
    tree = tree.reorder(*(outer + middle + register), stage=stage_name)
    for loop in register:
        extent = _extent(tree, stage_name, loop)
        if loop.split(".")[0] == lanes_dim and extent >= 8:
            tree = tree.vectorize(loop, stage=stage_name)
        elif 1 < extent <= UNROLL_LIMIT:
            tree = tree.unroll(loop, stage=stage_name)
    for buffer in sorted({ld.buffer for ld in _loads(stage) if ld.buffer.startswith("in")}):
        depth = trial.suggest_int(f"{stage_name}.pack.{buffer}", 0, len(outer) + len(middle))
        if depth:
            tree = tree.cache(buffer, stage=stage_name).place(f"{buffer}.{stage_name}", stage_name, depth)
    if threads > 1 and trial.suggest_categorical(f"{stage_name}.parallel", [True, False]):
        tree = tree.parallel(outer[0], stage=stage_name)
    return tree


def _place_producer(trial: optuna.Trial, tree: LoopTree, producer: str, consumer: str) -> LoopTree:
    loops = tree.schedule.effective_loops(consumer)
    depth = trial.suggest_int(f"{producer}.depth", 0, min(len(loops), 4))
    if depth:
        tree = tree.place(producer, consumer, depth)
    own = tree.schedule.of(producer).loops
    if own and own[-1].extent >= 16 and trial.suggest_categorical(f"{producer}.vectorize", [True, False]):
        last = own[-1].name
        tree = tree.split(last, 16, stage=producer).vectorize(f"{last}.1", stage=producer)
    return tree


def _extent(tree: LoopTree, stage: str, loop: str) -> int:
    return next(lp.extent for lp in tree.schedule.of(stage).loops if lp.name == loop)


def _choose(trial: optuna.Trial, name: str, options: list[int]) -> int:
    return trial.suggest_categorical(name, options or [1])


def _permutation(trial: optuna.Trial, name: str, items: list[str]) -> list[str]:
    """A permutation: one categorical over all orders for up to 4 items, else a Lehmer code."""
    if len(items) <= 1:
        return list(items)
    if len(items) <= 4:
        orders = [" ".join(p) for p in itertools.permutations(items)]
        return trial.suggest_categorical(name, orders).split(" ")
    remaining, order = list(items), []
    for pos in range(len(items) - 1):
        order.append(remaining.pop(trial.suggest_int(f"{name}.{pos}", 0, len(remaining) - 1)))
    return order + remaining
