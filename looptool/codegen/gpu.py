"""NVIDIA GPU backend: a loop tree becomes PTX through LLVM's NVPTX target.

Each top-level nest of the tree is one kernel launch (launches run in order, so
stages at the root are separated by a grid-wide barrier).  Loops bound to
`block.x/y/z` and `thread.x/y/z` read the matching special registers; every
other loop runs inside each thread.  A bound loop whose trip count is smaller
than the launch dimension guards its body, so no thread touches memory outside
its tile.  Kernel parameters are generic pointers, which NVPTX lowers to
global memory for kernel arguments.

Code outside thread-bound loops ("block level") runs in every thread of a block;
a barrier follows each of its statements and nests that the next one could
conflict with (by buffer), and ends every block-level loop body, so what threads
wrote in one nest is visible to all of them in the next (the legality check
relies on this).
A buffer placed at block level and written only inside thread-bound loops lives
in shared memory; otherwise each thread keeps its own copy.  A reduction whose
loop is bound to threads accumulates per-thread partials and combines them
through shared memory (a tree over the threads), then thread 0 updates the result.

A tensorized tile (`LoopTree.tensorize`) is one `mma.sync` (inline PTX) run by a warp:
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
lets shared memory be overwritten, and at the end of every loop iteration. In a pipelined k loop
of S >= 3 stages the batch of one iteration runs on while the next is issued, so one buffer is
kept for the tile it reads: copies run S - 2 iterations ahead (not S - 1) and each wait leaves one
copy group fewer in flight. An iteration waits for the copies of its tile, synchronizes (every
batch but the previous one is then done in every warpgroup), issues the copies into the buffer
read two iterations back, issues its batch and waits for the previous one (`wgmma.wait_group 1`).
Before each barrier of such a kernel, `fence.proxy.async` makes the thread's writes to shared
memory visible to the tensor cores (which read through the async proxy).
"""
from __future__ import annotations

import contextlib
import functools
import math
import re
from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite import ir as llir

from .. import ir
from ..analysis.gpu_target import STATIC_SHARED
from ..analysis.tensorize import ATOM_ROWS, SWIZZLE_BYTES, WARP, SharedOperand, TensorTile, is_warpgroup, tensor_tiles
from ..analysis.tma import BulkCopy, bulk_copies, copied_load
from ..ir import Affine
from ..schedule import (GPU_AXES, TENSOR_INSTRUCTIONS, LoopNode, LoopTree, StmtNode, accesses, pipeline_copier,
                        pipeline_depth, tensor_role, thread_bound, walk)
from .accumulators import run_in_registers
from .edges import clamped_outside, inside_buffer, register_tails, tail_host
from .llvm import (F32, F64, I16, I32, I64, IDENTITY, INLINE_F32, ITEM_BYTES, MEMORY_TYPE, REDUCE_BINARY, VALUE_TYPE, ZERO,
                   FunctionBuilder, Lanes, constant, element_type, hoisted_tail_checks, kernel_params)

TRIPLE = "nvptx64-nvidia-cuda"
DATA_LAYOUT = "e-p:64:64:64-i64:64-i128:128-v16:16-v32:32-n16:32:64"
SREG = {"block": "ctaid", "thread": "tid"}
LOCAL_LIMIT = 16 * 1024
MMA_TYPE = {"bfloat16": "bf16", "float16": "f16"}
WGMMA_ALIGN = 1024              # bytes: a wgmma operand's swizzle atoms start on this boundary
WGMMA_ARCHS = ("sm_90", "sm_90a")
TENSOR_MAPS = "tensor_maps"     # the kernel parameter pointing at the TMA copies' tensor maps, in global memory
TENSOR_MAP_BYTES = 128
# a tensor-core tile's results are stored this many bytes a lane where the lanes of a group can trade
# pairs of columns into whole vectors (`store_vectors`; 4: pairs as the fragment holds them)
VECTOR_STORE_BYTES = 16
MBARRIER = llir.IntType(64)


@dataclass
class Launch:
    """One kernel of the module: its name and launch dimensions (x, y, z)."""

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared: int = 0      # bytes of dynamic shared memory it is launched with (0: static only)


@dataclass
class GpuModule:
    """PTX text, the kernels to launch in order, the buffer name of each parameter, and the
    parameters whose packed accesses assume 16-byte aligned memory."""

    ptx: str
    llvm_ir: str
    launches: list[Launch]
    params: list[str]
    arch: str
    aligned: tuple[str, ...] = ()
    tensor_maps: tuple[BulkCopy, ...] = ()    # the TMA copies, in the order of their maps at TENSOR_MAPS


def generate(tree: LoopTree, arch: str = "sm_90", aligned_params: bool = True,
             dynamic_shared: bool = False) -> GpuModule:
    """Lower every top-level nest of `tree` to a kernel and compile the module to PTX for `arch`.
    With `aligned_params`, packed accesses to kernel parameters may assume 16-byte aligned buffers.
    Shared buffers are static arrays while every kernel needs at most 48 KiB (unless `dynamic_shared`);
    otherwise the module is built again with each kernel's shared buffers at offsets in dynamic shared
    memory, whose size its Launch carries (the runtime opts the kernel in to that much)."""
    tiles = tensor_tiles(tree)
    copies = bulk_copies(tree, tiles)
    module, launches, params, aligned = _module(tree, tiles, copies, aligned_params, dynamic=dynamic_shared)
    if not dynamic_shared and any(launch.dynamic_shared for launch in launches):
        module, launches, params, aligned = _module(tree, tiles, copies, aligned_params, dynamic=True)
    text = str(module)      # printing costs about what building does: a build that only sized shared memory isn't
    ptx = _compile(text, _arch_for(tiles, arch))
    if any(launch.dynamic_shared for launch in launches):
        ptx = _extern_shared(ptx, [launch.name for launch in launches])
    return GpuModule(ptx, text, launches, params, arch, aligned, tuple(sorted(copies.values(), key=lambda c: c.index)))


def _arch_for(tiles: dict[int, TensorTile], arch: str) -> str:
    """The target to compile for: sm_90a (Hopper's arch-specific instructions) where there are
    wgmma tiles (which TMA copies need too), which no other GPU runs; `arch` otherwise."""
    wgmma = sorted({tile.instruction for tile in tiles.values() if is_warpgroup(tile.instruction)})
    if not wgmma:
        return arch
    if arch not in WGMMA_ARCHS:
        raise ValueError(f"{wgmma[0]} runs only on Hopper GPUs (sm_90); this GPU is {arch}: use mma.m16n8k16")
    return "sm_90a"


def dynamic_shared_name(kernel: str) -> str:
    """The name of a kernel's array of dynamic shared memory."""
    return f"{kernel}_dynamic_shared"


def _extern_shared(ptx: str, kernels: list[str]) -> str:
    """Each kernel's shared array made extern (dynamic shared memory, sized at launch). LLVM optimizes
    it as an internal array of its real size, which it knows no parameter points into; an extern
    array from the start made it keep every global access in order around the shared ones (the
    float32 kernel "128x128x16 tiles in shared memory" reloaded and stored its 64 accumulators each
    k step, 32 registers instead of 128 and 34x slower on an H100)."""
    declarations = []
    for kernel in kernels:
        name = dynamic_shared_name(kernel)
        ptx, found = re.subn(rf"^\s*\.shared \.align (\d+) \.b8 {name}\[\d+\];\n", "", ptx, flags=re.M)
        if found:
            declarations.append(f".extern .shared .align {WGMMA_ALIGN} .b8 {name}[];\n")
    head, address, rest = ptx.partition(".address_size 64\n")
    return head + address + "".join(declarations) + rest


def _module(tree: LoopTree, tiles: dict[int, TensorTile], copies: dict[int, BulkCopy], aligned_params: bool,
            dynamic: bool):
    """(LLVM module, launches, params, aligned params); a launch's dynamic_shared is the shared
    memory its kernel needs where that exceeds STATIC_SHARED (or, `dynamic`, all it needs)."""
    module = llir.Module(name="looptool_gpu")
    module.triple = TRIPLE
    module.data_layout = DATA_LAYOUT
    params = kernel_params(tree) + ([TENSOR_MAPS] if copies else [])
    launches, aligned = [], set()
    for index, nodes in enumerate(kernel_nodes(tree.root)):
        name = f"looptool_k{index}"
        fn = llir.Function(module, llir.FunctionType(llir.VoidType(), [llir.PointerType()] * len(params)), name=name)
        fn.calling_convention = "ptx_kernel"
        for arg, buffer in zip(fn.args, params):
            arg.name = buffer
            if buffer in tree.buffers and tree.buffers[buffer].kind == "input":
                arg.add_attribute("noalias")   # written buffers are shared between threads: not noalias
        grid, block = launch_dims(nodes)
        builder = _GpuBuilder(tree, fn, dict(zip(params, fn.args)), aligned_params, tiles, copies, block, dynamic)
        builder.body(nodes, {})
        builder.finish()
        aligned |= builder.aligned_params
        needed = builder.shared_bytes if dynamic or builder.shared_bytes > STATIC_SHARED else 0
        launches.append(Launch(name, grid, block, needed))
        _declare_block_size(module, fn, launches[-1].block)
    return module, launches, params, tuple(sorted(aligned))


def _declare_block_size(module: llir.Module, fn: llir.Function, block: tuple[int, int, int]):
    """Tell ptxas the block size (.maxntid), so it keeps registers within what such a block may use
    instead of producing a kernel that fails to launch."""
    for axis, extent in zip("xyz", block):
        module.add_named_metadata("nvvm.annotations", [fn, llir.MetaDataString(module, f"maxntid{axis}"),
                                                       constant(llir.IntType(32), extent)])


def kernel_nodes(root: list) -> list[list]:
    """The top-level nodes each kernel runs: one nest each, except that statements at the root (the
    start of a reduction to a single value) join the next nest where it runs as one block, whose
    barriers then order them; anywhere else they are a kernel of their own."""
    kernels, pending = [], []
    for node in root:
        if isinstance(node, StmtNode):
            pending.append(node)
            continue
        if pending and launch_dims([node])[0] != (1, 1, 1):
            kernels.append(pending)
            pending = []
        kernels.append(pending + [node])
        pending = []
    return kernels + ([pending] if pending else [])


def launch_dims(nodes: list) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block) of the kernel that runs these top-level nodes."""
    extents = {axis: 1 for axis in GPU_AXES}
    for current in _loop_nodes(nodes):
        loop = current.loop
        if loop.annotation in GPU_AXES:
            extents[loop.annotation] = max(extents[loop.annotation], loop.extent * _threads_per_value(current))
        if tensor_role(loop):
            extents["thread.x"] = WARP         # the lanes of the warps that run its tiles
            if is_warpgroup(tensor_role(loop)[0]):
                extents["thread.y"] = max(extents["thread.y"], 4)
    grid = tuple(extents[f"block.{a}"] for a in "xyz")
    block = tuple(extents[f"thread.{a}"] for a in "xyz")
    if block[0] * block[1] * block[2] > 1024:
        raise ValueError(f"a GPU block of {block[0]}x{block[1]}x{block[2]} threads exceeds the 1024-thread limit; "
                         f"split the thread-bound loops")
    return grid, block


def _threads_per_value(node: LoopNode) -> int:
    """Threads along its axis that one value of a GPU-bound loop takes: 4 for a loop over
    warpgroups, else 1."""
    return 4 if counts_warpgroups(node) else 1


def counts_warpgroups(node: LoopNode) -> bool:
    """Whether a loop bound to thread.y runs over warpgroups (it holds wgmma tiles): its value is
    then thread.y / 4, each warpgroup being 4 warps of consecutive thread.y."""
    return node.loop.annotation == "thread.y" and _holds_wgmma(node.body)


def _holds_wgmma(body: list) -> bool:
    """Whether a wgmma tile lies in `body`."""
    return any(tensor_role(inner.loop) and is_warpgroup(tensor_role(inner.loop)[0]) for inner in _loop_nodes(body))


@functools.cache
def _target_data() -> llvm.TargetData:
    """NVPTX's data layout, which sizes shared buffers' elements."""
    return llvm.create_target_data(DATA_LAYOUT)


def _compile(text: str, arch: str) -> str:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    machine = llvm.Target.from_triple(TRIPLE).create_target_machine(cpu=arch, opt=3)
    module = llvm.parse_assembly(text)
    module.verify()
    options = llvm.create_pipeline_tuning_options(speed_level=3)
    builder = llvm.create_pass_builder(machine, options)
    builder.getModulePassManager().run(module, builder)
    return machine.emit_assembly(module)


class _GpuBuilder(FunctionBuilder):
    """The CPU loop-tree walker with GPU-bound loops read from special registers."""

    def __init__(self, tree: LoopTree, fn: llir.Function, pointers: dict, aligned_params: bool,
                 tiles: dict[int, TensorTile], copies: dict[int, BulkCopy], block: tuple[int, int, int],
                 dynamic: bool = False):
        super().__init__(tree, fn, pointers, threads=1)
        self.block = block
        self.tiles = tiles
        self.bulk_copies = copies
        self.dynamic = dynamic
        self.shared_bytes = 0
        self.shared_buffers: set[str] = set()
        self.swizzles: dict[str, Swizzle] = {}           # shared mma operands read by ldmatrix
        # every tensorized statement of the tree with its tile
        self.tile_statements = [(stmt, tiles[id(stmt)]) for stmt, _ in tree.statements() if id(stmt) in tiles]
        self.stage_tiles = {stmt.stage.name: tile for stmt, tile in self.tile_statements}
        self.wgmma_operands: dict[str, SharedOperand] = {
            load.buffer: layout for _, tile in self.tile_statements if tile.shared
            for load, layout in zip((tile.a, tile.b), tile.shared)}
        self.wgmma_batch = False                       # wgmma instructions issued and not yet committed
        self.wgmma_pending = False                     # committed batches not yet waited for
        self.wgmma_overlap = False                     # in a pipelined loop that keeps one batch in flight
        self.assume_aligned = aligned_params
        self.thread_loops: list[str] = []
        self.params = set(pointers)
        self.close_body = False
        self.aligned_params: set[str] = set()
        self.partials: dict[int, llir.Value] = {}
        self.rotations: dict[str, llir.Value] = {}     # pipelined buffer -> element offset of the current copy
        self.asynchronous: set[str] = set()            # stages whose copies are being issued with cp.async
        whole, self.edge_tails = register_tails(tree)
        self.full |= whole                             # register tails that may run past their limits
        self.hoisted = hoisted_tail_checks(tree, functools.partial(tail_host, whole, self.edge_tails))
        self.predicate: llir.Value | None = None       # in an edge tile: where its statements take effect
        self.paths = {id(stmt): path for stmt, path in tree.statements()}
        self.edge_exprs: dict[int, ir.Expr] = {}

    def body(self, nodes: list, env: dict):
        """At block level, a barrier follows a node unless the next one touches none of the buffers
        written since the last barrier and writes none read since then.  One ends the body of a
        loop that repeats (not that of a block-bound loop, nor the kernel)."""
        closing, self.close_body = self.close_body, True
        if self.thread_loops:
            super().body(nodes, env)
            return
        touched = [self.buffers_shared(node) for node in nodes] + [None]
        written, read = set(), set()
        for node, (node_written, node_read), after in zip(nodes, touched, touched[1:]):
            super().body([node], env)
            written |= node_written
            read |= node_read
            if after is not None:
                next_written, next_read = after
                if not (next_read & written or next_written & (written | read)):
                    continue
            elif not closing:
                continue
            self.barrier()
            written, read = set(), set()

    def buffers_shared(self, node) -> tuple[set[str], set[str]]:
        """(written, read) buffers of a node that other threads can see (not kept per thread)."""
        written, read = _buffers_touched(node)
        private = set(self.tree.thread_slices)
        return written - private, read - private

    def barrier(self, settle: bool = True):
        """Synchronize the block; first (`settle`) wait for this thread's wgmma batches, so nothing the
        barrier releases can overwrite what they read. Where wgmma reads shared memory, this thread's
        ordinary writes to it (stores, cp.async) are first made visible to the tensor cores' proxy."""
        if settle:
            self.settle_wgmma()
        if self.wgmma_operands:
            self.inline("fence.proxy.async.shared::cta;")
        self.builder.call(self.declare("llvm.nvvm.barrier0", llir.VoidType(), []), [])

    def settle_wgmma(self, in_flight: int = 0):
        """Close the open wgmma batch (one commit group) and wait until at most `in_flight` batches run
        (their accumulators and shared reads)."""
        if self.wgmma_batch:
            self.inline("wgmma.commit_group.sync.aligned;")
            self.wgmma_batch, self.wgmma_pending = False, True
        if self.wgmma_pending:
            self.inline(f"wgmma.wait_group.sync.aligned {in_flight};")
            self.wgmma_pending = in_flight > 0

    def inline(self, ptx: str, operands: list = ()):
        """An inline PTX instruction with 32-bit ('r') and 64-bit ('l') operands and no result, kept in
        place (a side effect that touches memory)."""
        constraints = ",".join(["l" if value.type == I64 else "r" for value in operands] + ["~{memory}"])
        self.builder.asm(llir.FunctionType(llir.VoidType(), [value.type for value in operands]), ptx, constraints,
                         list(operands), side_effect=True)

    def counted_loop(self, start: llir.Value, end: llir.Value, emit_body, name: str, rolled: bool = False):
        """A loop whose every iteration ends with its wgmma instructions done."""
        def body(i):
            emit_body(i)
            if not self.wgmma_overlap:
                self.settle_wgmma()
        super().counted_loop(start, end, body, name, rolled)

    def loop(self, node: LoopNode, env: dict):
        axis = node.loop.annotation
        if pipeline_depth(axis):
            self.pipelined(node, env, *pipeline_depth(axis))
            return
        tiled = self.tile_under(node)
        if tiled:
            self.mma(*tiled, [node, *_loop_nodes(node.body)], env)
            return
        if axis == "parallel":
            raise ValueError(f"loop '{node.loop.name}' is marked parallel: on a GPU, bind it to blocks or threads")
        if self.edge_tail(node):
            self.allocate_placed(node)
            self.edge_loop(node, env)
            return
        if axis not in GPU_AXES:
            super().loop(node, env)
            return
        self.allocate_placed(node)
        kind, dim = axis.split(".")
        value = self.builder.zext(self.special_register(f"{SREG[kind]}.{dim}"), I64)
        if counts_warpgroups(node):
            value = self.builder.lshr(value, constant(I64, 2))
        inside = {**env, node.loop.name: value}
        combined = self.combined_reductions(node) if kind == "thread" and not self.thread_loops else []
        for stmt in combined:
            ty = VALUE_TYPE[stmt.stage.dtype]
            self.partials[id(stmt)] = self.allocas.alloca(ty)
            self.builder.store(constant(ty, IDENTITY[stmt.stage.reduce_op]), self.partials[id(stmt)])
        if kind == "thread":
            self.thread_loops.append(node.loop.name)
        count = self.trip_count(node, env)
        inside_block = self.builder.icmp_signed("<", value, count)
        if self.fills_block(node, count):
            inside_block = constant(llir.IntType(1), 1)
        with self.builder.if_then(inside_block):
            self.close_body = kind != "block"     # a block-bound loop's body runs once: no closing barrier
            self.loop_body(node, inside)
        if kind == "thread":
            self.thread_loops.pop()
        for stmt in combined:
            self.combine_across_threads(stmt, node, value, env)

    def fills_block(self, node: LoopNode, count: llir.Value) -> bool:
        """Whether a thread-bound loop around wgmma tiles has an iteration for every thread along its
        axis, so needs no guard (a branch on the thread index between wgmma instructions makes ptxas
        serialize them). Other loops keep theirs: without it, LLVM moved a float32 register tile to
        local memory."""
        kind, _, axis = node.loop.annotation.partition(".")
        return kind == "thread" and _holds_wgmma(node.body) and isinstance(count, llir.Constant) \
            and count.constant * _threads_per_value(node) == self.block["xyz".index(axis)]

    # Pipelines: cp.async or TMA copies into rotating shared buffers ------------------------------
    def pipelined(self, node: LoopNode, env: dict, stages: int, in_flight: int):
        """Issue the copies of the first iterations into `stages` rotating buffers, then run the loop
        with each iteration's copies issued ahead: by cp.async (`cp_async_pipeline`) or TMA
        (`tma_pipeline`), `stages - 1` iterations ahead. Where the body's wgmma batch stays in flight
        into the next iteration (3 stages or more) and the copies are issued before it, one buffer is
        its: cp.async copies run `stages - 2` iterations ahead."""
        placed = self.tree.local_buffers.get(id(node), [])
        sizes = {plan.name: self.rotating_size(plan) for plan in placed}
        for plan in placed:
            self.pointers[plan.name] = self.shared(MEMORY_TYPE[plan.dtype], sizes[plan.name] * stages, plan.name)
            self.share(plan)
        copies = [child for child in node.body if _buffers_touched(child)[0] <= sizes.keys()]
        rest = [child for child in node.body if all(child is not copy for copy in copies)]
        overlap = stages > 2 and _holds_wgmma(rest)
        tma = pipeline_copier(node.loop.annotation) == "tma"
        plan = _Pipeline(node.loop.name, self.trip_count(node, env), stages, stages - 1 - (overlap and not tma),
                         overlap, sizes, copies, rest)
        if tma:
            self.tma_pipeline(plan, env)
        else:
            self.cp_async_pipeline(plan, env, max(in_flight - overlap, 0))
        for buffer in sizes:
            self.rotations.pop(buffer, None)

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
            self.run_body(plan, env, i)
            if plan.overlap:
                self.settle_wgmma(in_flight=1)
        self.counted_loop_of(plan, iteration)
        self.wait_copies(0)
        self.barrier()

    def tma_pipeline(self, plan: "_Pipeline", env: dict):
        """No barrier per iteration: each buffer has a `full` mbarrier (its copies' bytes arrived) and
        an `empty` one (each warp's wgmma batches that read it are done). An iteration waits until its
        buffer is full and runs its batch (committed before any other waiting loop: ptxas serializes
        wgmma across branches); once a batch is done (the one before, where it stays in flight), each
        warp's first lane marks its buffer empty; once the buffer of the copies `plan.ahead` iterations
        ahead is empty (that batch's, where it stayed in flight), the first thread issues them."""
        full = self.mbarriers(plan.stages, f"{plan.loop}.full", 1)
        warps = self.block[1] * self.block[2]          # thread.x is a warp's 32 lanes where wgmma runs
        empty = self.mbarriers(plan.stages, f"{plan.loop}.empty", warps)
        for iteration in range(plan.ahead):
            self.issue_copies(plan, {**env, plan.loop: constant(I64, iteration)}, full)

        def iteration(i):
            b = self.builder
            self.wait_mbarrier(full, plan.stages, i)
            self.run_body(plan, env, i)
            self.settle_wgmma(in_flight=int(plan.overlap))
            done = b.sub(i, constant(I64, int(plan.overlap)))
            with b.if_then(b.icmp_signed(">=", done, ZERO)):
                self.inline_by("mbarrier.arrive.shared::cta.b64 state, [$0];",
                               [self.mbarrier_at(empty, b.urem(done, constant(I64, plan.stages)))], "x")
            self.issue_copies(plan, {**env, plan.loop: b.add(i, constant(I64, plan.ahead))}, full, empty)
        self.counted_loop_of(plan, iteration)
        self.barrier()
        for barriers in (full, empty):
            for slot in range(plan.stages):
                self.inline_by("mbarrier.inval.shared::cta.b64 [$0];", [self.mbarrier_at(barriers, slot)])

    def run_body(self, plan: "_Pipeline", env: dict, i: llir.Value):
        """The pipelined loop's body but its copies, in iteration `i` (reading that iteration's buffers)."""
        self.rotate(plan.sizes, plan.stages, i)
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

    def shared_alignment(self, name: str) -> int:
        """Bytes a shared buffer starts on: 16, or WGMMA_ALIGN for a wgmma operand."""
        return WGMMA_ALIGN if name in self.wgmma_operands else 16

    def rotate(self, sizes: dict[str, int], stages: int, iteration: llir.Value):
        """Point the pipelined buffers at their copy for `iteration` (iteration mod stages)."""
        slot = self.builder.urem(iteration, constant(I64, stages))
        for buffer, size in sizes.items():
            self.rotations[buffer] = self.builder.mul(slot, constant(I64, size))

    def issue_copies(self, plan: "_Pipeline", env: dict, full: llir.Value | None = None,
                     empty: llir.Value | None = None):
        """The copies of iteration env[plan.loop] (if it exists): as cp.async, then one commit (every
        thread commits a group per iteration, empty or not, so the group count follows the
        iterations); or, with the `full` mbarriers, as TMA copies issued by the block's first thread
        once the buffer's last readers are done (its `empty` mbarrier)."""
        b, iteration = self.builder, env[plan.loop]
        with b.if_then(b.icmp_signed("<", iteration, plan.count)):
            self.rotate(plan.sizes, plan.stages, iteration)
            if full is not None:
                self.tma_copies(plan, env, full, empty)
            else:
                self.asynchronous |= plan.sizes.keys()
                FunctionBuilder.body(self, plan.copies, env)
                self.asynchronous -= plan.sizes.keys()
        if full is None:
            b.call(self.declare("llvm.nvvm.cp.async.commit.group", llir.VoidType(), []), [])

    def wait_copies(self, in_flight: int):
        """Wait until at most `in_flight` of this thread's copy groups are still running."""
        wait = self.declare("llvm.nvvm.cp.async.wait.group", llir.VoidType(), [llir.IntType(32)])
        self.builder.call(wait, [constant(llir.IntType(32), in_flight)])

    # TMA: bulk tensor copies completing on mbarriers ---------------------------------------------
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

    def tma_copies(self, plan: "_Pipeline", env: dict, full: llir.Value, empty: llir.Value | None):
        """Iteration env[plan.loop]'s TMA copies, into a buffer used before only once its readers of
        `stages` iterations back are done (every thread waits for that, so no branch on the thread
        separates a warpgroup's wgmma instructions: ptxas would serialize them)."""
        b, iteration = self.builder, env[plan.loop]
        if empty is not None:
            with b.if_then(b.icmp_signed(">=", iteration, constant(I64, plan.stages))):
                self.wait_mbarrier(empty, plan.stages, iteration, phase_offset=1)
        slot = b.urem(iteration, constant(I64, plan.stages))
        self.bulk_copy(plan.copies, env, self.mbarrier_at(full, slot))

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

    def inline_by(self, ptx: str, operands: list, axes: str = "xyz"):
        """An inline PTX instruction (operands $0...; it may write the scratch register `state`)
        predicated on the block's first thread (or, axes 'x', each warp's first lane: thread.x is a
        warp's lanes where wgmma runs). A predicate, not a branch: ptxas serializes wgmma
        instructions that a branch on the thread index separates."""
        b = self.builder
        index = constant(I32, 0)
        for axis in axes:
            index = b.or_(index, self.special_register(f"tid.{axis}"))
        self.inline(f"{{ .reg .pred leader; .reg .b64 state; setp.eq.u32 leader, ${len(operands)}, 0; @leader {ptx} }}",
                    [*operands, index])

    def special_register(self, name: str) -> llir.Value:
        """The 32-bit PTX special register `name` ('tid.x', 'ctaid.y', ...) read here."""
        return self.builder.call(self.declare(f"llvm.nvvm.read.ptx.sreg.{name}", I32, []), [])

    def shared_address(self, pointer: llir.Value) -> llir.Value:
        """A generic pointer into shared memory as a 32-bit shared-space address."""
        return self.builder.ptrtoint(self.builder.addrspacecast(pointer, llir.PointerType(addrspace=3)), I32)

    def copy_asynchronously(self, stmt: StmtNode, env: dict, lanes=None) -> bool:
        """Emit a vectorized copy statement of a pipelined stage as one cp.async of 8 or 16 bytes where
        both sides are contiguous and aligned; False otherwise (the copy then runs as loads and
        stores, still into the buffer of its iteration: per-element cp.async would cost a memory
        request per element, e.g. for a tile transposed into shared memory)."""
        stage, load = stmt.stage, stmt.stage.expr
        if stage.name not in self.asynchronous or lanes is None or stmt.kind != "assign" \
                or not isinstance(load, ir.Load) or load.clamped or load.dtype != stage.dtype \
                or load.buffer not in self.params:
            return False
        source, source_step, source_align = self.linear_address(load.buffer, load.index, stmt, env, lanes)
        target, target_step, target_align = self.linear_address(stage.name, Affine.identity(stage.dims), stmt,
                                                                env, lanes)
        width = lanes.width * ITEM_BYTES[stage.dtype]
        if source_step != 1 or target_step != 1 or width not in (8, 16) or min(source_align, target_align) < width:
            return False
        self.cp_async(target, source, width)
        return True

    def cp_async(self, target: llir.Value, source: llir.Value, size: int):
        """cp.async of `size` bytes from global to shared memory (.cg, which bypasses L1, takes only 16)."""
        b = self.builder
        shared = b.addrspacecast(target, llir.PointerType(addrspace=3))
        global_ = b.addrspacecast(source, llir.PointerType(addrspace=1))
        cache = "cg" if size == 16 else "ca"
        copy = self.declare(f"llvm.nvvm.cp.async.{cache}.shared.global.{size}", llir.VoidType(),
                            [shared.type, global_.type])
        b.call(copy, [shared, global_])

    def combined_reductions(self, node: LoopNode) -> list[StmtNode]:
        """Reduction updates under a thread-bound loop over one of their reduction dims, into one target
        element (no loop inside it runs over the result's dims; no other thread-bound loop inside)."""
        inside = list(walk(node.body))
        if any(isinstance(current, LoopNode) and thread_bound(current) for current, _ in inside):
            return []
        return [stmt for stmt, path in inside if isinstance(stmt, StmtNode) and stmt.kind == "update"
                and node.loop.dim in stmt.stage.reduce_dims
                and all(lp.loop.dim not in stmt.stage.dims for lp in [node, *path])]

    def vector_statement(self, stmt: StmtNode, env: dict, lanes):
        partial = self.partials.get(id(stmt))
        if partial is not None:           # a combined reduction: the lanes' total goes into the partial
            op, ty = stmt.stage.reduce_op, VALUE_TYPE[stmt.stage.dtype]
            total = self.horizontal(op, self.vector_expr(stmt.stage.expr, stmt, env, lanes))
            self.builder.store(self.binary(REDUCE_BINARY[op], self.builder.load(partial, typ=ty), total), partial)
            return
        if lanes.mask is None and self.predicate is not None:
            lanes = Lanes(lanes.name, lanes.width, self.splat(self.predicate, lanes.width))
        if lanes.mask is not None:
            self.masked_statement(stmt, env, lanes)
        elif not self.copy_asynchronously(stmt, env, lanes):
            super().vector_statement(stmt, env, lanes)

    def plain_loop(self, node: LoopNode, env: dict, count: llir.Value):
        """As on the CPU, a reduction loop around results it does not move keeps them in registers
        (`run_in_registers`: a thread's own output walked over a row is not reloaded and stored each
        step, which LLVM cannot do itself where other written buffers may alias it); reductions combined
        across threads keep their partials instead."""
        statements = [stmt for stmt, _ in walk(node.body) if isinstance(stmt, StmtNode)]
        combined = any(id(stmt) in self.partials for stmt in statements)
        if combined or self.reduced_around(node, statements):
            super().plain_loop(node, env, count)
        elif self.guards_outside(node):
            self.guard_free_or_not(node, env, lambda: run_in_registers(self, node, env, count, versioned=True)
                                   or super(_GpuBuilder, self).plain_loop(node, env, count))
        elif not run_in_registers(self, node, env, count):
            super().plain_loop(node, env, count)

    def guards_outside(self, node: LoopNode) -> bool:
        """Whether the loop's body has a guard-free copy (padding guards tested once at it, no tails)
        whose guards do not move with the loop itself, so the choice can be made once around it."""
        checks = self.guard_checks.get(id(node), [])
        return bool(checks) and id(node) not in self.hoisted and \
            not any(check.expr.coeffs().get(node.loop.name) for check in checks)

    def guard_free_or_not(self, node: LoopNode, env: dict, emit):
        """Test the loop's guards once, before it, and `emit` the loop twice (`guard_free_copy`): where
        they hold throughout (its statements free of them), and where they may not."""
        checks = self.guard_checks.pop(id(node))      # the copies below are chosen here, not per iteration
        self.guard_free_copy([], checks, {**env, node.loop.name: ZERO}, emit)
        self.guard_checks[id(node)] = checks

    def reduced_around(self, node: LoopNode, statements: list) -> bool:
        """Whether a loop around `node` also runs over a reduction dim of its statements (a k loop
        over staged tiles): their registers then live across it, which LLVM keeps without help."""
        for stmt in statements:
            path = self.paths[id(stmt)]
            outer = path[:next(k for k, lp in enumerate(path) if lp is node)]
            if any(lp.loop.dim in stmt.stage.reduce_dims for lp in outer):
                return True
        return False

    def is_vector_reduction(self, node: LoopNode) -> bool:
        """As on the CPU, except for reductions combined across threads (they keep a partial instead)."""
        return super().is_vector_reduction(node) and not any(id(stmt) in self.partials for stmt in node.body[0].body)

    def statement(self, stmt: StmtNode, env: dict):
        if self.predicate is not None:
            self.guarded_statement(stmt, env)
            return
        partial = self.partials.get(id(stmt))
        if partial is None:
            super().statement(stmt, env)
            return
        old = self.builder.load(partial, typ=VALUE_TYPE[stmt.stage.dtype])
        value = self.accumulate(stmt.stage.reduce_op, old, stmt.stage.expr, lambda e: self.expr(e, stmt, env))
        self.builder.store(value, partial)

    # Edge tiles: register tiles cut by a tail -------------------------------------------------
    def edge_loop(self, node: LoopNode, env: dict):
        """An unrolled or vectorized loop whose tail cuts a register tile, in an edge tile: every copy
        (every lane) is run, its statements taking effect only where it is inside the loop's limits (a
        rolled tail loop would index the tile by a variable, which moves it to local memory)."""
        name, extent = node.loop.name, node.loop.extent
        if node.loop.annotation == "unroll":
            for k in range(extent):
                with self.predicated(self.inside_limits(node, env, k)):
                    self.body(node.body, {**env, name: constant(I64, k)})
            return
        mask = self.inside_limits(node, env, list(range(extent)))
        if self.predicate is not None:
            mask = self.builder.and_(mask, self.splat(self.predicate, extent))
        for stmt in node.body:
            self.vector_statement(stmt, env, Lanes(name, extent, mask))

    def inside_limits(self, node: LoopNode, env: dict, values: int | list[int]) -> llir.Value:
        """An i1 (a vector of them, for a list of values): the loop's value `values` satisfies its
        limits, coeff * value + rest < bound, at the loop values in `env`."""
        b, inside = self.builder, None
        for lim in node.limits:
            rest = self.affine(lim.rest, env)
            if isinstance(values, list):
                rest = self.splat(rest, len(values))
                room = constant(rest.type, [lim.bound - lim.coeff * value for value in values])
            else:
                room = constant(I64, lim.bound - lim.coeff * values)
            holds = b.icmp_signed("<", rest, room)
            inside = holds if inside is None else b.and_(inside, holds)
        return inside

    def edge_tail(self, node: LoopNode) -> bool:
        """Whether this copy of the code runs a register tile's tail loop as an edge tile: its tail is
        not known to be full here."""
        return id(node) in self.edge_tails and id(node) not in self.full

    @contextlib.contextmanager
    def predicated(self, condition: llir.Value | None):
        """Statements emitted inside take effect only where `condition` (and any outer one) holds; None
        lifts every condition."""
        outer = self.predicate
        if condition is not None and outer is not None:
            condition = self.builder.and_(outer, condition)
        self.predicate = condition
        try:
            yield
        finally:
            self.predicate = outer

    def guarded_statement(self, stmt: StmtNode, env: dict):
        """A statement of an edge tile: into a register tile, computed anyway (loads that may leave
        their buffer clamped into it) and kept only where the predicate holds, by a select; otherwise
        run under a branch."""
        b, condition, stage = self.builder, self.predicate, stmt.stage
        with self.predicated(None):
            if not self.selects(stmt):
                with b.if_then(condition):
                    self.statement(stmt, env)
                return
            target = self.access(stage.name, Affine.identity(stage.dims), False, stmt, env)
            old = self.load_value(target, stage.dtype)
            new = self.stored_value(stmt, self.edge_expr(stmt), old, lambda e: self.expr(e, stmt, env))
            self.store_value(b.select(condition, new, old), target, stage.dtype)

    def masked_statement(self, stmt: StmtNode, env: dict, lanes: Lanes):
        """A vector statement whose lanes take effect only where `lanes.mask` holds: into a packed
        vector of a register tile, computed whole (as `guarded_statement`) and blended with the old one;
        otherwise lane by lane, each under a branch."""
        b, stage = self.builder, stmt.stage
        whole = Lanes(lanes.name, lanes.width)
        with self.predicated(None):
            base, step, align = self.linear_address(stage.name, Affine.identity(stage.dims), stmt, env, whole)
            if step == 1 and self.selects(stmt):
                old = self.load_value(base, stage.dtype, align, lanes.width)
                new = self.stored_value(stmt, self.edge_expr(stmt), old,
                                        lambda e: self.vector_expr(e, stmt, env, whole), lanes.width)
                self.store_value(b.select(lanes.mask, new, old), base, stage.dtype, align)
                return
            for k in range(lanes.width):
                with b.if_then(b.extract_element(lanes.mask, constant(I32, k))):
                    self.statement(stmt, {**env, lanes.name: constant(I64, k)})

    def selects(self, stmt: StmtNode) -> bool:
        """Whether an edge tile keeps a statement's result by a select: it writes a register tile (a
        buffer its thread keeps), inside it for the whole extents of its loops, and no partial sum."""
        stage = stmt.stage
        return self.is_fragment(stage.name) and id(stmt) not in self.partials \
            and inside_buffer(self.tree, stage.name, Affine.identity(stage.dims), stmt, self.paths[id(stmt)])

    def edge_expr(self, stmt: StmtNode) -> ir.Expr:
        """A statement's expression as an edge tile computes it past the tail (`clamped_outside`)."""
        if id(stmt) not in self.edge_exprs:
            self.edge_exprs[id(stmt)] = clamped_outside(self.tree, stmt, self.paths[id(stmt)])
        return self.edge_exprs[id(stmt)]

    def combine_across_threads(self, stmt: StmtNode, node: LoopNode, tid: llir.Value, env: dict):
        """Combine the threads' partials (by warp shuffles where the block is whole warps along x,
        else a tree in shared memory); thread 0 folds the total into the target."""
        b, stage = self.builder, stmt.stage
        ty, op = VALUE_TYPE[stage.dtype], REDUCE_BINARY[stage.reduce_op]
        partial = b.load(self.partials.pop(id(stmt)), typ=ty)
        if self.shuffles_combine(node):
            total = self.combine_by_shuffles(partial, stage, tid)
        else:
            total = self.combine_in_shared(partial, stage, node.loop.extent, tid)
        zeros = {loop.name: ZERO for loop in _loops([node])}
        target = self.access(stage.name, Affine.identity(stage.dims), False, stmt, {**env, **zeros})
        with b.if_then(b.icmp_signed("==", tid, ZERO)):
            self.store_value(self.binary(op, self.load_value(target, stage.dtype), total), target, stage.dtype)
        self.barrier()

    def shuffles_combine(self, node: LoopNode) -> bool:
        """Whether a thread-bound reduction combines by warp shuffles: bound to thread.x in a block of
        whole warps along x alone (every thread reaches the combine, so full-warp shuffles are safe)."""
        return node.loop.annotation == "thread.x" and self.block[1] == self.block[2] == 1 \
            and self.block[0] % WARP == 0

    def combine_by_shuffles(self, value: llir.Value, stage, tid: llir.Value) -> llir.Value:
        """The block's total of one value a thread: a butterfly within each warp, the warps' totals
        through shared memory, and a butterfly over them; every thread gets the total."""
        b = self.builder
        ty, op = value.type, REDUCE_BINARY[stage.reduce_op]
        value = self.warp_total(value, op)
        warps = self.block[0] // WARP
        if warps == 1:
            return value
        scratch = self.shared(ty, warps, f"{stage.name}.warps")
        lane = b.trunc(b.and_(tid, constant(I64, WARP - 1)), I32)
        warp = b.lshr(tid, constant(I64, WARP.bit_length() - 1))
        with b.if_then(b.icmp_signed("==", lane, constant(I32, 0))):
            b.store(value, b.gep(scratch, [warp], source_etype=ty))
        self.barrier()
        mine = b.gep(scratch, [b.zext(b.urem(lane, constant(I32, warps)), I64)], source_etype=ty)
        identity = constant(ty, IDENTITY[stage.reduce_op])
        value = b.select(b.icmp_unsigned("<", lane, constant(I32, warps)), b.load(mine, typ=ty), identity)
        return self.warp_total(value, op)

    def warp_total(self, value: llir.Value, op: str) -> llir.Value:
        """`op` over the 32 lanes' values (shfl.sync.bfly: every lane ends with the total)."""
        for offset in (16, 8, 4, 2, 1):
            value = self.binary(op, value, self.shuffle_xor(value, offset))
        return value

    def shuffle_xor(self, value: llir.Value, offset: int) -> llir.Value:
        """The value of lane (this lane XOR offset); float64 as two 32-bit halves."""
        b = self.builder
        if value.type in (F32, I32):
            kind = "f32" if value.type == F32 else "i32"
            shuffle = self.declare(f"llvm.nvvm.shfl.sync.bfly.{kind}", value.type, [I32, value.type, I32, I32])
            return b.call(shuffle, [constant(I32, 0xFFFFFFFF), value, constant(I32, offset), constant(I32, WARP - 1)])
        halves = b.bitcast(value, llir.VectorType(I32, 2))
        moved = [self.shuffle_xor(b.extract_element(halves, constant(I32, i)), offset) for i in (0, 1)]
        return b.bitcast(self.packed(moved), value.type)

    def combine_in_shared(self, value: llir.Value, stage, extent: int, tid: llir.Value) -> llir.Value:
        """A tree over the loop's threads' partials in shared memory; the total is read by every thread."""
        b = self.builder
        ty, op = value.type, REDUCE_BINARY[stage.reduce_op]
        scratch = self.shared(ty, extent, f"{stage.name}.partials")

        def at(index):
            return b.gep(scratch, [index], source_etype=ty)
        with b.if_then(b.icmp_signed("<", tid, constant(I64, extent))):
            b.store(value, at(tid))
        self.barrier()
        step = 1 << max(extent - 1, 0).bit_length()
        while step > 1:
            step //= 2
            other = b.add(tid, constant(I64, step))
            active = b.and_(b.icmp_signed("<", tid, constant(I64, step)),
                            b.icmp_signed("<", other, constant(I64, extent)))
            with b.if_then(active):
                b.store(self.binary(op, b.load(at(tid), typ=ty), b.load(at(other), typ=ty)), at(tid))
            self.barrier()
        return b.load(at(ZERO), typ=ty)

    def shared(self, ty, count: int, name: str) -> llir.Value:
        """A generic pointer to `count` elements of shared memory, aligned as `shared_alignment` says: a
        static array of its own, or (dynamic) the next aligned offset in the kernel's dynamic shared memory."""
        module, align = self.fn.module, self.shared_alignment(name)
        offset = -(-self.shared_bytes // align) * align
        self.shared_bytes = offset + count * ty.get_abi_size(_target_data())
        if self.dynamic:
            name = dynamic_shared_name(self.fn.name)
            if name not in module.globals:
                array = llir.GlobalVariable(module, llir.ArrayType(llir.IntType(8), 0), name, addrspace=3)
                array.linkage, array.align = "internal", WGMMA_ALIGN
            start = self.allocas.gep(module.globals[name], [constant(I64, offset)], source_etype=llir.IntType(8))
            return self.allocas.addrspacecast(start, llir.PointerType())
        unique = f"{self.fn.name}.{name}.{len(module.globals)}"
        variable = llir.GlobalVariable(module, llir.ArrayType(ty, count), unique, addrspace=3)
        variable.linkage = "internal"
        variable.align = align
        return self.allocas.addrspacecast(variable, llir.PointerType())

    def finish(self):
        """Return; the kernel's dynamic shared array (if any) gets its size."""
        self.settle_wgmma()
        array = self.fn.module.globals.get(dynamic_shared_name(self.fn.name))
        if array is not None:
            array.value_type = llir.ArrayType(llir.IntType(8), self.shared_bytes)
        super().finish()

    def allocate(self, plan):
        private = self.tree.thread_slices.get(plan.name)
        count = plan.size if private is None else private.size
        if private is None:
            if not self.thread_loops and self._written_by_threads(plan.name):
                self.share(plan)
                return self.shared(MEMORY_TYPE[plan.dtype], plan.size, plan.name)
            size = plan.size * ITEM_BYTES[plan.dtype]
            if size > LOCAL_LIMIT:
                raise ValueError(f"buffer {plan.name} ({size} bytes) is too large for a GPU thread's local memory; "
                                 f"place it deeper")
        buffer = self.allocas.alloca(MEMORY_TYPE[plan.dtype], size=constant(I64, count), name=plan.name)
        buffer.align = 16
        return buffer

    def share(self, plan):
        """Note a buffer placed in shared memory; an mma operand there that ldmatrix reads row by row
        is swizzled, so its reads and the copies into it are free of bank conflicts."""
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

    def within_chunks(self, plan) -> bool:
        """Whether every access of a buffer stays inside 16-byte chunks (so a swizzle keeps vectors
        whole): vectors of at most 16 bytes starting at a multiple of their width, no clamped loads."""
        for stmt, path in self.tree.statements():
            for access in accesses(stmt):
                if access.buffer != plan.name:
                    continue
                if any(ld.buffer == plan.name and ld.clamped for ld in ir.loads(stmt.stage.expr)):
                    return False
                linear = self.linear_offset(plan.name, access.index, stmt)
                coeffs, const = linear.coeffs(), linear.const
                for node in path:
                    width = node.loop.extent
                    if node.loop.annotation != "vectorize" or coeffs.get(node.loop.name) != 1:
                        continue
                    rest = math.gcd(const, *(c for name, c in coeffs.items() if name != node.loop.name))
                    if width * ITEM_BYTES[plan.dtype] > 16 or rest % width:
                        return False
        return True

    def access(self, buffer, index, clamp, stmt, env):
        """Accesses of a buffer kept per thread index this thread's slice: the thread-bound loops'
        terms drop out of the offset, so unrolled loops give constant offsets (registers). A swizzled
        buffer's offsets are permuted within each row (`Swizzle`)."""
        private = self.tree.thread_slices.get(buffer)
        swizzle = self.swizzles.get(buffer)
        if swizzle is not None and not clamp:
            offset = swizzle.apply(self.builder, self.affine(self.linear_offset(buffer, index, stmt), env))
            pointer = self.element(self.pointers[buffer], offset, self.tree.buffers[buffer].dtype)
            return self.rotated(buffer, pointer)
        if private is None:
            pointer = super().access(buffer, index, clamp, stmt, env)
            return self.rotated(buffer, pointer)
        linear = self.linear_offset(buffer, index, stmt)
        own = Affine.of({name: c for name, c in linear.terms if name not in self.thread_loops})
        offset = self.affine(own + (linear.const - private.low), env)
        return self.element(self.pointers[buffer], offset, self.tree.buffers[buffer].dtype)

    def rotated(self, buffer: str, pointer: llir.Value) -> llir.Value:
        """A pipelined buffer's pointer moved to the copy of the current iteration."""
        if buffer not in self.rotations:
            return pointer
        return self.element(pointer, self.rotations[buffer], self.tree.buffers[buffer].dtype)

    def alignment(self, buffer, index, stmt, env, lanes=None):
        """Up to 16 bytes where every term of the offset is a multiple of the lanes (so LLVM emits
        128-bit loads and stores).  Kernel parameters get more than one element only for packed
        accesses, and the runtime then checks that they are 16-byte aligned; local and shared
        buffers always are."""
        element = ITEM_BYTES[self.tree.buffers[buffer].dtype]
        if buffer in self.params and (lanes is None or not self.assume_aligned):
            return element
        linear = self.linear_offset(buffer, index, stmt)
        private = self.tree.thread_slices.get(buffer)
        skip = {lanes.name} if lanes else set()
        if private:
            skip |= set(self.thread_loops)
        known = {name: env[name].constant for name, _ in linear.terms
                 if name not in skip and isinstance(env.get(name), llir.Constant)}
        const = linear.const - (private.low if private else 0) + sum(c * known.get(name, 0) for name, c in linear.terms)
        common = math.gcd(*(c for name, c in linear.terms if name not in skip and name not in known), const)
        elements = 1
        while 2 * elements * element <= 16 and common % (2 * elements) == 0 \
                and (lanes is None or lanes.width % (2 * elements) == 0):
            elements *= 2
        if elements > 1 and buffer in self.params:
            self.aligned_params.add(buffer)
        return elements * element

    def _written_by_threads(self, buffer: str) -> bool:
        """Every non-init write of the buffer happens inside a thread-bound loop."""
        writers = [path for stmt, path in self.tree.statements() if stmt.stage.name == buffer and stmt.kind != "init"]
        return bool(writers) and all(any(thread_bound(n) for n in path) for path in writers)

    # Tensor cores -------------------------------------------------------------------
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

    def written_back(self, e: ir.Expr, accumulator: ir.Load, value: llir.Value, stmt: StmtNode, env: dict):
        """A copy tile's expression at one element: `value` (its accumulator element, from the lane's
        fragment) where it reads the accumulator, everything else (an epilogue's bias) at `env`."""
        def evaluate(sub):
            if sub == accumulator:
                return value
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
        return evaluate(e)

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
        # (ptxas serializes wgmma that a branch separates); their copy tiles guard each element instead
        whole = {tile.loops[role].loop.name for role in "mn"} if is_warpgroup(tile.instruction) else set()
        present = constant(llir.IntType(1), 1)
        for node in nodes:
            for lim in node.limits if node.loop.name not in whole else ():
                inside = b.icmp_signed("<", self.affine(lim.rest, base), constant(I64, lim.bound))
                present = b.and_(present, inside)     # a tail of whole tiles: there or not, for the whole warp
        with b.if_then(present):
            self.tile(tile, stmt, base)

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
            if inside is not None:          # a wgmma tile cut by a tail: each element stored under its guard
                for source, place, target, holds in zip(sources, places, targets, inside):
                    with self.builder.if_then(holds):
                        value = self.load_value(source, tile.dtype)
                        self.store_value(self.written_back(stage.expr, tile.a, value, stmt, place), target, stage.dtype)
                return
            values = [self.load_value(source, tile.dtype) for source in sources]
            values = [self.written_back(stage.expr, tile.a, value, stmt, env) for value, env in zip(values, places)]
            self.store_tile(values, targets, tile, stmt, base)
            return
        if is_warpgroup(tile.instruction):
            self.wgmma(tile, stmt, base, targets)
        else:
            self.mma_sync(tile, stmt, base, targets, lane)

    def inside_tails(self, tile: TensorTile, places: list[dict]) -> list[llir.Value] | None:
        """For each element of a wgmma copy tile whose m or n loop a tail cuts (the tile is computed whole:
        `analysis.tensorize`), whether the element lies inside every such tail; None where no tail cuts."""
        limits = [(node, lim) for role in "mn" for node in (tile.loops[role],) for lim in node.limits]
        if not limits or not is_warpgroup(tile.instruction):
            return None
        b = self.builder
        inside = []
        for place in places:
            holds = constant(llir.IntType(1), 1)
            for node, lim in limits:
                value = b.add(b.mul(constant(I64, lim.coeff), place[node.loop.name]), self.affine(lim.rest, place))
                holds = b.and_(holds, b.icmp_signed("<", value, constant(I64, lim.bound)))
            inside.append(holds)
        return inside

    def store_tile(self, values: list, targets: list[llir.Value], tile: TensorTile, stmt: StmtNode, base: dict):
        """Store a copy tile's elements: each thread's pairs of neighbouring columns (fragment_places)
        as one 2-element vector where the columns are adjacent in memory and the pair aligned."""
        stage, n = stmt.stage, tile.loops["n"].loop
        index = Affine.identity(stage.dims)
        moving = {tile.loops["m"].loop.name, n.name}      # set per element from the thread's place
        fixed = {k: v for k, v in base.items() if k not in moving}
        paired = not self.is_fragment(stage.name) \
            and self.linear_offset(stage.name, index, stmt).coeffs().get(n.name) == 1 \
            and self.alignment(stage.name, index, stmt, fixed, Lanes(n.name, 2)) == 2 * ITEM_BYTES[stage.dtype]
        if not paired:
            for value, target in zip(values, targets):
                self.store_value(value, target, stage.dtype)
            return
        group = VECTOR_STORE_BYTES // (2 * ITEM_BYTES[stage.dtype])
        if group > 1 and len(values) % (4 * group) == 0 and self.alignment(
                stage.name, index, stmt, fixed, Lanes(n.name, 2 * group)) == VECTOR_STORE_BYTES:
            self.store_vectors(values, targets, stage.dtype, group)
            return
        for first in range(0, len(values), 2):
            self.store_value(self.packed(values[first:first + 2]), targets[first], stage.dtype,
                             align=2 * ITEM_BYTES[stage.dtype])

    def store_vectors(self, values: list, targets: list[llir.Value], dtype: str, group: int):
        """Store a copy tile's elements G pairs a lane (16 bytes). The G lanes of a group
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
                b.store(b.bitcast(self.packed(held), vector), start, align=2 * group * ITEM_BYTES[dtype])

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

    def unary(self, op: str, x):
        """As the shared builder, but float64 exp, log, tanh and erf are refused: they would need libm."""
        if op in INLINE_F32 and element_type(x.type) == F64:
            raise ValueError(f"{op} of float64 is not supported on the GPU backend (NVPTX has no libm; "
                             f"float32 {op} is inline): compute it in float32")
        return super().unary(op, x)


@dataclass(frozen=True)
class _Pipeline:
    """A pipelined loop as the code generator runs it: its name and trip count, `stages` buffers, the
    copies issued `ahead` iterations ahead, whether a wgmma batch stays in flight into the next
    iteration (`overlap`), each pipelined buffer's size (elements of one copy), its copy nests and
    the rest of its body."""

    loop: str
    count: llir.Value
    stages: int
    ahead: int
    overlap: bool
    sizes: dict[str, int]
    copies: list
    rest: list


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


def _buffers_touched(node) -> tuple[set[str], set[str]]:
    """(buffers written, buffers read) by the statements in a node."""
    written, read = set(), set()
    for stmt, _ in walk([node]):
        if isinstance(stmt, StmtNode):
            for access in accesses(stmt):
                (written if access.write else read).add(access.buffer)
    return written, read


def _loop_nodes(body: list) -> list[LoopNode]:
    """The loop nodes in `body`, nested ones included."""
    return [current for current, _ in walk(body) if isinstance(current, LoopNode)]


def _loops(body: list):
    """The loops in `body`, nested ones included."""
    return [node.loop for node in _loop_nodes(body)]


def describe(module: GpuModule) -> str:
    """The launches of a GPU module, one line each."""
    return "\n".join(f"{k.name}: grid {k.grid}, block {k.block}" for k in module.launches)

