"""Asynchronous copies on NVIDIA GPUs, for codegen.gpu: cp.async, TMA bulk tensor copies completing
on mbarriers, and the pipelined loops that issue them ahead into rotating shared buffers.

A loop pipelined with S stages (`LoopTree.pipeline`) keeps S copies of the shared buffers placed
in it; the copies of iteration i + S - 1 are issued (cp.async, one commit group per iteration, or
TMA, completing on the `full` mbarrier of their buffer) while iteration i runs. In a pipelined k loop
of S >= 3 stages around wgmma tiles the batch of one iteration runs on while the next is issued, so
one buffer is kept for the tile it reads: copies run S - 2 iterations ahead (not S - 1) and each wait
leaves one copy group fewer in flight. An iteration waits for the copies of its tile, synchronizes
(every batch but the previous one is then done in every warpgroup), issues the copies into the buffer
read two iterations back, issues its batch and waits for the previous one (`wgmma.wait_group 1`).
TMA copies of S >= 4 stages also run S - 2 iterations ahead (`TMA_SPARE_STAGE`): the buffer they refill
was read two iterations back, whose `empty` barrier every warp has long passed.
Before each barrier of such a kernel, `fence.proxy.async` makes the thread's writes to shared
memory visible to the tensor cores (which read through the async proxy).

`AsyncCopyLowering` is mixed into codegen.gpu's kernel builder: its methods call the builder's
(`shared`, `barrier`, `settle_wgmma`, `inline`, `special_register`, ...) and read its state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir as llir

from .. import ir
from ..analysis.gpu_target import assumed_gpu
from ..analysis.tma import copied_load
from ..analysis.tensorize import SWIZZLE_BYTES
from ..ir import Affine
from ..schedule import (BLOCK_AXES, LoopNode, StmtNode, accesses, pipeline_copier, pipeline_depth, pipeline_persistent,
                        walk)
from .gpu_tensor_cores import holds_wgmma
from .llvm import I32, I64, ITEM_BYTES, MEMORY_TYPE, ZERO, FunctionBuilder, constant

TENSOR_MAPS = "tensor_maps"     # the kernel parameter pointing at the TMA copies' tensor maps, in global memory
TENSOR_MAP_BYTES = 128
MBARRIER = llir.IntType(64)


# With 4 stages or more, TMA copies run stages - 2 iterations ahead, not stages - 1: the buffer they refill
# was read two iterations back, so its `empty` barrier has long completed and no warp waits at each
# iteration for the slowest warp to finish the batch just before (H100, session 19, wgmma 128 x 256 tiles,
# 4 stages: bf16 4096^3 0.208 -> 0.203 ms, 1000^3 0.0237 -> 0.0222 ms against 3 stages without it)
TMA_SPARE_STAGE = True
# A persistent kernel's tiles in groups of this many block.y rows, each group walked down its columns: the blocks
# running at once read few rows and columns of operand tiles, which stay in L2. H100, session 25, persistent
# bf16 wgmma kernels, ms with rows of 1 / 4 / 8 / 16: 2048x4096x11008 0.347 / 0.313 / 0.299 / 0.346, 4096^3
# 0.2025 / 0.1955 / 0.1976 / 0.1987, 8192^3 1.721 / 1.607 / 1.571 / 1.664, 8192x512x4096 0.088 / 0.0855 / 0.084 / 0.0898
TILE_GROUP_ROWS = 8
# ... and so do the blocks of a kernel of tensor-core tiles that is not persistent (`grouped_grid`)
GROUPED_BLOCKS = True
# A persistent TMA pipeline gets a warpgroup of its own (`producer_warps`), whose first warp issues every copy as
# soon as its buffer is empty: the warpgroups computing never wait for each other to issue the copies. The
# producers give registers back (`setmaxnreg`, PRODUCER_REGISTERS), the computing warpgroups take them.
PRODUCER_WARP = True
PRODUCER_REGISTERS = 40
MOST_REGISTERS = 256            # setmaxnreg's most
WARPGROUP_WARPS = 4
# ... for blocks of at most this many warpgroups computing: 1 and 2 ran on an H100; a tuner trial of 4 (256 x 128
# tiles) hung when they asked for more registers than the block was launched with (`consumer_registers` since)
PRODUCED_WARPGROUPS = 2


def producer_warps(nodes: list, tree, arch: str, block: tuple[int, int, int]) -> int:
    """The warps of the producer warpgroup the kernel of these top-level nodes runs besides its warpgroups
    computing (PRODUCER_WARP), whose warps take `block` (one or two warpgroups along thread.y only): 4 where
    its TMA pipeline is persistent and its buffers take more than half an SM's shared memory (the block is
    then alone on its SM, so its warps may take every register: two blocks of 128 x 128 tiles an SM would
    no longer fit), else 0."""
    if not PRODUCER_WARP or block[2] != 1 or block[1] > PRODUCED_WARPGROUPS * WARPGROUP_WARPS:
        return 0
    shared = assumed_gpu(arch).shared_per_sm
    for node, _ in walk(nodes):
        if isinstance(node, LoopNode) and pipeline_copier(node.loop.annotation) == "tma" \
                and pipeline_persistent(node.loop.annotation):
            stages = pipeline_depth(node.loop.annotation)[0]
            taken = stages * sum(plan.size * ITEM_BYTES[plan.dtype] for plan in tree.local_buffers.get(id(node), []))
            return WARPGROUP_WARPS if 2 * taken > shared else 0
    return 0


def consumer_registers(arch: str, consumers: int) -> int:
    """The registers each of `consumers` threads computing takes (`setmaxnreg.inc`, a multiple of 8) out of what
    the block was launched with (its threads and the producer's, each the most a thread of so many may have:
    ptxas launches a kernel that sets its registers with that many) once the producer warpgroup has given
    back all but PRODUCER_REGISTERS of its own: two warpgroups take 232 of 384 x 168. Asking more than the
    block holds would wait forever."""
    producers = WARPGROUP_WARPS * 32
    launched = assumed_gpu(arch).registers_per_sm // (consumers + producers) // 8 * 8
    spare = (consumers + producers) * launched - producers * PRODUCER_REGISTERS
    return min(MOST_REGISTERS, spare // consumers // 8 * 8)


class AsyncCopyLowering:
    """The kernel builder's copies: pipelined loops, cp.async, and TMA copies with their mbarriers."""

    # Pipelines: cp.async or TMA copies into rotating shared buffers ---------------------------------
    def pipelined(self, node: LoopNode, env: dict, stages: int, in_flight: int):
        """Issue the copies of the first iterations into `stages` rotating buffers, then run the loop
        with each iteration's copies issued ahead: by cp.async (`cp_async_pipeline`) or TMA
        (`tma_pipeline`), `stages - 1` iterations ahead. Where the body's wgmma batch stays in flight
        into the next iteration (3 stages or more) and the copies are issued before it, one buffer is
        its: cp.async copies run `stages - 2` iterations ahead. In a persistent kernel the pipeline
        was set up before the block's tiles (`persistent_tiles`) and runs on across them."""
        if self.persisted is not None and self.persisted.node is node:
            persisted = self.persisted
            self.tma_loop(persisted.plan, env, persisted.full, persisted.empty,
                          self.builder.mul(persisted.turn, persisted.plan.count))
            self.settle_wgmma()
            return
        plan = self.pipeline_plan(node, env, stages)
        if plan.tma:
            self.tma_pipeline(plan, env)
        else:
            self.cp_async_pipeline(plan, env, max(in_flight - plan.overlap, 0))
        for buffer in plan.sizes:
            self.rotations.pop(buffer, None)

    def pipeline_plan(self, node: LoopNode, env: dict, stages: int) -> "_Pipeline":
        """The pipelined loop's plan, its rotating buffers allocated in shared memory."""
        placed = self.tree.local_buffers.get(id(node), [])
        sizes = {plan.name: self.rotating_size(plan) for plan in placed}
        for plan in placed:
            self.pointers[plan.name] = self.shared(MEMORY_TYPE[plan.dtype], sizes[plan.name] * stages, plan.name)
            self.share(plan)
        copies = [child for child in node.body if buffers_touched(child)[0] <= sizes.keys()]
        rest = [child for child in node.body if all(child is not copy for copy in copies)]
        overlap = stages > 2 and holds_wgmma(rest)
        tma = pipeline_copier(node.loop.annotation) == "tma"
        spare = tma and TMA_SPARE_STAGE and stages > 3
        return _Pipeline(node.loop.name, self.trip_count(node, env), stages, stages - 1 - (overlap and not tma) - spare,
                         overlap, tma, sizes, copies, rest)

    def cp_async_pipeline(self, plan: "_Pipeline", env: dict, in_flight: int):
        """Each iteration waits until at most `in_flight` copy groups run, synchronizes the block (so
        every thread's copies are visible and the buffer the copies go to next is read by no one),
        issues the copies `plan.ahead` iterations ahead and runs the rest of the body."""
        for iteration in range(plan.ahead):
            self.issue_copies(plan, {**env, plan.loop: constant(I64, iteration)})

        def iteration(i):
            self.wait_copies(in_flight)
            self.barrier(settle=not plan.overlap)
            self.issue_copies(plan, {**env, plan.loop: self.builder.add(i, constant(I64, plan.ahead))})
            self.run_body(plan, env, i, i)
            if plan.overlap:
                self.settle_wgmma(in_flight=1)
        self.counted_loop_of(plan, iteration)
        self.wait_copies(0)
        self.barrier()

    def tma_pipeline(self, plan: "_Pipeline", env: dict):
        """No barrier per iteration: each buffer has a `full` mbarrier (its copies' bytes arrived) and
        an `empty` one (each warp's wgmma batches that read it are done); see `tma_loop`."""
        full, empty = self.tma_barriers(plan)
        if self.producer:
            self.produce(plan, env, full, empty, plan.count)
        for iteration in range(0 if self.producer else plan.ahead):
            self.issue_tma(plan, env, constant(I64, iteration), full, empty)
        self.tma_loop(plan, env, full, empty, ZERO)
        self.release_tma(plan, full, empty)

    def produce(self, plan: "_Pipeline", env: dict, full: llir.Value, empty: llir.Value, total: llir.Value):
        """The producer warpgroup (launched after the block's warps, `producer_warps`) gives back registers, and
        its first warp issues the TMA copies of iterations 0 .. total - 1, its first lane each once its buffer
        is empty; then it exits, the warpgroups computing take the registers, and the block's barriers from
        here on count only them."""
        b = self.builder
        first = constant(I32, self.block[1])
        warp = self.special_register("tid.y")
        with b.if_then(b.icmp_unsigned(">=", warp, first)):
            self.inline(f"setmaxnreg.dec.sync.aligned.u32 {PRODUCER_REGISTERS};")
            with b.if_then(b.icmp_unsigned("==", warp, first)):
                self.producing = True
                FunctionBuilder.counted_loop(self, ZERO, total, lambda i: self.issue_tma(plan, env, i, full, empty),
                                             f"{plan.loop}.copies", rolled=True)
                self.producing = False
            b.ret_void()
        self.inline(f"setmaxnreg.inc.sync.aligned.u32 {consumer_registers(self.arch, math.prod(self.block))};")
        self.producer_exited = True

    def tma_barriers(self, plan: "_Pipeline") -> tuple[llir.Value, llir.Value]:
        """The pipeline's `full` mbarriers (one arrival: the issuing thread's) and `empty` ones (a warp's
        first lane each)."""
        warps = self.block[1] * self.block[2]          # thread.x is a warp's 32 lanes where wgmma runs
        return (self.mbarriers(plan.stages, f"{plan.loop}.full", 1),
                self.mbarriers(plan.stages, f"{plan.loop}.empty", warps))

    def tma_loop(self, plan: "_Pipeline", env: dict, full: llir.Value, empty: llir.Value, start: llir.Value):
        """The TMA pipeline's loop, its iterations counted on from `start` (a persistent kernel's earlier
        tiles). An iteration waits until its buffer is full and runs its batch (committed before any
        other waiting loop: ptxas serializes wgmma across branches); once a batch is done (the one
        before, where it stays in flight), each warp's first lane marks its buffer empty; the first
        thread issues the copies `plan.ahead` iterations ahead (`issue_tma`)."""
        def iteration(i):
            b = self.builder
            counted = b.add(start, i)
            self.wait_mbarrier(full, plan.stages, counted)
            self.run_body(plan, env, i, counted)
            self.settle_wgmma(in_flight=int(plan.overlap))
            done = b.sub(counted, constant(I64, int(plan.overlap)))
            with b.if_then(b.icmp_signed(">=", done, ZERO)):
                self.inline_by("mbarrier.arrive.shared::cta.b64 state, [$0];",
                               [self.mbarrier_at(empty, b.urem(done, constant(I64, plan.stages)))], "x")
            if not self.producer:
                self.issue_tma(plan, env, b.add(counted, constant(I64, plan.ahead)), full, empty)
        self.counted_loop_of(plan, iteration)

    def release_tma(self, plan: "_Pipeline", full: llir.Value, empty: llir.Value):
        """After the pipeline: every thread done with its buffers, the mbarriers invalidated."""
        self.barrier()
        for barriers in (full, empty):
            for slot in range(plan.stages):
                self.inline_by("mbarrier.inval.shared::cta.b64 [$0];", [self.mbarrier_at(barriers, slot)])

    def run_body(self, plan: "_Pipeline", env: dict, i: llir.Value, counted: llir.Value):
        """The pipelined loop's body but its copies, in iteration `i` (reading the buffers of iteration
        `counted`, the same but in a persistent kernel's later tiles)."""
        self.rotate(plan.sizes, plan.stages, counted)
        self.close_body = False
        self.body(plan.rest, {**env, plan.loop: i})

    def counted_loop_of(self, plan: "_Pipeline", iteration):
        """The pipelined loop itself, its wgmma batches kept in flight across iterations where it overlaps."""
        self.wgmma_overlap = plan.overlap
        self.counted_loop(ZERO, plan.count, iteration, plan.loop)
        self.wgmma_overlap = False

    def rotating_size(self, plan) -> int:
        """Elements of one of a pipelined buffer's copies, rounded up to its alignment (so every copy
        starts as aligned as the first)."""
        element, align = ITEM_BYTES[plan.dtype], self.shared_alignment(plan.name)
        return -(-plan.size * element // align) * align // element

    def rotate(self, sizes: dict[str, int], stages: int, iteration: llir.Value):
        """Point the pipelined buffers at their copy for `iteration` (iteration mod stages)."""
        slot = self.builder.urem(iteration, constant(I64, stages))
        for buffer, size in sizes.items():
            self.rotations[buffer] = self.builder.mul(slot, constant(I64, size))

    def rotated(self, buffer: str, pointer: llir.Value) -> llir.Value:
        """A pipelined buffer's pointer moved to the copy of the current iteration."""
        if buffer not in self.rotations:
            return pointer
        return self.element(pointer, self.rotations[buffer], self.tree.buffers[buffer].dtype)

    def issue_copies(self, plan: "_Pipeline", env: dict):
        """The cp.async copies of iteration env[plan.loop] (if it exists), then one commit (every
        thread commits a group per iteration, empty or not, so the group count follows the
        iterations)."""
        b, iteration = self.builder, env[plan.loop]
        with b.if_then(b.icmp_signed("<", iteration, plan.count)):
            self.rotate(plan.sizes, plan.stages, iteration)
            self.asynchronous |= plan.sizes.keys()
            FunctionBuilder.body(self, plan.copies, env)
            self.asynchronous -= plan.sizes.keys()
        b.call(self.declare("llvm.nvvm.cp.async.commit.group", llir.VoidType(), []), [])

    def issue_tma(self, plan: "_Pipeline", env: dict, counted: llir.Value, full: llir.Value, empty: llir.Value):
        """The TMA copies of iteration `counted` (if it exists: in a persistent kernel, of the tile it
        falls in), issued by the block's first thread once the buffer's last readers, `stages`
        iterations back, are done (every thread waits for that, so no branch on the thread separates a
        warpgroup's wgmma instructions: ptxas would serialize them)."""
        b = self.builder
        copied, exists = self.copies_env(plan, env, counted)
        with b.if_then(exists):
            self.rotate(plan.sizes, plan.stages, counted)
            with b.if_then(b.icmp_signed(">=", counted, constant(I64, plan.stages))):
                self.wait_mbarrier(empty, plan.stages, counted, phase_offset=1)
            slot = b.urem(counted, constant(I64, plan.stages))
            self.bulk_copy(plan.copies, copied, self.mbarrier_at(full, slot))

    def copies_env(self, plan: "_Pipeline", env: dict, counted: llir.Value) -> tuple[dict, llir.Value]:
        """(the loop values, whether it exists) of iteration `counted` of the pipelined loop: of its
        tile's loop where the kernel is persistent (`counted` then runs on over the block's tiles)."""
        b = self.builder
        if self.persisted is None:
            return {**env, plan.loop: counted}, b.icmp_signed("<", counted, plan.count)
        tile = b.add(self.persisted.first, b.mul(b.udiv(counted, plan.count), constant(I64, self.persisted.blocks)))
        return ({**env, **self.tile_values(tile), plan.loop: b.urem(counted, plan.count)},
                b.icmp_signed("<", tile, constant(I64, self.persisted.tiles)))

    # Persistent kernels: a grid of fewer blocks than tiles, each block running its tiles in turn ----
    def persistent_tiles(self, node: LoopNode, env: dict, blocks: int):
        """Block-bound loop `node` and the block-bound loops nested in it, run by a grid of `blocks`
        blocks (`launch_dims`): block b runs tiles b, b + blocks, ... (in the order of `tile_values`),
        the TMA pipeline inside set up once and run on across them, so a tile's first copies are issued
        while the tile before finishes (`check_persistent` has made sure the loops allow it)."""
        chain = block_chain(node)
        pipelined = next(current for current, _ in walk(chain[-1].body) if isinstance(current, LoopNode)
                         and pipeline_persistent(current.loop.annotation))
        b = self.builder
        plan = self.pipeline_plan(pipelined, env, pipeline_depth(pipelined.loop.annotation)[0])
        full, empty = self.tma_barriers(plan)
        extents = {current.loop.annotation: current.loop.extent for current in chain}
        first = b.zext(self.special_register("ctaid.x"), I64)
        self.persisted = _Persistence(pipelined, plan, full, empty, [(c.loop.name, c.loop.annotation) for c in chain],
                                      tuple(extents.get(f"block.{axis}", 1) for axis in "xyz"), blocks, first, ZERO)
        turns = b.add(b.udiv(b.sub(constant(I64, self.persisted.tiles - 1), first), constant(I64, blocks)),
                      constant(I64, 1))
        if self.producer:
            self.produce(plan, env, full, empty, b.mul(turns, plan.count))
        for iteration in range(0 if self.producer else plan.ahead):
            self.issue_tma(plan, env, constant(I64, iteration), full, empty)

        def turn(j):
            self.persisted.turn = j
            tile = b.add(first, b.mul(j, constant(I64, blocks)))
            self.loop(chain[0], {**env, **self.tile_values(tile)})
        self.counted_loop(ZERO, turns, turn, f"{node.loop.name}.tiles", rolled=True)
        self.persisted = None
        self.release_tma(plan, full, empty)
        for buffer in plan.sizes:
            self.rotations.pop(buffer, None)

    def tile_values(self, tile: llir.Value) -> dict:
        """The block-bound loops' values in a persistent kernel's tile number `tile`: block.z outermost, and
        within each of its planes the tiles in groups of rows (`grouped_tile`)."""
        b, (x, y, _) = self.builder, self.persisted.grid
        row, column = self.grouped_tile(b.urem(tile, constant(I64, x * y)), x, y)
        along = {"block.y": row, "block.x": column, "block.z": b.udiv(tile, constant(I64, x * y))}
        return {name: along[axis] for name, axis in self.persisted.loops}

    def grouped_tile(self, plane: llir.Value, x: int, y: int) -> tuple[llir.Value, llir.Value]:
        """(block.y, block.x) of tile number `plane` of a grid of x by y tiles walked in groups of
        TILE_GROUP_ROWS block.y rows, each group down its columns (block.y fastest): the blocks running
        at once share the same few rows and columns of operand tiles, which stay in L2."""
        b, group = self.builder, TILE_GROUP_ROWS
        first = b.mul(b.udiv(plane, constant(I64, group * x)), constant(I64, group))
        within = b.urem(plane, constant(I64, group * x))
        last = b.icmp_unsigned(">", b.add(first, constant(I64, group)), constant(I64, y))   # a last group of fewer rows
        rows = y % group or group

        def divided(op):
            return b.select(last, op(within, constant(I64, rows)), op(within, constant(I64, group)))
        return b.add(first, divided(b.urem)), divided(b.udiv)

    def block_index(self, axis: str) -> llir.Value:
        """The value of a block-bound loop: its block index, or in a kernel whose blocks are grouped
        (`grouped_grid`) the tile the hardware's order of blocks (block.x fastest) reaches there."""
        b = self.builder
        if self.grouped_grid is None or axis not in ("block.x", "block.y"):
            return b.zext(self.special_register(f"ctaid.{axis[-1]}"), I64)
        if axis not in self.grouped_values:
            x, y, _ = self.grouped_grid
            linear = b.add(b.mul(b.zext(self.special_register("ctaid.y"), I64), constant(I64, x)),
                           b.zext(self.special_register("ctaid.x"), I64))
            row, column = self.grouped_tile(linear, x, y)
            self.grouped_values = {"block.y": row, "block.x": column}
        return self.grouped_values.pop(axis)

    def wait_copies(self, in_flight: int):
        """Wait until at most `in_flight` of this thread's copy groups are still running."""
        wait = self.declare("llvm.nvvm.cp.async.wait.group", llir.VoidType(), [llir.IntType(32)])
        self.builder.call(wait, [constant(llir.IntType(32), in_flight)])

    # cp.async: a vectorized copy statement as one asynchronous copy ---------------------------------
    def copy_asynchronously(self, stmt: StmtNode, env: dict, lanes=None) -> bool:
        """Emit a vectorized copy statement of a pipelined stage as one cp.async of 8 or 16 bytes where
        both sides are contiguous and aligned, or as a cp.async an element where its source cannot be
        read as one vector (`copy_elements`); False otherwise (the copy then runs as loads and stores,
        still into the buffer of its iteration: a tile transposed into shared memory reads its source
        in vectors and writes elements, fewer memory requests than a cp.async an element)."""
        if lanes is None or not self.copied_asynchronously(stmt):
            return False
        stage, load = stmt.stage, stmt.stage.expr
        source, source_step, source_align = self.linear_address(load.buffer, load.index, stmt, env, lanes)
        target, target_step, target_align = self.linear_address(stage.name, Affine.identity(stage.dims), stmt,
                                                                env, lanes)
        width = lanes.width * ITEM_BYTES[stage.dtype]
        if source_step == 1 and target_step == 1 and width in (8, 16) and min(source_align, target_align) >= width:
            self.cp_async(target, source, width)
            return True
        if source_step == 1 and source_align >= width or not self.copy_elements(stmt):
            return False
        for lane in range(lanes.width):
            self.copy_element(stmt, {**env, lanes.name: constant(I64, lane)})
        return True

    def copied_asynchronously(self, stmt: StmtNode) -> bool:
        """Whether a statement copies a kernel parameter's elements as they are into a pipelined buffer."""
        stage, load = stmt.stage, stmt.stage.expr
        return stage.name in self.asynchronous and stmt.kind == "assign" and isinstance(load, ir.Load) \
            and not load.clamped and load.dtype == stage.dtype and load.buffer in self.params

    def copy_elements(self, stmt: StmtNode) -> bool:
        """Whether a pipelined copy may run as a cp.async an element: elements of 4 or 8 bytes (cp.async's
        least). Its loads would otherwise stall the thread where it stores them, in the iteration that
        issues them, not where they are read (H100, session 26: a float32 product's B of 777 columns,
        rows off 16-byte boundaries, copied an element through registers: 1000x1536x777 at 0.72x torch)."""
        return ITEM_BYTES[stmt.stage.dtype] in (4, 8)

    def copy_element(self, stmt: StmtNode, env: dict):
        """One element of a pipelined copy (`copy_elements`) as a cp.async."""
        stage, load = stmt.stage, stmt.stage.expr
        source = self.access(load.buffer, load.index, False, stmt, env)
        target = self.access(stage.name, Affine.identity(stage.dims), False, stmt, env)
        self.cp_async(target, source, ITEM_BYTES[stage.dtype])

    def cp_async(self, target: llir.Value, source: llir.Value, size: int):
        """cp.async of `size` bytes from global to shared memory (.cg, which bypasses L1, takes only 16)."""
        b = self.builder
        shared = b.addrspacecast(target, llir.PointerType(addrspace=3))
        global_ = b.addrspacecast(source, llir.PointerType(addrspace=1))
        cache = "cg" if size == 16 else "ca"
        copy = self.declare(f"llvm.nvvm.cp.async.{cache}.shared.global.{size}", llir.VoidType(),
                            [shared.type, global_.type])
        b.call(copy, [shared, global_])

    # TMA: bulk tensor copies completing on mbarriers ------------------------------------------------
    def mbarriers(self, count: int, name: str, arrivals: int) -> llir.Value:
        """`count` mbarriers in shared memory, each expecting `arrivals` arrivals per phase, initialized
        by the first thread before the block synchronizes."""
        barriers = self.shared(MBARRIER, count, name)
        for slot in range(count):
            self.inline_by(f"mbarrier.init.shared::cta.b64 [$0], {arrivals};", [self.mbarrier_at(barriers, slot)])
        self.inline("fence.mbarrier_init.release.cluster;")
        self.barrier()
        return barriers

    def mbarrier_at(self, barriers: llir.Value, slot) -> llir.Value:
        """The shared-memory address (32 bits) of mbarrier `slot` (an int or an i64 value)."""
        slot = constant(I64, slot) if isinstance(slot, int) else slot
        return self.shared_address(self.builder.gep(barriers, [slot], source_etype=MBARRIER, inbounds=True))

    def wait_mbarrier(self, barriers: llir.Value, stages: int, iteration: llir.Value, phase_offset: int = 0):
        """Wait until the phase of `iteration`'s buffer's mbarrier for that iteration (or for an earlier
        use of the buffer, `phase_offset` uses back) completes: the one with parity
        (iteration / stages - phase_offset) mod 2."""
        b = self.builder
        slot = b.urem(iteration, constant(I64, stages))
        use = b.add(b.udiv(iteration, constant(I64, stages)), constant(I64, phase_offset))
        parity = b.trunc(b.and_(use, constant(I64, 1)), I32)
        self.inline("{ .reg .pred done; WAIT${:uid}: mbarrier.try_wait.parity.shared::cta.b64 done, [$0], $1; "
                 "@!done bra WAIT${:uid}; }", [self.mbarrier_at(barriers, slot), parity])

    def bulk_copy(self, copies: list, env: dict, barrier: llir.Value):
        """One iteration's TMA copies: the mbarrier told how many bytes will arrive, then each tile's
        boxes, from the box at its origin (its own loops at 0) in the input."""
        statements = [(stmt, path) for stmt, path in walk(copies) if isinstance(stmt, StmtNode)]
        total = sum(self.bulk_copies[id(stmt)].bytes for stmt, _ in statements)
        self.inline_by("mbarrier.arrive.expect_tx.shared::cta.b64 state, [$0], $1;", [barrier, constant(I32, total)])
        for stmt, path in statements:
            copy = self.bulk_copies[id(stmt)]
            base = {**env, **{node.loop.name: ZERO for node in path}}
            load = copied_load(self.tree, stmt.stage.expr)
            origin = [self.builder.trunc(self.affine(ix.substitute(stmt.index), base), I32) for ix in load.index]
            target = self.shared_address(self.rotated(copy.target, self.pointers[copy.target]))
            tensor_map = self.builder.gep(self.pointers[TENSOR_MAPS], [constant(I64, copy.index * TENSOR_MAP_BYTES)],
                                          source_etype=llir.IntType(8), inbounds=True)
            for block in range(copy.blocks):
                self.tma_load(target, tensor_map, origin, barrier, block * copy.columns, block * copy.rows * SWIZZLE_BYTES)

    def tma_load(self, target: llir.Value, tensor_map: llir.Value, origin: list, barrier: llir.Value,
                 column: int, offset: int):
        """cp.async.bulk.tensor of the box at `origin` (moved `column` elements along the innermost
        dim) to `offset` bytes past `target`, completing on `barrier`."""
        b, rank = self.builder, len(origin)
        coordinates = [*origin[:-1], b.add(origin[-1], constant(I32, column))][::-1]
        places = ", ".join(f"${i + 2}" for i in range(rank))
        self.inline_by(f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                       f"[$0], [$1, {{{places}}}], [${rank + 2}];",
                       [b.add(target, constant(I32, offset)), b.ptrtoint(tensor_map, I64), *coordinates, barrier])

    def inline_by(self, ptx: str, operands: list, axes: str | None = None):
        """An inline PTX instruction (operands $0...; it may write the scratch register `state`)
        predicated on the block's first thread, or the producer warp's first lane while it is built (or,
        axes 'x', each warp's first lane: thread.x is a warp's lanes where wgmma runs). A predicate, not a
        branch: ptxas serializes wgmma instructions that a branch on the thread index separates."""
        b = self.builder
        index = constant(I32, 0)
        for axis in axes or ("x" if self.producing else "xyz"):
            index = b.or_(index, self.special_register(f"tid.{axis}"))
        self.inline(f"{{ .reg .pred leader; .reg .b64 state; setp.eq.u32 leader, ${len(operands)}, 0; @leader {ptx} }}",
                    [*operands, index])


@dataclass(frozen=True)
class _Pipeline:
    """A pipelined loop as the code generator runs it: its name and trip count, `stages` buffers, the
    copies issued `ahead` iterations ahead, whether a wgmma batch stays in flight into the next
    iteration (`overlap`), whether TMA copies (not cp.async), each pipelined buffer's size (elements
    of one copy), its copy nests and the rest of its body."""

    loop: str
    count: llir.Value
    stages: int
    ahead: int
    overlap: bool
    tma: bool
    sizes: dict[str, int]
    copies: list
    rest: list


@dataclass
class _Persistence:
    """A persistent kernel as the code generator runs it: its pipelined loop and that loop's plan and
    mbarriers, set up before the tiles; the block-bound loops (name, axis), the tiles along block.x,
    .y and .z, the blocks of the grid, this block's first tile and its turn (the tiles it ran before)."""

    node: LoopNode
    plan: _Pipeline
    full: llir.Value
    empty: llir.Value
    loops: list[tuple[str, str]]
    grid: tuple[int, int, int]
    blocks: int
    first: llir.Value
    turn: llir.Value

    @property
    def tiles(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


def grouped_grid(nodes: list, grid: tuple[int, int, int]) -> tuple[int, int, int] | None:
    """The grid of a kernel whose blocks run their tiles in groups of rows (`grouped_tile`), else None: one
    nest of a block.y loop around a block.x loop, both of fixed extents over more than one block, around a
    TMA pipeline (a tensor-core product, whose operand tiles each block reads whole), not persistent (a
    persistent kernel groups its tiles itself). H100, session 26: without it, bf16 6000^3 read 1.13 GB from
    DRAM, cuBLAS 448 MB."""
    if not GROUPED_BLOCKS or len(nodes) != 1 or not isinstance(nodes[0], LoopNode) or grid[0] < 2 or grid[1] < 2:
        return None
    outer = nodes[0]
    inner = outer.body[0] if len(outer.body) == 1 and isinstance(outer.body[0], LoopNode) else None
    if outer.loop.annotation != "block.y" or inner is None or inner.loop.annotation != "block.x" \
            or isinstance(outer.loop.extent, ir.Size) or isinstance(inner.loop.extent, ir.Size):
        return None
    pipelines = [current.loop.annotation for current, _ in walk(inner.body) if isinstance(current, LoopNode)
                 and pipeline_copier(current.loop.annotation)]
    if not any(pipeline_copier(a) == "tma" for a in pipelines) or any(pipeline_persistent(a) for a in pipelines):
        return None
    return grid


def block_chain(node: LoopNode) -> list[LoopNode]:
    """A block-bound loop and the block-bound loops nested alone in it, outermost first."""
    chain = [node]
    while len(chain[-1].body) == 1 and isinstance(chain[-1].body[0], LoopNode) \
            and chain[-1].body[0].loop.annotation in BLOCK_AXES:
        chain.append(chain[-1].body[0])
    return chain


def buffers_touched(node) -> tuple[set[str], set[str]]:
    """(buffers written, buffers read) by the statements in a node."""
    written, read = set(), set()
    for stmt, _ in walk([node]):
        if isinstance(stmt, StmtNode):
            for access in accesses(stmt):
                (written if access.write else read).add(access.buffer)
    return written, read
