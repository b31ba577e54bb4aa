"""Tails of GPU register tiles: which run whole, which run as edge tiles, and where a thread tests its tile.

A register tile is a buffer each thread keeps (a thread slice, or a buffer placed inside thread-bound
loops) that unrolled and vectorized loops index by constants, so LLVM keeps it in registers. A tail
of one of those loops cannot run as the shared builder runs tails, a rolled loop for the last
iterations: its variable would index the tile, which then moves to local memory. That is what made
a float32 matmul of 1000 x 1500 x 777 take 100 s to compile (each tail a full copy and a rolled
copy of everything inside it: 8849 branches, 9.6 MB of LLVM IR, a 34 KB local frame). Such a tail
(`register_tails`) instead

- runs whole, as if it had no tail, where every statement under it may run past it
  (`runs_past_tail`): it writes a register tile inside its bounds, the tail is on one of its
  result's dims, and it reads only inside its buffers. For the tile's lifetime each of its elements
  is one place of the result, and the places past a tail lie outside what any statement reads
  there, so the extra iterations only fill elements nobody reads (junk, never a fault); or
- runs as an edge tile (`_GpuBuilder.edge_loop` in gpu.py): every copy, its statements taking
  effect only inside the limits. It is tested once, at the nearest plain or bound loop around it
  (`tail_host`: for a thread's tile, its innermost thread loop), whose body is emitted twice: a copy
  free of the tile's tail tests, and the edge tile.
"""
from __future__ import annotations

import dataclasses

from .. import ir
from ..ir import Affine
from ..schedule import GPU_AXES, LoopNode, LoopTree, StmtNode, accesses, tensor_role, thread_bound, walk
from .llvm import dependent_host


def register_buffers(tree: LoopTree) -> set[str]:
    """Local buffers each thread keeps to itself: its thread slices and the buffers placed in a thread-bound
    loop's body or deeper (`thread_private`)."""
    return set(tree.thread_slices) | set(tree.thread_private)


def register_tails(tree: LoopTree) -> tuple[set[int], set[int]]:
    """(tails that run whole, tails that run as edge tiles): the ids of the unrolled and vectorized
    loops with a tail that an access to a register tile moves with, holding no tensor-core tile."""
    registers = register_buffers(tree)
    whole, edge = set(), set()
    for node, path in tree.walk():
        if isinstance(node, LoopNode) and node.limits and node.loop.annotation in ("unroll", "vectorize") \
                and not holds_tensor([node]) and _moves_through(tree, node, registers):
            past = all(runs_past_tail(tree, stmt, path + [node] + inner, node.loop.dim, registers)
                       for stmt, inner in walk(node.body) if isinstance(stmt, StmtNode))
            (whole if past else edge).add(id(node))
    return whole, edge


def runs_past_tail(tree: LoopTree, stmt: StmtNode, path: list[LoopNode], dim: str, registers: set[str]) -> bool:
    """Whether a statement may run past a tail of dim `dim`: it writes a register tile, each axis of
    the place inside the tile for its loops' whole extents (distinct places, distinct elements),
    `dim` is one of the result's dims, none of its reduction dims is bound to threads (those combine
    partial sums across threads) and every load stays inside its buffer."""
    stage = stmt.stage
    loads = [] if stmt.kind == "init" else ir.loads(stage.expr)
    return stage.name in registers and dim in stage.dims \
        and not any(thread_bound(node) and node.loop.dim in stage.reduce_dims for node in path) \
        and inside_buffer(tree, stage.name, Affine.identity(stage.dims), stmt, path, axes=True) \
        and all(load.clamped or inside_buffer(tree, load.buffer, load.index, stmt, path) for load in loads)


def clamped_outside(tree: LoopTree, stmt: StmtNode, path: list[LoopNode]) -> ir.Expr:
    """A statement's expression with each load that may leave its buffer for the whole extents of its
    loops (`inside_buffer`) clamped into it: what an edge tile computes past its tail, and discards."""
    def clamp(e: ir.Expr) -> ir.Expr:
        if isinstance(e, ir.Load):
            inside = e.clamped or inside_buffer(tree, e.buffer, e.index, stmt, path)
            return e if inside else dataclasses.replace(e, clamped=True)
        if isinstance(e, ir.Select):
            return dataclasses.replace(e, then=clamp(e.then), otherwise=clamp(e.otherwise))
        if isinstance(e, ir.Unary | ir.Cast):
            return dataclasses.replace(e, x=clamp(e.x))
        if isinstance(e, ir.Binary):
            return dataclasses.replace(e, a=clamp(e.a), b=clamp(e.b))
        return e
    return clamp(stmt.stage.expr)


def inside_buffer(tree: LoopTree, buffer: str, index: tuple[Affine, ...], stmt: StmtNode, path: list[LoopNode],
                  axes: bool = False) -> bool:
    """Whether an access to a local buffer stays inside it for every value of the statement's loops up
    to their extents, tails or not: inside its elements (a thread slice holds every access by
    construction), or with `axes` each axis inside its size (so distinct places are distinct elements)."""
    plan = tree.buffers[buffer]
    if plan.kind != "local":
        return False
    extents = {node.loop.name: node.loop.extent for node in path}
    place = tuple(ix.substitute(stmt.index) for ix in index)
    if axes:
        return all(0 <= low and high < size for (low, high), size in
                   zip((ix.span(extents) for ix in plan.element_index(place)), plan.shape))
    if buffer in tree.thread_slices:
        return True
    low, high = plan.linear_offset(place).span(extents)
    return 0 <= low and high < plan.size


def _moves_through(tree: LoopTree, node: LoopNode, buffers: set[str]) -> bool:
    """Whether an access to one of `buffers` below the loop moves with it."""
    for stmt, _ in walk([node]):
        if isinstance(stmt, StmtNode):
            for access in accesses(stmt):
                if access.buffer not in buffers:
                    continue
                place = tuple(ix.substitute(stmt.index) for ix in access.index)
                if tree.buffers[access.buffer].linear_offset(place).coeffs().get(node.loop.name):
                    return True
    return False


def tail_host(whole: set[int], edge: set[int], node: LoopNode, lim, path: list[LoopNode],
              skip=frozenset()) -> int | None:
    """The depth in `path` of the loop that tests a tail: none for one that runs whole or is in `skip` (it
    tests its own); for an edge
    tile's, the nearest loop around it that is plain or bound to blocks or threads and holds no
    tensor-core tile; for any other, the shared builder's `dependent_host`."""
    if id(node) in whole or id(node) in skip:
        return None
    if id(node) not in edge:
        return dependent_host(node, lim, path)
    for depth in range(len(path) - 1, -1, -1):
        annotation = path[depth].loop.annotation
        if annotation in ("unroll", "vectorize"):
            continue
        return depth if (not annotation or annotation in GPU_AXES) and not holds_tensor(path[depth].body) else None
    return None


def holds_tensor(body: list) -> bool:
    """Whether a tensor-core tile (mma or wgmma) lies in `body`."""
    return any(isinstance(node, LoopNode) and tensor_role(node.loop) for node, _ in walk(body))
