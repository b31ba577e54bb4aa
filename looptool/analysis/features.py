"""Features of a schedule for a learned cost model, read off the loop tree without compiling it.

Each statement (innermost body) of the tree is described by: its trip counts and tile sizes
at each loop level (innermost first) with their annotations, its vector width, the arithmetic
in one unrolled innermost body, whether its accesses are contiguous along the innermost and
vectorized loops, the bytes its accesses touch under each loop level (footprints), the bytes
it moves into each cache level (in all and per iteration), its arithmetic per byte moved into the
first cache level, the reuse of each input it reads, its parallel work per thread and its
placement depth.  The heaviest statements (most iterations) come first; a few
whole-tree counts follow.  Sizes enter as log2(1 + x), so the vector suits tree models and
compares across problem sizes.  `FEATURE_VERSION` changes whenever the layout does.
"""
from __future__ import annotations

import math

import numpy as np

from .. import ir
from ..schedule import LoopNode, LoopTree, accesses
from .target import host

FEATURE_VERSION = 2
STATEMENTS = 4          # statements described, heaviest first
LEVELS = 8              # loop levels described per statement, innermost first
READS = 3               # reuse of the reads with the most reuse
CACHE_LINE_BYTES = 64
ARITHMETIC_OPS = ("+", "-", "*", "/", "max", "min")


def log2p(x: float) -> float:
    """log2(1 + x): the scale every size and count enters the vector in."""
    return math.log2(1.0 + max(x, 0.0))


def statement_width(cache_levels: int) -> int:
    """How many numbers describe one statement."""
    return 4 * LEVELS + 16 + 2 * cache_levels + 1 + READS


def feature_length(cache_levels: int = 3) -> int:
    """Length of the vector `schedule_features` returns for this many cache levels."""
    return STATEMENTS * statement_width(cache_levels) + 6


def schedule_features(tree: LoopTree, cache_bytes: tuple[int, ...] | None = None,
                      threads: int = 1) -> np.ndarray:
    """The fixed-length feature vector of `tree` (float64, `feature_length(len(cache_bytes))` long).

    `cache_bytes` are the data cache sizes of the target, smallest first (default: this machine's,
    from the target model); `threads` the cores a parallel loop is shared over."""
    cache_bytes = cache_bytes or host().cache_bytes
    described = sorted((_statement(tree, stmt, path, cache_bytes, threads) for stmt, path in tree.statements()),
                       key=lambda row: -row[0])
    width = statement_width(len(cache_bytes))
    rows = [row[1] for row in described[:STATEMENTS]]
    rows += [np.zeros(width)] * (STATEMENTS - len(rows))
    schedule = tree.schedule
    stages = [schedule.of(st.name) for st in tree.program.stages]
    placed = [s for s in stages if s.consumer is not None]
    loops = [node.loop for node, _ in tree.walk() if isinstance(node, LoopNode)]
    total = sum(row[0] for row in described)
    overall = np.array([len(described), len(placed), sum(s.at for s in placed), log2p(total),
                        sum(lp.annotation == "parallel" for lp in loops), sum(lp.annotation == "unroll" for lp in loops)])
    return np.concatenate(rows + [overall])


def _statement(tree, stmt, path, cache_bytes, threads) -> tuple[float, np.ndarray]:
    """(iterations, the statement's numbers)."""
    extents = [node.loop.extent for node in path]
    iterations = math.prod(extents)
    inner = list(reversed(path))[:LEVELS]
    levels = np.zeros((4, LEVELS))
    offsets = _offsets(tree, stmt)
    traffic = _footprints(offsets, path)
    for i, node in enumerate(inner):
        annotation = node.loop.annotation
        levels[:, i] = (log2p(node.loop.extent), annotation == "vectorize", annotation == "unroll",
                        log2p(traffic[len(path) - 1 - i]))
    vector = path[-1].loop.extent if path and path[-1].loop.annotation == "vectorize" else 1
    unrolled = 1
    for node in reversed(path):
        if node.loop.annotation not in ("vectorize", "unroll"):
            break
        unrolled *= node.loop.extent
    parallel = math.prod(n.loop.extent for n in path if n.loop.annotation == "parallel")
    contiguous_inner = _strides(offsets, path[-1].loop.name if path else None)
    vector_loop = next((n.loop.name for n in path if n.loop.annotation == "vectorize"), None)
    contiguous_vector = _strides(offsets, vector_loop)
    plan = tree.buffers[stmt.stage.name]
    ops = _arithmetic(stmt.stage.expr) + (stmt.kind == "update")
    scalars = np.array([
        log2p(iterations), len(path), log2p(vector), log2p(unrolled), log2p(ops * unrolled),
        *contiguous_inner, *contiguous_vector,
        log2p(parallel), log2p(iterations / max(1, min(parallel, threads))),
        tree.schedule.of(stmt.stage.name).at, plan.kind == "local", stmt.kind == "init",
    ])
    moved = [_bytes_into_cache(traffic, extents, size) for size in cache_bytes]
    # Per iteration, so schedules of different problem sizes compare: bytes into each cache level and
    # arithmetic per byte brought into the first.
    normalised = [log2p(m / max(1, iterations)) for m in moved] + [log2p(ops * iterations / max(1.0, moved[0]))]
    return iterations, np.concatenate([levels.ravel(), scalars, [log2p(m) for m in moved], normalised,
                                       _reuse(offsets, stmt, path, iterations)])


def _arithmetic(expr: ir.Expr) -> int:
    """Arithmetic operations in an expression (loads and constants are free)."""
    if isinstance(expr, ir.Binary):
        return (expr.op in ARITHMETIC_OPS) + _arithmetic(expr.a) + _arithmetic(expr.b)
    if isinstance(expr, ir.Unary | ir.Cast):
        return 1 + _arithmetic(expr.x)
    if isinstance(expr, ir.Select):
        return 1 + _arithmetic(expr.then) + _arithmetic(expr.otherwise)
    return 0


def _offsets(tree, stmt) -> list[tuple[ir.Affine, int, str]]:
    """Each distinct access of a statement: (element offset over loop names, item bytes, buffer)."""
    seen = {}
    for access in accesses(stmt):
        plan = tree.buffers[access.buffer]
        offset = plan.linear_offset(tuple(ix.substitute(stmt.index) for ix in access.index))
        seen[(access.buffer, offset)] = (offset, np.dtype(plan.dtype).itemsize, access.buffer)
    return list(seen.values())


def _strides(offsets, loop: str | None) -> tuple[float, float, float]:
    """Fractions of a statement's accesses (`_offsets`) that along `loop` stay put, are contiguous,
    or stride."""
    if loop is None:
        return 0.0, 0.0, 0.0
    strides = [abs(offset.coeffs().get(loop, 0)) for offset, _, _ in offsets]
    count = len(strides)
    return (sum(s == 0 for s in strides) / count, sum(s == 1 for s in strides) / count,
            sum(s > 1 for s in strides) / count)


def _footprint(offset: ir.Affine, loops) -> int:
    """Distinct elements an access touches over `loops` (at most the count of iterations with a
    nonzero coefficient, and at most the span of its offsets)."""
    coeffs = offset.coeffs()
    moving = [(abs(coeffs[n.loop.name]), n.loop.extent) for n in loops if coeffs.get(n.loop.name)]
    return min(math.prod(e for _, e in moving), 1 + sum(c * (e - 1) for c, e in moving))


def _footprints(offsets, path) -> list[float]:
    """Bytes a statement's accesses (`_offsets`) touch inside each loop of its path (one number per
    loop, outermost first), whole cache lines counted where an access strides along the innermost loop."""
    out = []
    inner_loop = path[-1].loop.name if path else None
    for depth in range(len(path)):
        total = 0.0
        for offset, item, _ in offsets:
            elements = _footprint(offset, path[depth:])
            stride = abs(offset.coeffs().get(inner_loop, 0)) * item
            total += elements * max(item, min(stride, CACHE_LINE_BYTES))
        out.append(total)
    return out


def _bytes_into_cache(traffic: list[float], extents: list[int], size: int) -> float:
    """Bytes moved into a cache of `size` bytes: the footprint of the outermost loop body that fits,
    once per iteration of the loops around it."""
    for depth, touched in enumerate(traffic):
        if touched <= size:
            return touched * math.prod(extents[:depth])
    return (traffic[-1] if traffic else 0.0) * math.prod(extents)


def _reuse(offsets, stmt, path, iterations: int) -> np.ndarray:
    """log2 of uses per element touched for the reads with the most reuse (padded with zeros)."""
    reads = [offset for offset, _, buffer in offsets if buffer != stmt.stage.name]
    reuse = sorted((log2p(iterations / max(1, _footprint(offset, path))) for offset in reads), reverse=True)
    return np.array((reuse + [0.0] * READS)[:READS])
