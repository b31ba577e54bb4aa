"""What a pipeline that copies with the tensor memory accelerator needs of its copies
(`LoopTree.pipeline(..., copier='tma')`, Hopper).

One thread copies a whole tile of an input into shared memory with one instruction
(`cp.async.bulk.tensor`), described by a tensor map the runtime builds for the input: its sizes,
its strides (multiples of 16 bytes) and the box one copy moves. The copy writes the box swizzled
the way wgmma reads it (128-byte rows, 8-row atoms), so only wgmma operand tiles are copied this
way: a k-major tile is one box of 128-byte rows, an mn-major tile is boxes of 64 columns side by
side, each `rows` x 128 bytes. Box elements outside the input arrive as zeros.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..errors import IllegalScheduleError
from ..schedule import LoopNode, LoopTree, StmtNode, pipeline_copier, walk
from .tensorize import SWIZZLE_BYTES, TensorTile

COLUMNS = SWIZZLE_BYTES // 2    # 2-byte elements (wgmma's operand dtypes) in a box's 128-byte row
MAX_BOX = 256          # elements along any dim of a TMA box
MAX_RANK = 5           # dims of a tensor map
GLOBAL_ALIGN = 16      # bytes: a tensor's address and strides


@dataclass(frozen=True)
class BulkCopy:
    """A tile of input `source` copied by TMA into `target`: `blocks` boxes of `rows` x `columns`
    elements (source dims `row_dim` and the innermost; one element of every other dim), stored
    `rows` x 128 bytes apart; `index` is its tensor map's place in the kernel's list."""

    target: str
    source: str
    row_dim: int
    rows: int
    columns: int
    blocks: int
    index: int

    @property
    def bytes(self) -> int:
        """Bytes one copy of the tile moves (the whole box, even where it lies outside the input)."""
        return self.blocks * self.rows * SWIZZLE_BYTES

    def box(self, rank: int) -> tuple[int, ...]:
        """The box of one copy along each of the source's `rank` dims, outermost first."""
        return tuple(self.columns if d == rank - 1 else self.rows if d == self.row_dim else 1 for d in range(rank))


def bulk_copies(tree: LoopTree, tiles: dict[int, TensorTile]) -> dict[int, BulkCopy]:
    """id(copy statement) -> its BulkCopy, for every copy placed at a TMA pipeline; an
    IllegalScheduleError says what a copy that TMA cannot make lacks."""
    operands = {load.buffer: layout for tile in tiles.values() if tile.shared
                for load, layout in zip((tile.a, tile.b), tile.shared)}
    found = {}
    for node, _ in tree.walk():
        if isinstance(node, LoopNode) and pipeline_copier(node.loop.annotation) == "tma":
            for stmt in _copy_statements(tree, node):
                found[id(stmt)] = _bulk_copy(tree, stmt, operands, node.loop.name, len(found))
    return found


def _copy_statements(tree: LoopTree, node: LoopNode) -> list[StmtNode]:
    placed = {plan.name for plan in tree.local_buffers.get(id(node), [])}
    return [stmt for stmt, _ in walk(node.body) if isinstance(stmt, StmtNode) and stmt.stage.name in placed]


def copied_load(tree: LoopTree, expr: ir.Expr) -> ir.Load | None:
    """The load a TMA copy makes of `expr`: a plain load, or a load zero-filled outside its buffer (a
    `pad` copy inlined: `source[i, j] if 0 <= i < rows and 0 <= j < columns else 0`, which TMA's
    out-of-bounds fill computes); None for anything else."""
    if isinstance(expr, ir.Load):
        return expr
    if not (isinstance(expr, ir.Select) and isinstance(expr.then, ir.Load) and isinstance(expr.otherwise, ir.Const)
            and expr.otherwise.value == 0.0 and expr.then.buffer in tree.buffers):
        return None
    load, shape = expr.then, tree.buffers[expr.then.buffer].shape
    bounds = {ir.Guard(index, 0, size) for index, size in zip(load.index, shape)}
    return load if set(expr.guards) <= bounds else None


def _bulk_copy(tree: LoopTree, stmt: StmtNode, operands: dict, loop: str, index: int) -> BulkCopy:
    stage, plan = stmt.stage, tree.buffers[stmt.stage.name]
    load = copied_load(tree, stage.expr)
    if stmt.kind != "assign" or load is None or load.dtype != stage.dtype:
        raise IllegalScheduleError(f"loop '{loop}' copies with TMA, but stage {stage.name} is not a plain copy of "
                                   f"an input tile (or one zero-filled outside it): use copier='cp.async'")
    layout = operands.get(stage.name)
    if layout is None:
        raise IllegalScheduleError(f"loop '{loop}' copies with TMA, which writes tiles in wgmma's swizzled layout, "
                                   f"but no wgmma tile reads {stage.name}: use copier='cp.async'")
    source = tree.buffers[load.buffer]
    rank = len(source.shape)
    tile_dims = [(d, n) for d, n in zip(plan.dims, plan.shape) if n > 1]
    rows_dim, columns_dim = plan.dims[-2], plan.dims[-1]
    if rank > MAX_RANK or [d for d, _ in tile_dims if d not in (rows_dim, columns_dim)] \
            or plan.shape[-1] != layout.row or source.strides[-1] != 1:
        raise IllegalScheduleError(f"TMA copies {stage.name} as boxes of rows along the last dim of {load.buffer}: "
                                   f"its tile must be 2-D, {layout.row} elements along that dim (got "
                                   f"{dict(zip(plan.dims, plan.shape))}, {load.buffer} of {rank} dims)")
    varying = {d for d, _ in tile_dims}
    along = [_along(ix, varying) for ix in load.index]
    row_dims = [d for d, dim in enumerate(along) if dim == rows_dim]
    if along[-1] != columns_dim or len(row_dims) != 1 or along.count(None) != rank - 2:
        raise IllegalScheduleError(f"TMA copies {stage.name} from {load.buffer} box by box: each of its dims must "
                                   f"step one dim of {load.buffer} by 1, its last dim the last one; it reads "
                                   f"{load.buffer}[{', '.join(map(str, load.index))}]")
    rows = plan.shape[-2]
    misaligned = [d for d, s in enumerate(source.strides[:-1]) if s * SWIZZLE_BYTES // COLUMNS % GLOBAL_ALIGN]
    if rows > MAX_BOX or misaligned:
        raise IllegalScheduleError(f"TMA boxes hold at most {MAX_BOX} rows, and rows of {load.buffer} must start "
                                   f"{GLOBAL_ALIGN}-byte aligned: {stage.name} has {rows} rows, {load.buffer} strides "
                                   f"{source.strides} elements")
    return BulkCopy(stage.name, load.buffer, row_dims[0], rows, COLUMNS, plan.shape[-1] // COLUMNS, index)


def _along(index: ir.Affine, varying: set[str]) -> str | None:
    """The dim of the tile (`varying`) an index steps by one (None where it uses none); '' where it
    is any other mix."""
    coeffs = {d: c for d, c in index.coeffs().items() if d in varying}
    if not coeffs:
        return None
    if len(coeffs) > 1:
        return ""
    (dim, coeff), = coeffs.items()
    return dim if coeff == 1 else ""
