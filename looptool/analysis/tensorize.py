"""What a matrix instruction (`LoopTree.tensorize`) needs of the loops it was given.

A tensorized update is `C[m, n] += A[m, k] * B[k, n]` whose three innermost loops are the
instruction's m, n and k tile, whole (a tail may only skip whole tiles, but for wgmma's m and n), with half-precision operands of one dtype
and a float32 accumulator. On the GPU the instruction runs on a warp, whose 32 lanes take
`thread.x` (so loops around it that split work between warps are bound to thread.y or thread.z);
Hopper's wgmma runs on a warpgroup, 4 warps of consecutive thread.y: a loop around a wgmma tile
bound to thread.y counts warpgroups, and the block gets 4 warps on thread.y for each.
`tensor_tiles` returns each tensorized update with its operands, or raises an
`IllegalScheduleError` saying in plain words what is missing.

An accumulator the instruction computes into a buffer placed in the kernel (`cache_write`) is kept
as the threads' fragments: each thread holds its own elements of every tile. So such a buffer is
read only by a copy whose (m, n) loops are tensorized with the same instruction (a copy tile, `b`
None), on the same grid of the buffer.

wgmma reads both operands from shared memory through descriptors (`SharedOperand`): a tile whose
k runs contiguously in rows of 128 bytes ("k-major", 128-byte swizzle), or whose m (for A) or n
(for B) runs contiguously in rows of a multiple of 64 elements, stored as blocks of 64 columns
("mn-major").
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..errors import IllegalScheduleError
from ..schedule import TENSOR_INSTRUCTIONS, LoopNode, LoopTree, StmtNode, tensor_role, thread_bound, walk
from ..schedule.printing import expr_text

OPERAND_DTYPES = ("bfloat16", "float16")
WARP = 32
WARP_PARTS = (32, 16, 8, 4, 2)      # block widths along x whose rows of threads a warp holds whole
SWIZZLE_BYTES = 128          # a wgmma operand's rows are read in 128-byte swizzled rows, 8 rows an atom
ATOM_ROWS = 8


@dataclass(frozen=True)
class TensorTile:
    """A tensorized update: the instruction, its loops by role ('m', 'n', 'k'), and its operands
    `a` (an m x k matrix) and `b` (k x n), both of `dtype`; or a copy tile: loops 'm' and 'n', the
    accumulator it copies as `a`, `b` None. A wgmma update's `shared` holds how it reads A and B
    from shared memory."""

    instruction: str
    loops: dict[str, LoopNode]
    a: ir.Load
    b: ir.Load | None
    dtype: str
    shared: tuple["SharedOperand", "SharedOperand"] | None = None


def tensor_tiles(tree: LoopTree) -> dict[int, TensorTile]:
    """id(update or copy statement) -> its TensorTile, for every tensorized statement of the tree."""
    tiles = {}
    for root in tree.root:
        for stmt, path in walk([root]):
            if isinstance(stmt, StmtNode):
                roles = {tensor_role(node.loop): node for node in path if tensor_role(node.loop)}
                if roles and stmt.kind != "init":
                    tiles[id(stmt)] = _tile(tree, root, stmt, path, roles)
    _check_fragments(tree, tiles)
    return tiles


def _tile(tree: LoopTree, root, stmt: StmtNode, path: list[LoopNode], roles: dict) -> TensorTile:
    stage = stmt.stage
    instructions = {instruction for instruction, _ in roles}
    if len(instructions) > 1:
        raise IllegalScheduleError(f"stage {stage.name} is inside loops tensorized for different instructions "
                                   f"{sorted(instructions)}")
    instruction = instructions.pop()
    loops = {role: node for (_, role), node in roles.items()}
    names = "', '".join(node.loop.name for node in loops.values())
    if stmt.kind == "assign" and "k" not in loops:
        return _copy_tile(tree, root, stmt, path, instruction, loops)
    if stmt.kind != "update" or stage.reduce_op != "sum":
        raise IllegalScheduleError(f"loops '{names}' are tensorized, but stage {stage.name} is not a sum: "
                                   f"{instruction} computes contractions, (a * b).sum(k)")
    missing = [role for role in "mnk" if role not in loops]
    if missing:
        raise IllegalScheduleError(f"stage {stage.name}'s update lies inside the tensorized loops '{names}' but "
                                   f"not inside its {' and '.join(missing)} loop for {instruction}")
    _check_innermost(stage, path, loops, names)
    _check_tile_sizes(instruction, loops)
    _check_dims(stage, instruction, loops)
    a, b = _operands(tree, stage, instruction, loops)
    _check_warp(root, path, stage, instruction)
    shared = tuple(shared_operand(tree, stmt, load, loops[role], loops["k"], instruction)
                   for load, role in ((a, "m"), (b, "n"))) if is_warpgroup(instruction) else None
    return TensorTile(instruction, loops, a, b, tree.buffers[a.buffer].dtype, shared)


def _copy_tile(tree: LoopTree, root, stmt: StmtNode, path: list[LoopNode], instruction: str,
               loops: dict) -> TensorTile:
    """A copy of an accumulator whose (m, n) loops are tensorized: each lane copies its fragment."""
    stage = stmt.stage
    names = "', '".join(node.loop.name for node in loops.values())
    source = _accumulator_load(tree, stage.expr)
    if source is None or len(loops) != 2:
        raise IllegalScheduleError(f"loops '{names}' of stage {stage.name} are tensorized, but it is neither a sum "
                                   f"(a * b).sum(k) nor a copy of an accumulator over its (m, n) loops: "
                                   f"{instruction} computes contractions")
    _check_innermost(stage, path, loops, names)
    _check_tile_sizes(instruction, loops)
    for role in "mn":
        if loops[role].loop.dim in stage.reduce_dims or loops[role].loop.dim not in stage.dims:
            raise IllegalScheduleError(f"the {role} loop '{loops[role].loop.name}' of the copy tile of stage "
                                       f"{stage.name} must run over a dimension of the result")
    _check_warp(root, path, stage, instruction)
    return TensorTile(instruction, loops, source, None, tree.buffers[source.buffer].dtype)


def _check_innermost(stage: ir.Stage, path: list[LoopNode], loops: dict, names: str):
    count = len(loops)
    if {id(node) for node in path[-count:]} != {id(node) for node in loops.values()}:
        raise IllegalScheduleError(f"the tensorized loops '{names}' must be the {('two', 'three')[count - 2]} "
                                   f"innermost loops of stage {stage.name}; '{path[-1].loop.name}' is inside them")


def _check_fragments(tree: LoopTree, tiles: dict[int, TensorTile]):
    """A placed buffer that tensor tiles accumulate into is held in the lanes' fragments: only copy
    tiles over the same (m, n) dims may read it, and every tile sees it on one 16 x 8 grid."""
    producers = {}
    for stmt, _ in tree.statements():
        tile = tiles.get(id(stmt))
        if tile and tile.b is not None and tree.buffers[stmt.stage.name].kind == "local":
            producers[stmt.stage.name] = (stmt, tile)
    for stmt, _ in tree.statements():
        for load in ir.loads(stmt.stage.expr) if stmt.kind != "init" else ():
            if load.buffer not in producers:
                continue
            producer, made = producers[load.buffer]
            tile = tiles.get(id(stmt))
            if tile is None or tile.b is not None:
                raise IllegalScheduleError(
                    f"stage {stmt.stage.name} reads {load.buffer}, which {made.instruction} keeps in the lanes' "
                    f"fragments (each lane holds its own elements of each tile): tensorize {stmt.stage.name}'s "
                    f"(m, n) tile loops with {made.instruction} too, a copy tile")
            for role in "mn":
                if tile.loops[role].loop.dim != made.loops[role].loop.dim:
                    raise IllegalScheduleError(
                        f"the copy tile of stage {stmt.stage.name} runs its {role} loop '{tile.loops[role].loop.name}'"
                        f" over '{tile.loops[role].loop.dim}', but {load.buffer}'s tiles run {role} over "
                        f"'{made.loops[role].loop.dim}'")
            for where, index, loops in ((producer, ir.Affine.identity(producer.stage.dims), made.loops),
                                        (stmt, load.index, tile.loops)):
                _check_grid(tree, load.buffer, where, index, loops, made.instruction)


def _check_grid(tree: LoopTree, buffer: str, stmt: StmtNode, index, loops: dict, instruction: str):
    """The tile's m and n loops step the accumulator's m and n axes by one, and every other term of
    those axes is a multiple of the tile (16 rows, 8 columns), so tiles fall on one grid."""
    plan = tree.buffers[buffer]
    axes = plan.element_index(tuple(ix.substitute(stmt.index) for ix in index))
    shape = TENSOR_INSTRUCTIONS[instruction]
    for role in "mn":
        axis = axes[plan.dims.index(loops[role].loop.dim)]
        coeffs = axis.coeffs()
        rest = [c for name, c in coeffs.items() if name != loops[role].loop.name] + [axis.const]
        if coeffs.get(loops[role].loop.name) != 1 or any(c % shape[role] for c in rest):
            raise IllegalScheduleError(
                f"stage {stmt.stage.name} reaches {buffer} off the {shape['m']} x {shape['n']} grid of its "
                f"{instruction} fragments: its {role} loop '{loops[role].loop.name}' must step "
                f"'{loops[role].loop.dim}' by 1 from a multiple of {shape[role]}")


def _check_tile_sizes(instruction: str, loops: dict[str, LoopNode]):
    """Whole tiles; a tail may skip whole tiles only, except along m and n of wgmma, whose operands are
    whole tiles in shared memory: there a tile cut by a tail is computed whole (its rows and columns past
    the tail read what the shared tiles hold there and are never stored: a copy tile stores each of its
    elements under the tail's guard)."""
    shape = TENSOR_INSTRUCTIONS[instruction]
    tile = " x ".join(str(shape[role]) for role in "mnk")
    for role, node in loops.items():
        if node.loop.extent != shape[role]:
            raise IllegalScheduleError(
                f"{instruction} computes a {tile} (m x n x k) tile: its {role} loop '{node.loop.name}' must run "
                f"{shape[role]} iterations, it runs {node.loop.extent}; split '{node.loop.dim}' by {shape[role]} "
                f"and tensorize the inner loop")
        size = shape[role]
        if role in "mn" and is_warpgroup(instruction):
            continue
        for lim in node.limits:
            if lim.coeff != 1 or any(c % size for c in (lim.bound, lim.rest.const, *lim.rest.coeffs().values())):
                raise IllegalScheduleError(
                    f"loop '{node.loop.name}' has a tail (size {node.loop.dim} does not divide into tiles of "
                    f"{size}): {instruction} computes whole tiles only")


def _check_dims(stage: ir.Stage, instruction: str, loops: dict[str, LoopNode]):
    for role in "mnk":
        dim = loops[role].loop.dim
        if (dim in stage.reduce_dims) != (role == "k"):
            kind = "the summed dimension" if role == "k" else "a dimension of the result"
            raise IllegalScheduleError(f"the {role} loop of {instruction}, '{loops[role].loop.name}', must run over "
                                       f"{kind} of stage {stage.name}; '{dim}' is not")


def _operands(tree: LoopTree, stage: ir.Stage, instruction: str, loops: dict) -> tuple[ir.Load, ir.Load]:
    """(A, B) of the product the stage sums, or a refusal saying what the instruction needs."""
    if stage.dtype != "float32":
        raise IllegalScheduleError(f"{instruction} accumulates in float32; stage {stage.name} accumulates in "
                                   f"{stage.dtype}: drop its dtype= (or ask for float32)")
    e = stage.expr
    pair = (_operand_load(e.a), _operand_load(e.b)) if isinstance(e, ir.Binary) and e.op == "mul" else (None, None)
    if None in pair:
        raise IllegalScheduleError(f"stage {stage.name} sums {expr_text(e)}; {instruction} needs a product of two "
                                   f"tensors, (a * b).sum(k)")
    dtypes = [tree.buffers[load.buffer].dtype for load in pair]
    if dtypes[0] != dtypes[1] or dtypes[0] not in OPERAND_DTYPES:
        raise IllegalScheduleError(
            f"{instruction} multiplies two bfloat16 or two float16 matrices; stage {stage.name} multiplies "
            f"{dtypes[0]} {pair[0].buffer} by {dtypes[1]} {pair[1].buffer}: convert them with "
            f".astype(lt.bfloat16) (or lt.float16)")
    m, n, k = (loops[role].loop.dim for role in "mnk")
    batch = set(stage.dims) - {m, n}          # dims outside the tile, fixed in each
    for a, b in (pair, pair[::-1]):
        if ir.index_vars(a) - batch == {m, k} and ir.index_vars(b) - batch == {k, n}:
            return a, b
    raise IllegalScheduleError(f"{instruction} multiplies an m x k by a k x n matrix (batched or not); in stage "
                               f"{stage.name}, {pair[0].buffer} runs over {sorted(ir.index_vars(pair[0]))} and {pair[1].buffer} over "
                               f"{sorted(ir.index_vars(pair[1]))} (m, n, k = '{m}', '{n}', '{k}')")


def _accumulator_load(tree: LoopTree, e: ir.Expr) -> ir.Load | None:
    """The load of the accumulator a copy tile writes back: the expression's one buffer summed by a
    stage of the program (the rest of the expression, an epilogue such as a bias and a relu, is
    computed on each of its elements), else None."""
    sums = {st.name for st in tree.program.stages if st.reduce_op == "sum"}
    found = {ld for ld in ir.loads(e) if ld.buffer in sums and not ld.clamped}
    return found.pop() if len(found) == 1 else None


def _operand_load(e: ir.Expr) -> ir.Load | None:
    """The load an operand reads (through the widening cast to float32), else None."""
    if isinstance(e, ir.Cast) and e.dtype == "float32":
        e = e.x
    return e if isinstance(e, ir.Load) and not e.clamped else None


def is_warpgroup(instruction: str) -> bool:
    """Whether the instruction is Hopper's wgmma, run by a warpgroup (4 warps along thread.y) from
    shared-memory operands."""
    return TENSOR_INSTRUCTIONS[instruction]["warps"] > 1


@dataclass(frozen=True)
class SharedOperand:
    """How wgmma reads an operand tile from shared memory: `major` 'k' (k contiguous, rows of
    128 bytes) or 'mn' (m or n contiguous, rows of `row` elements, a multiple of 64, kept as
    blocks of 64 columns, `rows` rows each)."""

    major: str
    row: int
    rows: int


def shared_operand(tree: LoopTree, stmt: StmtNode, load: ir.Load, row: LoopNode, k: LoopNode,
                   instruction: str) -> SharedOperand:
    """The layout wgmma reads operand `load` of `stmt` in (its tile's rows run along loop `row`, m or
    n), or a refusal saying what it needs."""
    plan = tree.buffers[load.buffer]
    if plan.kind != "local":
        raise IllegalScheduleError(
            f"{instruction} reads its operands from shared memory, but {load.buffer} is the {plan.kind} "
            f"buffer itself: stage its tile in the block (t.cache('{load.buffer}', ...) placed at the k tile loop)")
    linear = plan.linear_offset(tuple(ix.substitute(stmt.index) for ix in load.index))
    coeffs = linear.coeffs()
    step = {role: coeffs.get(node.loop.name) for role, node in (("row", row), ("k", k))}
    per_row = SWIZZLE_BYTES // 2
    if step["k"] == 1 and step["row"] == per_row:
        layout = SharedOperand("k", per_row, plan.size // per_row)
        whole = (ATOM_ROWS * per_row, 8, per_row)       # 8-row atoms, or 16-byte steps inside a row
    elif step["row"] == 1 and step["k"] and step["k"] % per_row == 0 and plan.size % step["k"] == 0:
        layout = SharedOperand("mn", step["k"], plan.size // step["k"])
        whole = (ATOM_ROWS * step["k"], per_row, step["k"])
    else:
        raise IllegalScheduleError(
            f"{instruction} reads {load.buffer} from shared memory in 128-byte rows: its tile must run along "
            f"'{k.loop.dim}' contiguously in rows of {per_row} elements, or along '{row.loop.dim}' contiguously "
            f"in rows of a multiple of {per_row}; loop '{k.loop.name}' steps it by {step['k']} and "
            f"'{row.loop.name}' by {step['row']}")
    if layout.rows % ATOM_ROWS:
        raise IllegalScheduleError(f"{instruction} reads {load.buffer} in atoms of {ATOM_ROWS} rows; its tile "
                                   f"has {layout.rows} rows")
    extents = {lp.name: lp.extent for lp in tree.schedule.of(stmt.stage.name).loops}
    others = [(c, extents.get(name, 1)) for name, c in coeffs.items() if name not in (row.loop.name, k.loop.name)]
    atom, chunk, line = whole
    for c, extent in [*others, (linear.const, 2)]:
        if extent > 1 and c % atom and not (c % chunk == 0 and c * (extent - 1) < line):
            raise IllegalScheduleError(
                f"{instruction} tiles of {load.buffer} must start on its {ATOM_ROWS}-row atoms (and, along a "
                f"row, on {chunk}-element steps): an offset of {c} elements does not")
    return layout


def _check_warp(root, path: list[LoopNode], stage: ir.Stage, instruction: str):
    """The tile runs on a whole warp (or warpgroup): thread.x is its 32 lanes, so no loop around the
    tile may be bound to thread.x (warps go on thread.y and thread.z), other nests of the kernel get 32
    lanes at most, and where a block has several warps each tile belongs to one (a loop around it
    bound to thread.y or z)."""
    group = "warpgroup" if is_warpgroup(instruction) else "warp"
    threads = [node for node in path if thread_bound(node)]
    for node in threads:
        if node.loop.annotation == "thread.x":
            raise IllegalScheduleError(
                f"{instruction} runs on {'warpgroups of 4 warps' if group == 'warpgroup' else 'a warp'}, whose {WARP} "
                f"lanes take thread.x, but its tile lies inside loop "
                f"'{node.loop.name}', bound to thread.x: bind the loops over {group}s to thread.y or thread.z")
        if node.loop.dim in stage.reduce_dims:
            raise IllegalScheduleError(
                f"loop '{node.loop.name}' around the {instruction} tile runs over the summed dimension "
                f"'{node.loop.dim}' and is bound to {node.loop.annotation}: a warp sums its whole k range itself")
    kernel = [node for node, _ in walk([root]) if isinstance(node, LoopNode) and thread_bound(node)]
    for node in kernel:
        if node.loop.annotation == "thread.x" and node.loop.extent > WARP:
            raise IllegalScheduleError(
                f"in a kernel with {instruction} tiles thread.x is a warp's {WARP} lanes, but loop "
                f"'{node.loop.name}' is bound to thread.x with {node.loop.extent} iterations: split it by {WARP}")
    warps = [node for node in kernel if node.loop.annotation != "thread.x" and node.loop.extent > 1]
    if warps and not threads:
        raise IllegalScheduleError(
            f"the block has several warps ('{warps[0].loop.name}' is bound to {warps[0].loop.annotation}), and "
            f"every one of them would compute the same {instruction} tile of stage {stage.name}: bind a loop "
            f"around the tile to thread.y or thread.z, one tile per {group}")
