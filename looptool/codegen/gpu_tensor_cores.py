"""Tensor cores on NVIDIA GPUs: the PTX of tensorized tiles (`LoopTree.tensorize`), for codegen.gpu.

A tensorized tile is one `mma.sync` (inline PTX) run by a warp:
thread.x is the warp's 32 lanes, each lane loads the operand elements and the four
accumulators its fragments hold (the PTX ISA's layout for m16n8k16), and stores the
four results back. An accumulator each thread keeps (placed by `cache_write`) is held as
fragments at constant offsets (registers) and leaves through a tensorized copy tile; shared
operands read by ldmatrix are swizzled (`Swizzle`).

On Hopper (sm_90a) a `wgmma` tile is run by a warpgroup, 4 warps of consecutive thread.y (a
loop around it bound to thread.y counts warpgroups: its value is thread.y / 4): each
thread holds N/2 accumulators of the 64 x N tile (warp w of the group has rows 16w.., laid out
as N/8 mma tiles), both operands are read from shared memory through descriptors, laid out as
the instruction needs (`WgmmaLayout`: 128-byte swizzled rows in 1024-byte aligned atoms). The
instructions run asynchronously: consecutive ones form a batch (one `wgmma.fence` before it), and
a `wgmma.wait_group 0` ends the batch before anything else touches the accumulators or a barrier
lets shared memory be overwritten, and at the end of every loop iteration (a pipelined loop may
keep one batch in flight: codegen.gpu_copies).

`TensorCoreLowering` is mixed into codegen.gpu's kernel builder: its methods call the builder's
(`access`, `special_register`, `shared_address`, `inline`, ...) and read its state (the tiles, the
shared buffers, the wgmma batch in flight).
"""
from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass, replace

from llvmlite import ir as llir

from .. import ir
from ..analysis.tensorize import ATOM_ROWS, SWIZZLE_BYTES, WARP, SharedOperand, TensorTile, is_warpgroup
from ..ir import Affine
from ..schedule import TENSOR_INSTRUCTIONS, LoopNode, StmtNode, accesses, tensor_role, walk
from .llvm import F32, I16, I32, I64, IDENTITY, ITEM_BYTES, MEMORY_TYPE, ZERO, Lanes, constant

MMA_TYPE = {"bfloat16": "bf16", "float16": "f16"}
WGMMA_ALIGN = 1024              # bytes: a wgmma operand's swizzle atoms start on this boundary
WGMMA_ARCHS = ("sm_90", "sm_90a")


class TensorCoreLowering:
    """The kernel builder's tensor-core half: mma.sync and wgmma tiles, their fragments, ldmatrix,
    wgmma's descriptors and batches, and the layouts of their operands in shared memory."""

    # wgmma batches ----------------------------------------------------------------------------------
    def settle_wgmma(self, in_flight: int = 0):
        """Close the open wgmma batch (one commit group) and wait until at most `in_flight` batches run
        (their accumulators and shared reads)."""
        if self.wgmma_batch:
            self.inline("wgmma.commit_group.sync.aligned;")
            self.wgmma_batch, self.wgmma_pending = False, True
        if self.wgmma_pending:
            self.inline(f"wgmma.wait_group.sync.aligned {in_flight};")
            self.wgmma_pending = in_flight > 0

    # Operands in shared memory: swizzled for ldmatrix, laid out for wgmma ---------------------------
    def share(self, plan):
        """Note a buffer placed in shared memory; an mma operand there that ldmatrix reads row by row
        is swizzled, so its reads and the copies into it are free of bank conflicts, and so is a tile
        whose columns a warp reads or writes element by element (a transpose's: `Swizzle.of_elements`)."""
        self.shared_buffers.add(plan.name)
        if plan.name in self.wgmma_operands:
            if not self.within_chunks(plan):
                raise ValueError(f"wgmma reads {plan.name} in swizzled 16-byte chunks: copy it with vectors of at "
                                 f"most 16 bytes that start at a multiple of their width")
            self.swizzles[plan.name] = WgmmaLayout(self.wgmma_operands[plan.name])
            return
        operands = [(load, stmt, tile) for stmt, tile in self.tile_statements
                    for load in (tile.a, tile.b) if tile.b is not None and load.buffer == plan.name]
        swizzle = Swizzle.of(plan.strides, ITEM_BYTES[plan.dtype])
        by_ldmatrix = all(self.ldmatrix_layout(load, stmt, tile.loops["m" if load is tile.a else "n"].loop.name,
                                               tile.loops["k"].loop.name) is not None for load, stmt, tile in operands)
        if swizzle and operands and by_ldmatrix and self.within_chunks(plan):
            self.swizzles[plan.name] = swizzle
        elif not operands and self.down_columns(plan):
            swizzle = Swizzle.of_elements(plan.strides)
            if swizzle:
                self.swizzles[plan.name] = swizzle

    def down_columns(self, plan) -> bool:
        """Whether a warp's lanes access a buffer a row apart (some statement's thread.x loop moves its
        offset by a multiple of a row), every access one element (no vectors), none clamped."""
        found, row = self.unclamped_accesses(plan), plan.strides[-2] if len(plan.strides) > 1 else 0
        if not found or not row:
            return False
        columns = False
        for path, linear in found:
            coeffs = linear.coeffs()
            if any(node.loop.annotation == "vectorize" and coeffs.get(node.loop.name) for node in path):
                return False
            lanes = [coeffs.get(node.loop.name, 0) for node in path if node.loop.annotation == "thread.x"]
            columns |= any(step and step % row == 0 for step in lanes)
        return columns

    def within_chunks(self, plan) -> bool:
        """Whether every access of a buffer stays inside 16-byte chunks (so a swizzle keeps vectors
        whole): vectors of at most 16 bytes starting at a multiple of their width, no clamped loads."""
        found = self.unclamped_accesses(plan)
        if found is None:
            return False
        for path, linear in found:
            coeffs, const = linear.coeffs(), linear.const
            for node in path:
                width = node.loop.extent
                if node.loop.annotation != "vectorize" or coeffs.get(node.loop.name) != 1:
                    continue
                rest = math.gcd(const, *(c for name, c in coeffs.items() if name != node.loop.name))
                if width * ITEM_BYTES[plan.dtype] > 16 or rest % width:
                    return False
        return True

    def unclamped_accesses(self, plan) -> list | None:
        """(loop path, linear offset) of every access of a buffer; None where a load of it is clamped."""
        found = []
        for stmt, path in self.tree.statements():
            for access in accesses(stmt):
                if access.buffer != plan.name:
                    continue
                if any(ld.buffer == plan.name and ld.clamped for ld in ir.loads(stmt.stage.expr)):
                    return None
                found.append((path, self.linear_offset(plan.name, access.index, stmt)))
        return found

    # Tiles ------------------------------------------------------------------------------------------
    def tile_under(self, node: LoopNode) -> tuple[TensorTile, StmtNode] | None:
        """(tile, statement) when `node` is the outermost loop of a tensorized tile's update (three
        loops), of its copy (two) or of its initialization (its m and n loops)."""
        if not tensor_role(node.loop):
            return None
        inside = [current for current, _ in walk(node.body)]
        stmts = [s for s in inside if isinstance(s, StmtNode)]
        if len(stmts) != 1:
            return None
        stmt = stmts[0]
        if id(stmt) in self.tiles and len(inside) == len(self.tiles[id(stmt)].loops):
            return self.tiles[id(stmt)], stmt
        tile = self.stage_tiles.get(stmt.stage.name)
        if tile and stmt.kind == "init" and len(inside) == 2 and tensor_role(inside[0].loop):
            return tile, stmt
        return None

    def is_fragment(self, buffer: str) -> bool:
        """Whether a buffer is kept by each thread (registers), so a tile holds it as fragments."""
        return self.tree.buffers[buffer].kind == "local" and buffer not in self.shared_buffers

    def tile_elements(self, buffer: str, index, tile: TensorTile, stmt: StmtNode, env: dict,
                      lane: llir.Value) -> list[llir.Value]:
        """Pointers to a thread's elements of a tile of `buffer`, in the instruction's register order
        (`fragment_places`, moved to the thread's place, `lane_place`). A buffer each thread keeps
        (an accumulator placed in the kernel) holds them as a fragment instead, at the places
        thread 0's elements have: constant offsets, so they stay in registers."""
        m, n = tile.loops["m"].loop.name, tile.loops["n"].loop.name
        if self.is_fragment(buffer):
            return [self.access(buffer, index, False, stmt, {**env, m: constant(I64, row), n: constant(I64, col)})
                    for row, col in fragment_places(tile.instruction)]
        return [self.access(buffer, index, False, stmt, place) for place in self.element_envs(tile, env, lane)]

    def element_envs(self, tile: TensorTile, env: dict, lane: llir.Value) -> list[dict]:
        """`env` with the tile's m and n loops at each of the thread's elements, in register order."""
        b = self.builder
        m, n = tile.loops["m"].loop.name, tile.loops["n"].loop.name
        first_row, first_col = self.lane_place(lane)
        return [{**env, m: b.add(first_row, constant(I64, row)), n: b.add(first_col, constant(I64, col))}
                for row, col in fragment_places(tile.instruction)]

    def written_back(self, e: ir.Expr, accumulator: ir.Load, value: llir.Value, stmt: StmtNode, env: dict,
                     cut: frozenset = frozenset()):
        """A copy tile's expression at one element: `value` (its accumulator element, from the lane's
        fragment) where it reads the accumulator, everything else (an epilogue's bias) at `env`; its reads
        that move along a loop in `cut` (one a tail cuts: the element may lie outside them) clamped into
        their buffers; a cast to the stored dtype at its root left to the store (`before_store`)."""
        def evaluate(sub):
            if sub == accumulator:
                return value
            if cut and isinstance(sub, ir.Load) and any(name in cut for affine in sub.index
                                                        for name, _ in affine.substitute(stmt.index).terms):
                return self.expr(replace(sub, clamped=True), stmt, env)
            if isinstance(sub, ir.Cast):
                return self.convert(evaluate(sub.x), sub.dtype)
            if isinstance(sub, ir.Unary):
                return self.unary(sub.op, evaluate(sub.x))
            if isinstance(sub, ir.Binary):
                return self.combine(sub, evaluate)
            if isinstance(sub, ir.Select):
                return self.builder.select(self.guards_hold(sub.guards, stmt, env), evaluate(sub.then),
                                           evaluate(sub.otherwise))
            return self.expr(sub, stmt, env)
        return self.before_store(e, stmt.stage.dtype, evaluate)

    def lane(self, instruction: str) -> llir.Value:
        """The thread's index in the warp (0-31) or, for wgmma, in the warpgroup (0-127: the warp is
        thread.y mod 4)."""
        b = self.builder
        lane = b.zext(self.special_register("tid.x"), I64)
        if not is_warpgroup(instruction):
            return lane
        warp = b.zext(self.special_register("tid.y"), I64)
        return b.add(lane, b.shl(b.and_(warp, constant(I64, 3)), constant(I64, 5)))

    def lane_place(self, lane: llir.Value) -> tuple[llir.Value, llir.Value]:
        """(16 * warp + lane / 4, 2 * (lane % 4)) of thread `lane` of a warp (or warpgroup): its row and
        first column in each 8x8 block of a fragment."""
        b = self.builder
        warp = b.shl(b.lshr(lane, constant(I64, 5)), constant(I64, 4))
        row = b.add(warp, b.lshr(b.and_(lane, constant(I64, 31)), constant(I64, 2)))
        return row, b.shl(b.and_(lane, constant(I64, 3)), constant(I64, 1))

    def mma(self, tile: TensorTile, stmt: StmtNode, nodes: list[LoopNode], env: dict):
        """One m16n8k16 tile on the warp: each lane gathers its fragments of A (four registers of two
        elements), B (two) and the accumulator (four floats), runs mma.sync, and stores the four sums.
        An initialization stores the identity into each lane's four accumulator elements; a copy tile
        copies them."""
        b = self.builder
        base = {**env, **{node.loop.name: ZERO for node in nodes}}
        # wgmma's m and n tiles cut by a tail are computed whole, with no branch around the instruction
        # (ptxas serializes wgmma that a branch separates); their copy tiles guard each element instead.
        # So are its k steps past the end of k where both operands read zeros there (`zeros_past_k`)
        roles = ("mnk" if self.zeros_past_k(tile) else "mn") if is_warpgroup(tile.instruction) else ""
        whole = {tile.loops[role].loop.name for role in roles}
        present = constant(llir.IntType(1), 1)
        for node in nodes:
            for lim in node.limits if node.loop.name not in whole else ():
                inside = b.icmp_signed("<", self.affine(lim.rest, base), self.extent(lim.bound, base))
                present = b.and_(present, inside)     # a tail of whole tiles: there or not, for the whole warp
        with b.if_then(present):
            self.tile(tile, stmt, base)

    def zeros_past_k(self, tile: TensorTile) -> bool:
        """Whether a tensor-core update's k steps past the end of k read zeros from both operands: each is
        copied by TMA (which fills what lies past its source with zeros) from an input whose k ends where
        every tail that cuts the k loop does, so such a step adds nothing."""
        if tile.b is None or "k" not in tile.loops:
            return False
        k = tile.loops["k"]
        copies = {copy.target: copy for copy in self.bulk_copies.values()}
        for load in (tile.a, tile.b):
            copy = copies.get(load.buffer)
            source = self.tree.buffers[copy.source] if copy is not None else None
            if source is None or source.offsets or k.loop.dim not in source.dims \
                    or any(lim.bound != source.shape[source.dims.index(k.loop.dim)] for lim in k.limits):
                return False
        return True

    def tile(self, tile: TensorTile, stmt: StmtNode, base: dict):
        """The instructions of one tile, at loop values `base` (its own loops at 0)."""
        stage = stmt.stage
        lane = self.lane(tile.instruction)
        if tile.b is None or not is_warpgroup(tile.instruction):
            self.settle_wgmma()
        targets = self.tile_elements(stage.name, Affine.identity(stage.dims), tile, stmt, base, lane)
        if stmt.kind == "init":
            for target in targets:
                self.store_value(constant(F32, IDENTITY[stage.reduce_op]), target, stage.dtype)
            return
        if tile.b is None:
            sources = self.tile_elements(tile.a.buffer, tile.a.index, tile, stmt, base, lane)
            places = self.element_envs(tile, base, lane)
            inside = self.inside_tails(tile, places)
            if inside is None:
                self.write_back(tile, stmt, sources, places, targets, base)
                return
            rows = self.rows_inside(tile, places)
            if rows is not None:            # only rows cut: stored as whole tiles are, each row under its guard
                self.write_back(tile, stmt, sources, places, targets, base, rows)
                return
            with self.builder.if_else(self.tile_inside_tails(tile, base)) as (whole, cut):
                with whole:                 # most tiles of a wgmma kernel cut by a tail lie wholly inside it
                    self.write_back(tile, stmt, sources, places, targets, base)
                with cut:                   # the edge tiles: each element stored under its guard
                    for source, place, target, holds in zip(sources, places, targets, inside):
                        with self.builder.if_then(holds):
                            value = self.load_value(source, tile.dtype)
                            self.store_value(self.written_back(stage.expr, tile.a, value, stmt, place), target,
                                             stage.dtype)
            return
        if is_warpgroup(tile.instruction):
            self.wgmma(tile, stmt, base, targets)
        else:
            self.mma_sync(tile, stmt, base, targets, lane)

    def write_back(self, tile: TensorTile, stmt: StmtNode, sources: list, places: list[dict], targets: list,
                   base: dict, guards: list | None = None):
        """A copy tile's elements loaded from the accumulator, through the stage's expression, stored;
        with `guards` (one an element, shared by a row's: only the tile's rows are cut), each store only
        where its first element's holds, and the expression's reads along the rows clamped into their buffers."""
        values = [self.load_value(source, tile.dtype) for source in sources]
        cut = frozenset({tile.loops["m"].loop.name} if guards else ())
        values = [self.written_back(stmt.stage.expr, tile.a, value, stmt, env, cut) for value, env in zip(values, places)]
        self.store_tile(values, targets, tile, stmt, base, guards)

    def tile_inside_tails(self, tile: TensorTile, base: dict) -> llir.Value:
        """Whether a whole wgmma copy tile (its loops from 0 to their extents, at loop values `base`) lies
        inside the tails that cut its m and n loops: its last element does."""
        b = self.builder
        holds = constant(llir.IntType(1), 1)
        for node, lim in tail_limits(tile, "mn"):
            last = b.add(self.affine(lim.rest, base), constant(I64, lim.coeff * (node.loop.extent - 1)))
            holds = b.and_(holds, b.icmp_signed("<", last, self.extent(lim.bound, base)))
        return holds

    def inside_tails(self, tile: TensorTile, places: list[dict]) -> list[llir.Value] | None:
        """For each element of a wgmma copy tile whose m or n loop a tail cuts (the tile is computed whole:
        `analysis.tensorize`), whether the element lies inside every such tail; None where no tail cuts."""
        limits = tail_limits(tile, "mn")
        if not limits or not is_warpgroup(tile.instruction):
            return None
        return [self.within(limits, place) for place in places]

    def rows_inside(self, tile: TensorTile, places: list[dict]) -> list[llir.Value] | None:
        """Where tails cut a wgmma copy tile's m loop alone, for each element whether its row lies inside
        them: one condition a row, which its elements share (so the row's stores go under one branch, as
        few blocks as whole tiles have, which LLVM's NVPTX back end compiles several times faster than a
        branch an element). None where no tail cuts m, or one cuts n."""
        m = tile.loops["m"]
        if tile.loops["n"].limits or not m.limits or not is_warpgroup(tile.instruction):
            return None
        rows = [row for row, _ in fragment_places(tile.instruction)]
        first = {row: places[rows.index(row)] for row in dict.fromkeys(rows)}
        held = {row: self.within(tail_limits(tile, "m"), place) for row, place in first.items()}
        return [held[row] for row in rows]

    def within(self, limits: list, place: dict) -> llir.Value:
        """Whether every (loop node, limit) of `limits` holds at loop values `place`."""
        b = self.builder
        holds = constant(llir.IntType(1), 1)
        for node, lim in limits:
            value = b.add(b.mul(constant(I64, lim.coeff), place[node.loop.name]), self.affine(lim.rest, place))
            holds = b.and_(holds, b.icmp_signed("<", value, self.extent(lim.bound, place)))
        return holds

    def store_tile(self, values: list, targets: list[llir.Value], tile: TensorTile, stmt: StmtNode, base: dict,
                   guards: list | None = None):
        """Store a copy tile's elements: each thread's pairs of neighbouring columns (fragment_places)
        as one 2-element vector where the columns are adjacent in memory and the pair aligned; with
        `guards` (one an element, shared by a row's), each store where its first element's holds, the
        stores of a row under one branch."""
        stores = []
        self.collect_tile_stores(values, targets, tile, stmt, base, guards or [None] * len(values), stores)
        by_guard: dict = {}
        for guard, store in stores:
            by_guard.setdefault(guard, []).append(store)
        for guard, group in by_guard.items():
            with self.builder.if_then(guard) if guard is not None else contextlib.nullcontext():
                for store in group:
                    store()

    def collect_tile_stores(self, values: list, targets: list[llir.Value], tile: TensorTile, stmt: StmtNode,
                            base: dict, guards: list, stores: list):
        """`store_tile`'s stores, appended to `stores` as (guard, a function that emits the store)."""
        stage, n = stmt.stage, tile.loops["n"].loop
        index = Affine.identity(stage.dims)
        moving = {tile.loops["m"].loop.name, n.name}      # set per element from the thread's place
        fixed = {k: v for k, v in base.items() if k not in moving}
        paired = not self.is_fragment(stage.name) \
            and self.linear_offset(stage.name, index, stmt).coeffs().get(n.name) == 1 \
            and self.alignment(stage.name, index, stmt, fixed, Lanes(n.name, 2)) == 2 * ITEM_BYTES[stage.dtype]
        store = functools.partial(self.store_value, dtype=stage.dtype)
        if not paired:
            stores += [(guard, functools.partial(store, value, target))
                       for value, target, guard in zip(values, targets, guards)]
            return
        group = self.vector_store_bytes // (2 * ITEM_BYTES[stage.dtype])
        if group > 1 and len(values) % (4 * group) == 0 and self.alignment(
                stage.name, index, stmt, fixed, Lanes(n.name, 2 * group)) == self.vector_store_bytes:
            self.store_vectors(values, targets, stage.dtype, group, guards, stores)
            return
        stores += [(guards[first], functools.partial(store, self.packed(values[first:first + 2]), targets[first],
                                                     align=2 * ITEM_BYTES[stage.dtype]))
                   for first in range(0, len(values), 2)]

    def store_vectors(self, values: list, targets: list[llir.Value], dtype: str, group: int, guards: list,
                      stores: list):
        """Store a copy tile's elements G pairs a lane (16 bytes), each store appended to `stores` as
        (its row's guard, a function that emits it). The G lanes of a group
        (lane & (G - 1)) each hold a pair of neighbouring columns of G consecutive 8-column blocks (the
        fragment layout); log2(G) rounds of xor shuffles (a butterfly transpose) give lane q the G pairs of
        block q, which it stores at once: a quad of lanes writes 64 consecutive bytes of a row, with half
        (float32) or a quarter (2-byte elements) of the store instructions of pairs, which had a batched
        product's write-back waiting on the store queue."""
        b = self.builder
        lane = b.and_(self.special_register("tid.x"), constant(I32, group - 1))
        word = llir.IntType(16 * ITEM_BYTES[dtype])
        words = [b.bitcast(self.narrow(self.packed(values[i:i + 2]), dtype), word) for i in range(0, len(values), 2)]
        vector = llir.VectorType(MEMORY_TYPE[dtype], 2 * group)
        back = b.sext(b.mul(lane, constant(I32, -2)), I64)        # from the lane's own pair to the block's start
        for first in range(0, len(words) // 2, group):            # words: block j's rows r, r + 8, then j + 1's
            for half in (0, 1):
                held = [words[2 * (first + block) + half] for block in range(group)]
                offset = 1
                while offset < group:
                    upper = b.icmp_unsigned("!=", b.and_(lane, constant(I32, offset)), constant(I32, 0))
                    for low in [block for block in range(group) if not block & offset]:
                        high = low | offset
                        got = self.shuffle_xor(b.select(upper, held[low], held[high]), offset)
                        held[low], held[high] = b.select(upper, got, held[low]), b.select(upper, held[high], got)
                    offset *= 2
                target = targets[4 * first + 2 * half]
                for block in range(1, group):
                    mine = b.icmp_unsigned("==", lane, constant(I32, block))
                    target = b.select(mine, targets[4 * (first + block) + 2 * half], target)
                start = b.gep(target, [back], source_etype=MEMORY_TYPE[dtype])
                stores.append((guards[4 * first + 2 * half],     # (a row's: the group's blocks share it)
                               functools.partial(b.store, b.bitcast(self.packed(held), vector), start,
                                                 align=2 * group * ITEM_BYTES[dtype])))

    def mma_sync(self, tile: TensorTile, stmt: StmtNode, base: dict, targets: list[llir.Value], lane: llir.Value):
        """One mma.sync on the warp: the lane's fragments of A and B, its four accumulators in and out."""
        b, stage = self.builder, stmt.stage
        m, n = tile.loops["m"].loop.name, tile.loops["n"].loop.name
        a = self.fragment(tile.a, tile, stmt, base, m, 4, lane)
        bb = self.b_fragment(tile, stmt, base, n, lane)
        accumulators = [self.load_value(target, stage.dtype) for target in targets]
        kind = MMA_TYPE[tile.dtype]
        ptx = (f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 "
               "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};")
        signature = llir.FunctionType(llir.LiteralStructType([F32] * 4), [I32] * 6 + [F32] * 4)
        result = b.asm(signature, ptx, ",".join(["=f"] * 4 + ["r"] * 6 + ["f"] * 4), a + bb + accumulators,
                       side_effect=False)
        for index, target in enumerate(targets):
            self.store_value(b.extract_value(result, index), target, stage.dtype)

    def wgmma(self, tile: TensorTile, stmt: StmtNode, base: dict, targets: list[llir.Value]):
        """One wgmma on the warpgroup: both operands through shared-memory descriptors, the thread's
        N/2 accumulators updated in place. It joins the batch in flight (a fence opens a new one)."""
        b, stage = self.builder, stmt.stage
        accumulators = [self.load_value(target, stage.dtype) for target in targets]
        descriptors = [self.descriptor(load, stmt, base) for load in (tile.a, tile.b)]
        transposed = [int(self.wgmma_operands[load.buffer].major == "mn") for load in (tile.a, tile.b)]
        count, kind = len(accumulators), MMA_TYPE[tile.dtype]
        shape = tile.instruction.partition(".")[2]
        outputs = ",".join(f"${i}" for i in range(count))
        ptx = (f"{{ .reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned.{shape}.f32.{kind}.{kind} "
               f"{{{outputs}}}, ${count}, ${count + 1}, p, 1, 1, {transposed[0]}, {transposed[1]}; }}")
        constraints = ",".join(["=f"] * count + ["l", "l"] + [str(i) for i in range(count)] + ["~{memory}"])
        signature = llir.FunctionType(llir.LiteralStructType([F32] * count), [I64, I64] + [F32] * count)
        if not self.wgmma_batch:
            self.inline("wgmma.fence.sync.aligned;")
        result = b.asm(signature, ptx, constraints, descriptors + accumulators, side_effect=True)
        self.wgmma_batch = True
        for index, target in enumerate(targets):
            self.store_value(b.extract_value(result, index), target, stage.dtype)

    def descriptor(self, load, stmt: StmtNode, base: dict) -> llir.Value:
        """wgmma's 64-bit shared-memory matrix descriptor of an operand tile starting at `base`: its
        address / 16, the byte offsets between 64-column blocks (leading: mn-major only) and between
        8-row atoms (stride: 1024), and the 128-byte swizzle (mode 1, bits 62-63)."""
        b, layout = self.builder, self.wgmma_operands[load.buffer]
        address = self.shared_address(self.access(load.buffer, load.index, False, stmt, base))
        leading = layout.rows * SWIZZLE_BYTES if layout.major == "mn" else 16
        low = b.or_(b.and_(b.lshr(address, constant(I32, 4)), constant(I32, 0x3FFF)),
                    constant(I32, (leading >> 4) << 16))
        high = (ATOM_ROWS * SWIZZLE_BYTES >> 4) | (1 << 30)
        return b.or_(b.zext(low, I64), constant(I64, high << 32))

    def fragment(self, load, tile: TensorTile, stmt: StmtNode, base: dict, row: str, count: int,
                 lane: llir.Value) -> list[llir.Value]:
        """A lane's `count` registers of an operand whose rows run along loop `row` (A: m, 4 registers;
        B: n, 2): register j holds the pair (row block + lane/4, k block + 2*(lane%4)) of the 8x8
        block j. From shared memory laid out for it, one ldmatrix; else two 16-bit loads each."""
        b, k = self.builder, tile.loops["k"].loop.name
        layout = self.ldmatrix_layout(load, stmt, row, k)
        if layout is not None:
            return self.ldmatrix(load, stmt, base, row, k, count, lane, layout)
        group, pair = self.lane_place(lane)
        registers = []
        for row_block, k_block in fragment_blocks(count):
            here = {**base, row: b.add(group, constant(I64, row_block)), k: b.add(pair, constant(I64, k_block))}
            registers.append(self.packed_pair(load, tile.dtype, stmt, here, k))
        return registers

    def b_fragment(self, tile: TensorTile, stmt: StmtNode, base: dict, n: str, lane: llir.Value) -> list[llir.Value]:
        """A lane's two B registers. Where B's n tiles come in unrolled pairs (an even count of them) and
        ldmatrix reads B, one ldmatrix.x4 loads both tiles of a pair: both tiles build it at the even
        tile's loop values, so LLVM emits it once, and each takes its half."""
        k = tile.loops["k"].loop.name
        layout = self.ldmatrix_layout(tile.b, stmt, n, k)
        pair = self.n_tile_pair(tile.b, stmt, base, n) if layout is not None else None
        if pair is None:
            return self.fragment(tile.b, tile, stmt, base, n, 2, lane)
        outer, index = pair
        even = {**base, outer: constant(I64, index - index % 2)}
        registers = self.ldmatrix(tile.b, stmt, even, n, k, 4, lane, layout, rows_first=True)
        return registers[2 * (index % 2):2 * (index % 2) + 2]

    def n_tile_pair(self, load, stmt: StmtNode, base: dict, n: str) -> tuple[str, int] | None:
        """(loop, value) of the unrolled loop over B's n tiles around the tile loop `n`: its step in B
        is 8 of n's, its value here a constant and its extent even, so tiles 2j and 2j + 1 both lie
        in the shared tile; None where there is no such loop."""
        coeffs = self.linear_offset(load.buffer, load.index, stmt).coeffs()
        loops = {lp.name: lp for lp in self.tree.schedule.of(stmt.stage.name).loops}
        for name, coeff in coeffs.items():
            lp, value = loops.get(name), base.get(name)
            if (lp is not None and lp.annotation == "unroll" and lp.extent % 2 == 0 and coeff == 8 * coeffs.get(n, 0)
                    and isinstance(value, llir.Constant)):
                return name, int(value.constant)
        return None

    def ldmatrix_layout(self, load, stmt: StmtNode, row: str, k: str) -> str | None:
        """'' or '.trans' where ldmatrix can load the operand: it lives in shared memory, k (or else
        the row loop) steps by one element, and every other step is a multiple of 8 elements, so
        each lane's 8-element row starts 16-byte aligned; None otherwise."""
        if load.buffer not in self.shared_buffers:
            return None
        linear = self.linear_offset(load.buffer, load.index, stmt)
        coeffs = linear.coeffs()
        contiguous = k if coeffs.get(k) == 1 else row if coeffs.get(row) == 1 else None
        others = [c for name, c in coeffs.items() if name != contiguous] + [linear.const]
        if contiguous is None or math.gcd(*others) % 8:
            return None
        return "" if contiguous == k else ".trans"

    def ldmatrix(self, load, stmt: StmtNode, base: dict, row: str, k: str, count: int, lane: llir.Value,
                 layout: str, rows_first: bool = False) -> list[llir.Value]:
        """ldmatrix (the NVVM intrinsic, so LLVM loads a fragment that several tiles use once): lanes
        8j..8j+7 give the addresses of the 8 rows of 8x8 block j (stored rows run along k with
        '.trans'), and each lane receives its registers of all `count` blocks. Four blocks go (row 0,
        k 0), (row 8, k 0), (row 0, k 8), (row 8, k 8) as A's registers do, or with `rows_first` (two
        B tiles) (row 0, k 0), (row 0, k 8), (row 8, k 0), (row 8, k 8)."""
        b = self.builder
        block = b.and_(b.lshr(lane, constant(I64, 3)), constant(I64, count - 1))
        offset = b.and_(lane, constant(I64, 7))
        if count == 4:
            low, high = b.and_(block, constant(I64, 1)), b.lshr(block, constant(I64, 1))
            if rows_first:
                low, high = high, low
            row_block = b.shl(low, constant(I64, 3))
            k_block = b.shl(high, constant(I64, 3))
        else:
            row_block, k_block = ZERO, b.shl(block, constant(I64, 3))
        if layout:
            here = {**base, row: row_block, k: b.add(k_block, offset)}
        else:
            here = {**base, row: b.add(row_block, offset), k: k_block}
        pointer = self.access(load.buffer, load.index, False, stmt, here)
        shared = b.addrspacecast(pointer, llir.PointerType(addrspace=3))
        result_type = llir.LiteralStructType([I32] * count)
        load_matrix = self.declare(f"llvm.nvvm.ldmatrix.sync.aligned.m8n8.x{count}{layout}.b16", result_type,
                                   [shared.type])
        result = b.call(load_matrix, [shared])
        return [b.extract_value(result, index) for index in range(count)]

    def packed_pair(self, load, dtype: str, stmt: StmtNode, env: dict, k: str) -> llir.Value:
        """Two operand elements, at k and k + 1, as the 32-bit register mma takes (the first in the low half)."""
        b = self.builder
        halves = []
        for step in (0, 1):
            here = {**env, k: b.add(env[k], constant(I64, step))}
            stored = b.load(self.access(load.buffer, load.index, False, stmt, here), typ=MEMORY_TYPE[dtype], align=2)
            halves.append(b.zext(b.bitcast(stored, I16), I32))
        return b.or_(halves[0], b.shl(halves[1], constant(I32, 16)))


@dataclass(frozen=True)
class Swizzle:
    """offset -> offset ^ (((offset >> shift) & mask) << chunk): the 16-byte chunks of each row of a
    shared tile are permuted by its row, so that 8 consecutive rows' chunks at one column (what
    ldmatrix reads in one phase, and what a warp's 16-byte copies write) fall in 8 different groups
    of 4 banks. A row of C chunks takes chunk ^ (row mod 8) for C >= 8, else chunk ^ ((row / (8 / C))
    mod C): the rows that share a 128-byte line keep their place, the others cycle through all C."""

    shift: int
    mask: int
    chunk: int

    @staticmethod
    def of(strides: tuple[int, ...], item_bytes: int) -> "Swizzle | None":
        """The swizzle of a row-major tile with these strides (in elements), if its rows are a power of
        two of at least two 16-byte chunks; None otherwise."""
        if len(strides) < 2 or strides[-1] != 1:
            return None
        row, per_chunk = strides[-2], 16 // item_bytes
        chunks = row // per_chunk
        if row % per_chunk or chunks < 2 or chunks & (chunks - 1):
            return None
        lines = max(8 // chunks, 1)
        return Swizzle((row * lines).bit_length() - 1, min(chunks, 8) - 1, per_chunk.bit_length() - 1)

    @staticmethod
    def of_elements(strides: tuple[int, ...]) -> "Swizzle | None":
        """The swizzle of a row-major tile read down its columns element by element: each element of a
        row XORed with the row's index mod 32, so a warp's 32 lanes reading 32 consecutive rows at one
        column (or 32 consecutive elements of a row) meet in no bank (4-byte elements; 2-byte ones in rows
        of 32). None unless rows are a power of two of at least 32 elements."""
        if len(strides) < 2 or strides[-1] != 1:
            return None
        row = strides[-2]
        if row < WARP or row & (row - 1):
            return None
        return Swizzle(row.bit_length() - 1, WARP - 1, 0)

    def apply(self, b: llir.IRBuilder, offset: llir.Value) -> llir.Value:
        """The swizzled offset (elements), as i64 arithmetic."""
        row = b.and_(b.lshr(offset, constant(I64, self.shift)), constant(I64, self.mask))
        return b.xor(offset, b.shl(row, constant(I64, self.chunk)))

    def __call__(self, offset: int) -> int:
        """The swizzled offset of a whole number (what `apply` emits)."""
        return offset ^ (((offset >> self.shift) & self.mask) << self.chunk)


@dataclass(frozen=True)
class WgmmaLayout:
    """Where wgmma finds each element of a shared operand tile (row-major offsets in, shared offsets
    out): k-major rows of 128 bytes stay in place; mn-major rows of `row` elements are stored as
    blocks of 64 columns, one after another (`rows` rows each). Then each 128-byte line's 16-byte
    chunks are XORed with the line's index mod 8 (the 128-byte swizzle, on 1024-byte atoms)."""

    operand: SharedOperand

    def apply(self, b: llir.IRBuilder, offset: llir.Value) -> llir.Value:
        """The shared offset (elements), as i64 arithmetic."""
        if self.operand.major == "mn":
            row, column = b.udiv(offset, constant(I64, self.operand.row)), b.urem(offset, constant(I64, self.operand.row))
            block = b.mul(b.udiv(column, constant(I64, 64)), constant(I64, 64 * self.operand.rows))
            offset = b.add(block, b.add(b.mul(row, constant(I64, 64)), b.urem(column, constant(I64, 64))))
        return SWIZZLE_128.apply(b, offset)

    def __call__(self, offset: int) -> int:
        """The shared offset of a whole number (what `apply` emits)."""
        if self.operand.major == "mn":
            row, column = divmod(offset, self.operand.row)
            offset = column // 64 * 64 * self.operand.rows + row * 64 + column % 64
        return SWIZZLE_128(offset)


SWIZZLE_128 = Swizzle.of((64, 1), 2)        # rows of 64 16-bit elements: 16-byte chunk ^ (128-byte line mod 8)


def tail_limits(tile: TensorTile, roles: str) -> list:
    """(loop node, limit) of every tail that cuts the tile's loops of `roles` ('m', 'n' or both)."""
    return [(node, lim) for role in roles for node in (tile.loops[role],) for lim in node.limits]


def fragment_places(instruction: str) -> list[tuple[int, int]]:
    """(row, column) of thread 0's accumulators of one tile, in the instruction's register order: in
    each 8-column block j, (0, 8j), (0, 8j + 1), (8, 8j), (8, 8j + 1) (other threads are moved by
    `lane_place`)."""
    columns = TENSOR_INSTRUCTIONS[instruction]["n"]
    return [(row, 8 * j + col) for j in range(columns // 8) for row in (0, 8) for col in (0, 1)]


def fragment_blocks(count: int) -> list[tuple[int, int]]:
    """(row, k) origin of each 8x8 block of an mma operand: A (4 blocks) is 16 x 16 with its blocks
    ordered down then across; B (2 blocks) is 8 rows of n by 16 of k."""
    if count == 4:
        return [(8 * (j & 1), 8 * (j >> 1)) for j in range(4)]
    return [(0, 8 * j) for j in range(count)]


def holds_wgmma(body: list) -> bool:
    """Whether a wgmma tile lies in `body`."""
    return any(isinstance(inner, LoopNode) and tensor_role(inner.loop) and is_warpgroup(tensor_role(inner.loop)[0])
               for inner, _ in walk(body))
