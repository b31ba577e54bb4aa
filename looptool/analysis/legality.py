"""Polyhedral legality: does a scheduled loop tree respect every dependence of its program?

Each statement of the tree is an isl set of loop-variable values (its domain,
tails included) with an isl map to its time (the 2d+1 schedule vector of the
tree) and to the buffer elements it reads and writes.  Dependences are the
pairs of instances that touch one element, at least one of them writing, in
the order the program's default schedule (stages one after another) runs
them.  A schedule is legal when, under its own time, every such pair still runs
in that order; reduction updates of one stage may be reordered among
themselves (sum, max and min are reassociated), except across threads.  Two
more rules follow from the tree: a parallel loop may carry no dependence at all,
and a buffer shrunk to one tile of its consumer's loops must be read in the
same iteration of those loops in which it was written. Tensorized loops
(tensorize.py) must fit their instruction; their tile's sum may be reassociated. Copies that a
pipeline makes with TMA (tma.py) must be boxes of an input in wgmma's layout.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import islpy as isl

from .. import ir
from ..errors import IllegalScheduleError
from ..memo import BoundedMemo
from ..schedule import (ATOMIC_SUMS, BLOCK_AXES, GPU_AXES, LoopNode, LoopTree, StmtNode, accesses, across_blocks,
                        blocked, pipeline_depth, pipeline_persistent, thread_bound, walk)
from ..schedule.printing import stmt_text
from .tensorize import WARP_PARTS, tensor_tiles
from .tma import bulk_copies



def _isl():
    """islpy, imported on first use: `import looptool` and loading an exported kernel never need it."""
    import islpy
    return islpy


_PARSED_MAPS = BoundedMemo(4096)     # isl maps by their text: a scheduler's candidate trees share most statements


def _isl_map(text: str) -> "isl.Map":
    """An isl map parsed from text (parsed once: a parse costs about half a millisecond); the sizes of
    dynamic dims it names (`size_<dim>`) are its parameters."""
    return _PARSED_MAPS.get(text, lambda: _isl().Map(_with_parameters(text)))


def _with_parameters(text: str) -> str:
    """The text of an isl map with the dynamic sizes it names declared as its parameters."""
    params = sorted(set(re.findall(r"\bsize_\w+", text)))
    return f"[{', '.join(params)}] -> {text}" if params else text


def _bound(value) -> str:
    """A size or bound in isl terms: an int, or the parameter of a dynamic dim's size."""
    return f"size_{value.dim}" if isinstance(value, ir.Size) else str(value)


def _below_extent(variable: str, extent) -> str:
    """variable < extent, where a dynamic extent ceil(n / d) is d*variable < n."""
    if isinstance(extent, ir.Size):
        return f"{extent.divisor}*{variable} < size_{extent.dim}"
    return f"{variable} < {extent}"


@dataclass
class _Stmt:
    """One statement of a tree in isl terms: loop values i0, i1, ... along its path."""

    node: StmtNode
    path: list[LoopNode]
    time: list[str]
    dynamic: tuple[tuple[str, int], ...] = ()     # the program's dynamic dims and their minimum sizes

    @property
    def names(self) -> dict[str, str]:
        return {n.loop.name: f"i{k}" for k, n in enumerate(self.path)}

    @property
    def variables(self) -> str:
        return ", ".join(f"i{k}" for k in range(len(self.path)))

    @property
    def constraints(self) -> str:
        cons = []
        for k, n in enumerate(self.path):
            cons.append(f"0 <= i{k} and {_below_extent(f'i{k}', n.loop.extent)}")
            for lim in n.limits:
                cons.append(f"{lim.coeff}*i{k} + {_isl_affine(lim.rest, self.names)} < {_bound(lim.bound)}")
        cons += [f"size_{dim} >= {minimum}" for dim, minimum in self.dynamic]
        return " and ".join(cons) or "true"

    def dim_value(self, index: ir.Affine) -> str:
        """An affine of dims (full coordinates) as an isl expression of the loop values."""
        return _isl_affine(index.substitute(self.node.index), self.names)

    def text(self) -> str:
        return stmt_text(self.node)


def check(tree: LoopTree) -> tuple[bool, str]:
    """(True, "legal") or (False, reason in plain words) for a scheduled loop tree."""
    try:
        assert_legal(tree)
    except IllegalScheduleError as err:
        return False, str(err)
    return True, "legal"


# Verdicts by program and per-stage loops (what the tree is made of), so a tree checked when it was
# chosen (by the automatic scheduler or the tuner's sampler) is not checked again when it is
# measured or compiled; the oldest are forgotten past VERDICTS_KEPT.
VERDICTS_KEPT = 4096
_VERDICTS = BoundedMemo(VERDICTS_KEPT)


def assert_legal(tree: LoopTree) -> None:
    """Raise IllegalScheduleError naming the broken dependence, or return for a legal tree."""
    verdict = _VERDICTS.get((tree.program, tree.schedule.stages), lambda: _verdict(tree))
    if verdict is not None:
        raise IllegalScheduleError(verdict)


def _verdict(tree: LoopTree) -> str | None:
    try:
        _prove(tree)
    except IllegalScheduleError as err:
        return str(err)
    return None


def _prove(tree: LoopTree) -> None:
    _check_structure(tree)
    bulk_copies(tree, tensor_tiles(tree))
    original = {(s.node.stage.name, s.node.kind): s for s in _statements(LoopTree(tree.program))}
    stmts = _statements(tree)
    pairs = [(src, dst) for src in stmts for dst in stmts]
    pairs.sort(key=lambda p: (p[0].node.stage is p[1].node.stage, p[0].node.kind == "init"))
    for src, dst in pairs:
        for buffer, kinds in _shared_accesses(src.node, dst.node):
            _check_pair(tree, src, dst, buffer, kinds, original)


def _check_structure(tree: LoopTree):
    emitted = {(stmt.stage.name, stmt.kind) for stmt, _ in tree.statements()}
    for stage in tree.program.stages:
        kinds = ("init", "update") if stage.reduce_op else ("assign",)
        for kind in kinds:
            if (stage.name, kind) not in emitted:
                raise IllegalScheduleError(f"stage {stage.name} is never computed: its placement "
                                           f"(at depth {tree.schedule.of(stage.name).at} of "
                                           f"{tree.schedule.of(stage.name).consumer}) lies outside the loops "
                                           f"that exist")
    for stmt, path in tree.statements():
        parallel = [n.loop.name for n in path if n.loop.annotation == "parallel"]
        if len(parallel) > 1:
            raise IllegalScheduleError(f"stage {stmt.stage.name} is inside two parallel loops {parallel}; "
                                       f"parallelize only one loop of a nest")
    for node, _ in tree.walk():
        if isinstance(node, LoopNode) and node.loop.annotation == "vectorize":
            if any(isinstance(child, LoopNode) for child in node.body):
                raise IllegalScheduleError(f"loop '{node.loop.name}' is vectorized but has loops inside it; "
                                           f"vectorize an innermost loop")
            for plan in tree.local_buffers.get(id(node), []):
                raise IllegalScheduleError(
                    f"buffer {plan.name} is shrunk to one tile per iteration of the vectorized loop "
                    f"'{node.loop.name}', so its lanes would share it: place stage {plan.name} outside "
                    f"'{node.loop.name}' or do not vectorize it")
    _check_pipelines(tree)
    _check_dynamic_buffers(tree)
    _check_blocks(tree)
    for stmt, path in tree.statements():
        _check_one_loop_an_axis(stmt, path)


def _check_one_loop_an_axis(stmt, path):
    """A GPU block or thread index is one loop's value: two nested loops bound to one axis would both take it."""
    for axis in GPU_AXES:
        bound = [n.loop.name for n in path if n.loop.annotation == axis]
        if len(bound) > 1:
            raise IllegalScheduleError(f"stage {stmt.stage.name} is inside loops {bound}, all bound to {axis}: a GPU "
                                       f"index runs one loop of a nest; bind the others to another axis or none")


def _check_dynamic_buffers(tree: LoopTree):
    """Buffers the schedule makes must have fixed strides: a dynamic size only on the first axis of a
    full-size buffer (a local tile of fixed loops, however large the dim)."""
    for plan in tree.buffers.values():
        dynamic = [(axis, n) for axis, n in enumerate(plan.storage_shape) if isinstance(n, ir.Size)]
        if plan.kind == "local" and dynamic:
            raise IllegalScheduleError(f"buffer {plan.name} is placed inside other loops but holds all of dynamic dim "
                                       f"'{dynamic[0][1].dim}' (size {dynamic[0][1]}), a size known only at run "
                                       f"time: place it inside a loop over '{dynamic[0][1].dim}' or leave it unplaced")
        if any(axis for axis, _ in dynamic):
            raise IllegalScheduleError(f"buffer {plan.name} has dims {plan.dims}: dynamic dim '{dynamic[-1][1].dim}' "
                                       f"must be its first axis (its strides would depend on a size known only at "
                                       f"run time)")


def _check_blocks(tree: LoopTree):
    """Every access to a temp kept in blocks (`Schedule.block`) must take its place within a block from
    loops that stay inside one block: its address is read off its loops' terms (`looptree.blocked`)."""
    plans = {name: plan for name, plan in tree.buffers.items() if plan.block}
    for stmt, path in tree.statements() if plans else ():
        for access in accesses(stmt):
            plan = plans.get(access.buffer)
            if plan is None:
                continue
            dim, size, _ = plan.block
            _, place = blocked(access.index[plan.dims.index(dim)].substitute(stmt.index), size)
            extents = {node.loop.name: node.loop.extent for node in path}
            dynamic = [v for v, _ in place.terms if isinstance(extents[v], ir.Size)]
            low, high = place.span(extents)
            if dynamic or low < 0 or high >= size:
                reach = f"loop {dynamic[0]}, whose extent is known only at run time, moves it" if dynamic else \
                    f"its loops take it from {low} to {high}"
                raise IllegalScheduleError(
                    f"buffer {access.buffer} keeps dim '{dim}' in blocks of {size}, but stage {stmt.stage.name} reaches "
                    f"it at {place} within a block and {reach}: split its loops over '{dim}' by {size} first")


def _check_pipelines(tree: LoopTree):
    """A pipelined loop runs at block level and prefetches copies of buffers its kernel does not write.

    Copies of iteration i are issued at iteration i - (stages - 1) into buffer i mod stages, so
    they may move ahead of the rest of the body when they read nothing written in the same
    top-level nest (one GPU kernel: the nests before it have finished when it starts), and
    their buffer is read nowhere but in the same iteration.  The copies of iteration i form the
    (i+1)-th group, after the stages - 1 groups of the prologue; waiting until at most
    `in_flight` groups run completes it exactly when in_flight <= stages - 2; the barrier after
    the wait makes every thread's copies visible, and it also orders the copy into buffer
    (i-1) mod stages after every thread's reads of it in iteration i - 1."""
    for node, path in tree.walk():
        depth = isinstance(node, LoopNode) and pipeline_depth(node.loop.annotation)
        if not depth:
            continue
        stages, in_flight = depth
        name = node.loop.name
        if in_flight > stages - 2:
            raise IllegalScheduleError(
                f"loop '{name}' is pipelined with {stages} stages but waits only until {in_flight} groups of "
                f"copies are in flight: the copy for an iteration is issued {stages - 1} iterations ahead, so "
                f"it could still be running when the iteration reads it (at most {stages - 2} may stay in flight)")
        bound = [p.loop.name for p in path if thread_bound(p)]
        if bound:
            raise IllegalScheduleError(f"loop '{name}' is pipelined inside thread-bound loops {bound}; pipeline a "
                                       f"loop that every thread of the block runs (at block level)")
        copies = [plan.name for plan in tree.local_buffers.get(id(node), [])]
        if not copies:
            raise IllegalScheduleError(f"loop '{name}' is pipelined but no stage is placed at it: cache an input "
                                       f"and place its copy at '{name}' to prefetch it")
        if pipeline_persistent(node.loop.annotation):
            check_persistent(node, path)
        written = {stmt.stage.name for stmt, _ in walk(path[:1] or [node]) if isinstance(stmt, StmtNode)}
        for copy in copies:
            _check_prefetchable(tree, node, copy, written)
            if copy in tree.thread_slices:
                raise IllegalScheduleError(
                    f"stage {copy} is placed at pipelined loop '{name}', but each thread reads only its own slice "
                    f"of it, which the GPU keeps in the thread's registers: a pipeline copies into shared memory "
                    f"(cp.async, TMA), where the slices would overlap. Read the copy across threads, or do not "
                    f"pipeline '{name}'")


def check_persistent(node: LoopNode, path: list[LoopNode]):
    """A persistent pipelined loop runs inside its kernel's block-bound loops, each alone in the one around
    it from the kernel's top, one an axis, over a number of tiles known ahead and each running fully; the
    loop itself runs a number of iterations known ahead (its blocks count their iterations across tiles)."""
    name = node.loop.name
    blocks = [p for p in path if p.loop.annotation in BLOCK_AXES]
    kernel_blocks = [n for n, _ in walk(path[:1]) if isinstance(n, LoopNode) and n.loop.annotation in BLOCK_AXES]
    if not blocks or path[:len(blocks)] != blocks or len(kernel_blocks) != len(blocks) \
            or any(len(p.body) != 1 for p in blocks[:-1]):
        raise IllegalScheduleError(
            f"loop '{name}' is pipelined persistently, so its kernel's blocks run the tiles of the block-bound "
            f"loops around it in turn: those must be the kernel's outermost loops, each alone in the one around it, "
            f"and its only block-bound loops (found {[p.loop.name for p in kernel_blocks]})")
    if len({p.loop.annotation for p in blocks}) != len(blocks):
        raise IllegalScheduleError(f"loop '{name}' is pipelined persistently inside two loops bound to one block axis "
                                   f"({[p.loop.annotation for p in blocks]}): bind each to its own axis")
    for loop in [*blocks, node]:
        if isinstance(loop.loop.extent, ir.Size) or loop.limits:
            raise IllegalScheduleError(
                f"loop '{name}' is pipelined persistently, but loop '{loop.loop.name}' runs a number of iterations "
                f"known only at run time ({loop.loop.extent}{', with a tail' if loop.limits else ''}): a persistent "
                f"kernel counts its tiles and their iterations ahead")


def _check_prefetchable(tree: LoopTree, node: LoopNode, copy: str, written: set[str]):
    stage = tree.program.stage(copy)
    if stage.reduce_op or ir.loaded_buffers(stage.expr) & written:
        raise IllegalScheduleError(
            f"stage {copy} is placed at pipelined loop '{node.loop.name}' but is not a copy of a buffer its "
            f"kernel leaves unchanged (it "
            f"{'reduces' if stage.reduce_op else 'reads ' + ', '.join(sorted(ir.loaded_buffers(stage.expr) & written))}"
            f"), so it cannot run iterations ahead")
    writers = [path for stmt, path in tree.statements() if stmt.stage.name == copy]
    if not all(any(thread_bound(p) for p in path) for path in writers):
        raise IllegalScheduleError(
            f"stage {copy} is placed at pipelined loop '{node.loop.name}' but not written inside thread-bound "
            f"loops, so it would not live in shared memory: bind its loops to threads")


def _statements(tree: LoopTree) -> list[_Stmt]:
    out = []

    def rec(body, path, prefix):
        for pos, node in enumerate(body):
            if isinstance(node, LoopNode):
                rec(node.body, path + [node], prefix + [str(pos), f"i{len(path)}"])
            else:
                out.append(_Stmt(node, path, prefix + [str(pos)], tree.program.dynamic))
    rec(tree.root, [], [])
    return out


def _isl_affine(a: ir.Affine, names: dict[str, str]) -> str:
    parts = [f"{c}*{names.get(v, v)}" for v, c in a.terms]
    return "(" + " + ".join(parts + [str(a.const)]) + ")"


def _shared_accesses(a: StmtNode, b: StmtNode):
    """Buffers both statements touch with at least one write, and the access pairs."""
    pairs: dict[str, list] = {}
    for x in accesses(a):
        for y in accesses(b):
            if x.buffer == y.buffer and (x.write or y.write):
                pairs.setdefault(x.buffer, []).append((x.index, x.write, y.index, y.write))
    return pairs.items()


def _access_map(stmt: _Stmt, tree: LoopTree, buffer: str, index: tuple[ir.Affine, ...]) -> isl.Map:
    """Loop values -> element of `buffer` read or written (only where the index is in bounds)."""
    shape = tree.program.buffer_shape(buffer)
    exprs = [stmt.dim_value(ix) for ix in index]
    bounds = " and ".join(f"0 <= {e} < {_bound(n)}" for e, n in zip(exprs, shape)) or "true"
    return _isl_map(f"{{ [{stmt.variables}] -> B[{', '.join(exprs)}] : {stmt.constraints} and {bounds} }}")


def _time_map(stmt: _Stmt, time: list[str], width: int) -> isl.Map:
    padded = time + ["0"] * (width - len(time))
    return _isl_map(f"{{ [{stmt.variables}] -> [{', '.join(padded)}] : {stmt.constraints} }}")


def _original_time(stmt: _Stmt, original: dict) -> list[str]:
    """The time of each instance under the default schedule (one loop per dim), over the tree's loop values."""
    orig = original[(stmt.node.stage.name, stmt.node.kind)]
    return [stmt.dim_value(ir.Affine.var(orig.path[int(t[1:])].loop.dim)) if t.startswith("i") else t
            for t in orig.time]


def _ordered(relation: isl.Map, src: _Stmt, dst: _Stmt, times: tuple[list[str], list[str]],
             after: bool = False) -> isl.Map:
    """The pairs of `relation` whose src instance runs before its dst instance under `times` (at or after it,
    with `after`); decided without isl where the times' first entries (top-level positions) differ, else
    compared over the longer of the two times (zeros past the end of either change no order)."""
    src_time, dst_time = times
    if src_time[0] != dst_time[0]:
        return relation if (int(src_time[0]) < int(dst_time[0])) != after else _isl().Map.empty(relation.get_space())
    width = max(len(src_time), len(dst_time))
    src_map, dst_map = _time_map(src, src_time, width), _time_map(dst, dst_time, width)
    return relation.intersect(src_map.lex_ge_map(dst_map) if after else src_map.lex_lt_map(dst_map))


def _check_pair(tree: LoopTree, src: _Stmt, dst: _Stmt, buffer: str, access_pairs, original):
    same_reduction = (src.node.stage is dst.node.stage and src.node.kind == dst.node.kind == "update")
    old, new = (_original_time(src, original), _original_time(dst, original)), (src.time, dst.time)
    for ix_a, w_a, ix_b, w_b in access_pairs:
        touch = _access_map(src, tree, buffer, ix_a).apply_range(_access_map(dst, tree, buffer, ix_b).reverse())
        if src.node.kind == "assign" and w_a and buffer == src.node.stage.name:
            if dst.node is src.node:
                _check_private_writes(tree, src, buffer, touch)
            elif not w_b:
                _check_fed(tree, src, dst, buffer, _ordered(touch, src, dst, new), touch)
            continue
        deps = _ordered(touch, src, dst, old)
        if deps.is_empty():
            continue
        if not same_reduction:
            broken = _ordered(deps, src, dst, new, after=True)
            if not broken.is_empty():
                raise IllegalScheduleError(_order_message(tree, src, dst, buffer, broken, w_a, w_b))
        _check_parallel(tree, src, dst, buffer, deps)
        _check_gpu_threads(tree, src, dst, buffer, deps)
        if w_a and not w_b:
            _check_local(tree, src, dst, buffer, deps)


def _check_fed(tree: LoopTree, src: _Stmt, dst: _Stmt, buffer: str, earlier: isl.Map, touch: isl.Map):
    """A pure stage may be computed redundantly; each read just needs some write of its element
    before it, in the same iteration of the shared parallel loops and of the loops the buffer is tiled by."""
    plan = tree.buffers[buffer]
    tiles = {name for _, off in plan.offsets for name, _ in off.terms}
    pinned = [k for k in _common_loops(src, dst)
              if src.path[k].loop.annotation == "parallel" or src.path[k].loop.name in tiles]
    for k in pinned:
        earlier = earlier.intersect(_equal_at(src, dst, k))
    held = _copies_hold(tree, src, dst, buffer)
    for unordered in (_unsynchronized(src, dst), _other_thread(tree, src, dst, buffer)):
        if unordered is not None and not held:
            earlier = earlier.subtract(unordered)
    unfed = touch.range().subtract(earlier.range())
    if unfed.is_empty():
        return
    unfed, sizes = _smallest_sizes(unfed)
    point = unfed.sample_point()
    values = [point.get_coordinate_val(_isl().dim_type.set, k).to_python() for k in range(len(dst.path))]
    where = "".join(f" in the same iteration of loop '{src.path[k].loop.name}'" for k in pinned[:1])
    raise IllegalScheduleError(
        f"illegal schedule: `{dst.text()}` (stage {dst.node.stage.name}) reads buffer {buffer} at "
        f"{_values(dst, values)} before `{src.text()}` (stage {src.node.stage.name}) has written that "
        f"element{where}{sizes}")


def _check_private_writes(tree: LoopTree, src: _Stmt, buffer: str, touch: isl.Map):
    """Redundant writes of one element from different iterations of a parallel loop race,
    unless the buffer is private to each iteration (allocated inside the loop)."""
    owner = _allocation_loop(tree, buffer)
    for k, node in enumerate(src.path):
        if node.loop.annotation != "parallel" or (owner is not None and owner in src.path[k:]):
            continue
        if not touch.intersect(_differ_at(src, src, k)).is_empty():
            raise IllegalScheduleError(
                f"loop '{node.loop.name}' cannot be parallel: its iterations write the same elements of buffer "
                f"{buffer} (`{src.text()}`), which is shared by all threads")


def _allocation_loop(tree: LoopTree, buffer: str) -> LoopNode | None:
    for node, _ in tree.walk():
        if isinstance(node, LoopNode) and any(p.name == buffer for p in tree.local_buffers.get(id(node), [])):
            return node
    return None


def _pairs(src: _Stmt, dst: _Stmt, condition: str) -> isl.Map:
    """Pairs of instances (loop values i0.. of src, j0.. of dst) that satisfy an isl condition."""
    a = ", ".join(f"i{j}" for j in range(len(src.path)))
    b = ", ".join(f"j{j}" for j in range(len(dst.path)))
    return _isl_map(f"{{ [{a}] -> [{b}] : {condition} }}")


def _equal_at(src: _Stmt, dst: _Stmt, k: int) -> isl.Map:
    return _pairs(src, dst, f"i{k} = j{k}")


def _common_loops(src: _Stmt, dst: _Stmt) -> list[int]:
    common = []
    for k, (a, b) in enumerate(zip(src.path, dst.path)):
        if a is not b:
            break
        common.append(k)
    return common


def _differ_at(src: _Stmt, dst: _Stmt, k: int) -> isl.Map:
    return _pairs(src, dst, f"i{k} < j{k} or i{k} > j{k}")


def _check_parallel(tree: LoopTree, src: _Stmt, dst: _Stmt, buffer: str, deps: isl.Map):
    reduction_lanes = src.node.stage is dst.node.stage and src.node.kind == dst.node.kind == "update"
    k = _carrying_loop(src, dst, deps, lambda loop: loop.annotation == "parallel"
                       or (loop.annotation == "vectorize" and not reduction_lanes))
    if k is not None:
        loop = src.path[k].loop
        _, sizes = _smallest_sizes(deps.intersect(_differ_at(src, dst, k)))
        raise IllegalScheduleError(
            f"loop '{loop.name}' cannot be {'parallel' if loop.annotation == 'parallel' else 'vectorized'}: "
            f"it carries a dependence on buffer {buffer} from `{src.text()}` to "
            f"`{dst.text()}` (different iterations of '{loop.name}' touch the same element){sizes}")


def _carrying_loop(src: _Stmt, dst: _Stmt, deps: isl.Map, applies) -> int | None:
    """The position of the first common loop that `applies` to and that `deps` cross (they join
    different iterations of it), or None."""
    for k in _common_loops(src, dst):
        if applies(src.path[k].loop) and not deps.intersect(_differ_at(src, dst, k)).is_empty():
            return k
    return None


def _gpu_positions(stmt: _Stmt) -> dict[str, int]:
    return {n.loop.annotation: k for k, n in enumerate(stmt.path) if n.loop.annotation in GPU_AXES}


def _unsynchronized(src: _Stmt, dst: _Stmt) -> isl.Map | None:
    """Pairs of instances of one GPU kernel that nothing orders: in different blocks, or in different
    threads inside the same iteration of a common thread-bound loop (block-level code is followed by
    barriers, so threads are ordered across its statements and nests). None outside GPU kernels."""
    if not src.path or not dst.path or src.path[0] is not dst.path[0]:
        return None
    a, b = _gpu_positions(src), _gpu_positions(dst)
    if not a and not b:
        return None

    def differ(axis):
        x = f"i{a[axis]}" if axis in a else "0"
        y = f"j{b[axis]}" if axis in b else "0"
        return f"{x} < {y} or {x} > {y}"
    parts = [differ(axis) for axis in sorted(set(a) | set(b)) if axis.startswith("block")]
    common = _common_loops(src, dst)
    shared_thread = next((k for k in common if thread_bound(src.path[k])), None)
    threads = [differ(axis) for axis in sorted(set(a) | set(b)) if axis.startswith("thread")]
    if shared_thread is not None and threads:
        same_above = [f"i{k} = j{k}" for k in common if k < shared_thread]
        parts.append("(" + " and ".join([f"({' or '.join(threads)})"] + same_above) + ")")
    return _pairs(src, dst, " or ".join(parts)) if parts else None


def _other_thread(tree: LoopTree, src: _Stmt, dst: _Stmt, buffer: str) -> isl.Map | None:
    """For a buffer the GPU backend keeps in each thread's registers: pairs of instances in different
    threads (they cannot see each other's copy). None for other buffers."""
    if buffer not in tree.thread_slices:
        return None
    a, b = _gpu_positions(src), _gpu_positions(dst)
    differ = [f"i{a[axis]} < j{b[axis]} or i{a[axis]} > j{b[axis]}" for axis in a if axis.startswith("thread")]
    return _pairs(src, dst, " or ".join(differ))


def _combined_reduction(tree: LoopTree, src: _Stmt, dst: _Stmt) -> bool:
    """Updates of one reduction under its innermost thread-bound loop, when that loop runs over a
    reduction dim and holds no loop over the result's dims (each thread then keeps one partial, of one
    element): the GPU backend combines their partials. Where other thread-bound loops hold it, it must be
    a warp's combine (`_combined_in_warps`)."""
    if src.node is not dst.node or src.node.kind != "update":
        return False
    stage = src.node.stage
    bound = [k for k, n in enumerate(src.path) if thread_bound(n)]
    if not bound or src.path[bound[-1]].loop.dim not in stage.reduce_dims \
            or any(n.loop.dim in stage.dims for n in src.path[bound[-1]:]):
        return False
    return len(bound) == 1 or _combined_in_warps(tree, src, bound)


def _combined_in_warps(tree: LoopTree, src: _Stmt, bound: list[int]) -> bool:
    """A reduction bound to thread.x inside other thread-bound loops over its result's dims (a warp a row,
    several rows a block) is combined by warp shuffles, each lane keeping the total in its own copy of the
    result: the kernel's blocks must be a warp wide, or a power-of-two part of one (so each run of that many
    lanes of a warp shares the outer loops' iteration), and the result placed inside the outer loops, outside
    the thread.x one (each thread's own)."""
    stage, lanes = src.node.stage, src.path[bound[-1]]
    if lanes.loop.annotation != "thread.x" or any(src.path[k].loop.dim in stage.reduce_dims for k in bound[:-1]):
        return False
    nested = f"illegal GPU schedule: stage {stage.name}'s reduction loop '{lanes.loop.name}' is bound to thread.x " \
             f"inside other thread-bound loops; "
    widths = [n.loop.extent for n, _ in walk([src.path[0]])
              if isinstance(n, LoopNode) and n.loop.annotation == "thread.x"]
    width = "sized at run time" if any(isinstance(w, ir.Size) for w in widths) else max(widths)
    if width not in WARP_PARTS:
        raise IllegalScheduleError(nested + f"its lanes are combined by warp shuffles, which needs blocks "
                                            f"{', '.join(map(str, WARP_PARTS))} threads wide along x (a warp, or a "
                                            f"power-of-two part of one), but this kernel's are {width}")
    placed = tree.thread_private.get(stage.name)
    if placed is None or not bound[-2] <= _position(src, placed) < bound[-1]:
        raise IllegalScheduleError(nested + f"each lane keeps the warp's total in its own copy of {stage.name}, so "
                                            f"place {stage.name} inside '{src.path[bound[-2]].loop.name}' and outside "
                                            f"'{lanes.loop.name}'")
    return True


def _position(stmt: _Stmt, node: LoopNode) -> int:
    """Where a loop node lies on a statement's path (-1: not on it)."""
    return next((k for k, n in enumerate(stmt.path) if n is node), -1)


def _lanes_below(tree: LoopTree, stmt: _Stmt, buffer: str) -> set[str]:
    """The thread axes a statement runs along below where a thread-private buffer is placed."""
    return {n.loop.annotation for n in stmt.path[_position(stmt, tree.thread_private[buffer]) + 1:] if thread_bound(n)}


def _copies_hold(tree: LoopTree, src: _Stmt, dst: _Stmt, buffer: str) -> bool:
    """For a buffer each GPU thread keeps its own copy of (`thread_private`) that src writes: True where every
    copy dst reads holds what src wrote (src runs in every lane below the placement, or is a warp's combined
    reduction that dst reads after); raises where dst runs in lanes whose copies src does not write; False
    otherwise (dst must then read in src's own lanes, as the other checks require)."""
    if buffer not in tree.thread_private or buffer != src.node.stage.name:
        return False
    lanes = _lanes_below(tree, src, buffer)
    if not lanes:
        return True
    bound = [k for k, n in enumerate(src.path) if thread_bound(n)]
    if src.node.kind == "update" and len(bound) > 1 and _combined_reduction(tree, src, src) \
            and src.path[bound[-1]] not in dst.path:
        return True
    if not lanes <= _lanes_below(tree, dst, buffer):
        raise IllegalScheduleError(
            f"illegal GPU schedule: each thread keeps its own copy of buffer {buffer} (placed inside thread-bound "
            f"loops), `{src.text()}` writes it in {', '.join(sorted(lanes))} lanes of their own, but `{dst.text()}` "
            f"reads it in every lane: bind the loops of both the same way")
    return False


def _added_across_blocks(src: _Stmt, dst: _Stmt) -> bool:
    """Updates of one sum under a loop over a reduction dim bound to GPU blocks (`across_blocks`): the GPU
    backend adds each term into memory atomically, which float32 and float64 sums allow; any other
    reduction so bound is refused here, naming what the backend cannot add."""
    if src.node is not dst.node or not across_blocks(src.node, src.path):
        return False
    stage = src.node.stage
    if stage.reduce_op != "sum" or stage.dtype not in ATOMIC_SUMS:
        raise IllegalScheduleError(
            f"illegal GPU schedule: stage {stage.name} ({stage.reduce_op} of {stage.dtype}) has a reduction loop bound "
            f"to GPU blocks; the blocks' terms are combined by atomic adds, which only sums of "
            f"{' or '.join(ATOMIC_SUMS)} have: bind only its result's dims to blocks")
    return True


def _check_gpu_threads(tree: LoopTree, src: _Stmt, dst: _Stmt, buffer: str, deps: isl.Map):
    """Within one GPU kernel a dependence may cross threads only where a barrier orders them."""
    private = _other_thread(tree, src, dst, buffer)
    if private is not None and not deps.intersect(private).is_empty():
        raise IllegalScheduleError(
            f"illegal GPU schedule: buffer {buffer} is kept in each thread's registers (it is placed outside the "
            f"thread-bound loops and every access is inside them), but `{dst.text()}` uses an element "
            f"that another thread's `{src.text()}` touches; bind the loops of both the same way")
    unsynchronized = _unsynchronized(src, dst)
    if unsynchronized is None or _combined_reduction(tree, src, dst) or _added_across_blocks(src, dst) \
            or _copies_hold(tree, src, dst, buffer):
        return
    crossing = deps.intersect(unsynchronized)
    if not crossing.is_empty():
        reduction = src.node.stage is dst.node.stage and src.node.kind == dst.node.kind == "update"
        what = ("a reduction loop is bound to threads nested in other thread-bound loops or around loops over "
                "the result's dims, without a combine across them" if reduction else
                "no barrier orders them: they run in different blocks, or in one thread-bound loop")
        raise IllegalScheduleError(
            f"illegal GPU schedule: the dependence on buffer {buffer} from `{src.text()}` to "
            f"`{dst.text()}` crosses GPU threads ({what})")


def _check_local(tree: LoopTree, src: _Stmt, dst: _Stmt, buffer: str, deps: isl.Map):
    plan = tree.buffers[buffer]
    if plan.kind != "local":
        return
    tile_loops = {name for _, off in plan.offsets for name, _ in off.terms}
    k = _carrying_loop(src, dst, deps, lambda loop: loop.name in tile_loops)
    if k is not None:
        raise IllegalScheduleError(
            f"buffer {buffer} is shrunk to one tile of loop '{src.path[k].loop.name}', but "
            f"`{dst.text()}` reads values written by `{src.text()}` in another "
            f"iteration of it")
    if not tile_loops <= {src.path[k].loop.name for k in _common_loops(src, dst)}:
        raise IllegalScheduleError(f"buffer {buffer} is shrunk to a tile of loops {sorted(tile_loops)}, but "
                                   f"`{dst.text()}` reads it outside them")


def _smallest_sizes(relation):
    """(relation at the smallest dynamic sizes where it is not empty, text naming them); the relation and
    "" for a program with fixed sizes."""
    isl = _isl()
    params = relation.params()
    count = params.dim(isl.dim_type.param)
    if not count:
        return relation, ""
    names = [params.get_dim_name(isl.dim_type.param, k) for k in range(count)]
    point = params.move_dims(isl.dim_type.set, 0, isl.dim_type.param, 0, count).lexmin().sample_point()
    values = [point.get_coordinate_val(isl.dim_type.set, k).to_python() for k in range(count)]
    fixed = isl.Set("[" + ", ".join(names) + "] -> { : " +
                    " and ".join(f"{n} = {v}" for n, v in zip(names, values)) + " }")
    sizes = ", ".join(f"{n.removeprefix('size_')} = {v}" for n, v in zip(names, values))
    return relation.intersect_params(fixed), f" when {sizes} (the smallest dynamic size{'s' if count > 1 else ''} " \
                                             f"at which it breaks)"


def _order_message(tree: LoopTree, src: _Stmt, dst: _Stmt, buffer: str, broken: isl.Map, w_a, w_b) -> str:
    broken, sizes = _smallest_sizes(broken)
    point = broken.wrap().sample_point()
    n_src = len(src.path)
    i = [point.get_coordinate_val(_isl().dim_type.set, k).to_python() for k in range(n_src)]
    j = [point.get_coordinate_val(_isl().dim_type.set, n_src + k).to_python() for k in range(len(dst.path))]
    kind = "flow (read after write)" if w_a and not w_b else ("anti (write after read)" if w_b and not w_a
                                                               else "output (write after write)")
    where = _where_broken(src, dst, i, j)
    return (f"illegal schedule: the {kind} dependence on buffer {buffer} from `{src.text()}` "
            f"(stage {src.node.stage.name}) to `{dst.text()}` (stage {dst.node.stage.name}) is broken "
            f"{where}{sizes}: e.g. stage {src.node.stage.name} at {_values(src, i)} must run before stage "
            f"{dst.node.stage.name} at {_values(dst, j)}, but the schedule runs it after")


def _where_broken(src: _Stmt, dst: _Stmt, i: list[int], j: list[int]) -> str:
    common = _common_loops(src, dst)
    for k in common:
        if i[k] != j[k]:
            return f"at loop '{src.path[k].loop.name}'"
    if common:
        loop = src.path[common[-1]].loop.name
        return f"inside loop '{loop}' (the reading statement comes first in its body)"
    return "at the top level (the reading statement comes first)"


def _values(stmt: _Stmt, values: list[int]) -> str:
    return "{" + ", ".join(f"{n.loop.name}={v}" for n, v in zip(stmt.path, values)) + "}"
