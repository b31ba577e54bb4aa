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

This module lowers the kernels, their loops, statements, reductions across threads, edge tiles and
shared memory, and compiles the module. Two sibling modules lower the rest, as parts of its kernel
builder (mixins): tensor-core tiles, mma.sync and wgmma (`gpu_tensor_cores`), and asynchronous
copies, cp.async and TMA, in pipelined loops (`gpu_copies`).
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
from ..analysis.gpu_target import STATIC_SHARED, capability
from ..analysis.legality import check_persistent
from ..analysis.tensorize import WARP, WARP_PARTS, SharedOperand, TensorTile, is_warpgroup, tensor_tiles
from ..analysis.tma import BulkCopy, bulk_copies
from ..ir import Affine
from ..schedule import (BLOCK_AXES, GPU_AXES, LoopNode, LoopTree, StmtNode, accesses, across_blocks, pipeline_depth,
                        pipeline_persistent, tensor_role, thread_bound, walk)
from .accumulators import run_in_registers
from .edges import clamped_outside, inside_buffer, register_tails, tail_host
# TENSOR_MAP_BYTES and WgmmaLayout are not used here: runtime.gpu and tests import them from this module
from .gpu_copies import (TENSOR_MAP_BYTES, TENSOR_MAPS, AsyncCopyLowering, buffers_touched, grouped_grid,  # noqa: F401
                         producer_warps)
from .gpu_tensor_cores import (WGMMA_ALIGN, WGMMA_ARCHS, Swizzle, TensorCoreLowering, WgmmaLayout,  # noqa: F401
                               holds_wgmma)
from .llvm import (EXP_LOW, F32, F64, I16, I32, I64, IDENTITY, INLINE_F32, ITEM_BYTES, LOG2_E, MEMORY_TYPE,
                   REDUCE_BINARY, VALUE_TYPE, ZERO, FunctionBuilder, Lanes, constant, constant_like, element_type, hoisted_tail_checks,
                   kernel_params, lane_count, size_variable)

TRIPLE = "nvptx64-nvidia-cuda"
DATA_LAYOUT = "e-p:64:64:64-i64:64-i128:128-v16:16-v32:32-n16:32:64"
SREG = {"block": "ctaid", "thread": "tid"}
LOCAL_LIMIT = 16 * 1024
# a tensor-core tile's results are stored this many bytes a lane where the lanes of a group can trade
# pairs of columns into whole vectors (`store_vectors`; 4: pairs as the fragment holds them). Read here,
# as each kernel's builder starts, so that setting it on this module (bench.gpu_rules_variants) applies
VECTOR_STORE_BYTES = 16
# a kernel that only sets a whole buffer to its reduction's identity (split-k's result zeroed before its parts are
# added into it) is a flat fill, each of these threads a block storing one 16-byte vector (`whole_fill`); as the
# init nest of the parts' tiles it stored 777-wide rows a word at a time (H100, session 29, ncu: 5.7 us of
# 1000x1500x777's 104)
FILL_THREADS = 256
VECTOR_ATOMIC_ARCHS = ("sm_90", "sm_90a")      # red.global.add.v2/v4.f32 (PTX 8.1)
# griddepcontrol (PTX 7.8): the kernel after a whole fill (`whole_fill`: split-k's zeroed result) is launched
# programmatically (`gpu_launch`): the fill lets it start as soon as all the fill's blocks have, and it waits for
# the fill at its start, so its launch and set-up overlap the fill (H100, session 31, --knob programmatic_launch,
# kernels' us: 1000x1500x777 92.1 -> 86.7, 333x444x555 30.0 -> 26.7, 200x300x500 20.8 -> 16.8, 512^3 23.3 -> 22.6).
# Every kernel after a module's first so launched, each letting the next start at its own start, lost where the
# kernel before ran long: its waiting successor's blocks took the SMs (attention 4096x64 0.267 -> 0.616 ms,
# 2048x128 0.140 -> 0.355 ms, conv 3x3 f32 8x64x56x56 1.00 -> 0.80x torch)
PROGRAMMATIC_ARCHS = ("sm_90", "sm_90a")
PREDICATED_TAILS = True        # (`predicated_walk`)
LOG2_E_LOW = 1.925963e-8       # log2 e less its float32 rounding
EXP_OVER = 89.0                # exp of float32 past this is inf (88.72 is the largest finite's log)
VECTOR_ATOMIC_PTX = "+ptx81"


@dataclass
class Launch:
    """One kernel of the module: its name and launch dimensions (x, y, z); a grid extent that is an
    `ir.Size` is worked out at launch from the size of its dynamic dim (a parameter of the kernel)."""

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared: int = 0      # bytes of dynamic shared memory it is launched with (0: static only)
    programmatic: bool = False   # started while the kernel before it ends; its threads wait for it first


@dataclass
class GpuModule:
    """PTX text, the kernels to launch in order, the buffer name of each parameter (then
    `size_variable(dim)` for each dynamic dim's size, a 64-bit integer parameter), and the parameters
    whose packed accesses assume 16-byte aligned memory."""

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
    Shared buffers are static arrays while every kernel needs at most 48 KiB (unless `dynamic_shared`, or a
    kernel has pipelined copies);
    otherwise the module is built again with each kernel's shared buffers at offsets in dynamic shared
    memory, whose size its Launch carries (the runtime opts the kernel in to that much)."""
    tiles = tensor_tiles(tree)
    copies = bulk_copies(tree, tiles)
    # pipelined tiles (a contraction template's) take about 48 KiB and more: built for dynamic shared memory at once
    dynamic_shared = dynamic_shared or any(pipeline_depth(loop.annotation) for loop in _loops(tree.root))
    module, launches, params, aligned = _module(tree, tiles, copies, aligned_params, dynamic_shared, arch)
    if not dynamic_shared and any(launch.dynamic_shared for launch in launches):
        module, launches, params, aligned = _module(tree, tiles, copies, aligned_params, True, arch)
    text = str(module)      # printing costs about what building does: a build that only sized shared memory isn't
    ptx = _compile(text, _arch_for(tiles, arch), VECTOR_ATOMIC_PTX if "red.global.add.v" in text else "")
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
            dynamic: bool, arch: str):
    """(LLVM module, launches, params, aligned params); a launch's dynamic_shared is the shared
    memory its kernel needs where that exceeds STATIC_SHARED (or, `dynamic`, all it needs)."""
    module = llir.Module(name="looptool_gpu")
    module.triple = TRIPLE
    module.data_layout = DATA_LAYOUT
    pointers = kernel_params(tree) + ([TENSOR_MAPS] if copies else [])
    sizes = [size_variable(dim) for dim, _ in tree.program.dynamic]       # then each dynamic dim's size (i64)
    params = pointers + sizes
    launches, aligned = [], set()
    kernels = kernel_nodes(tree.root)
    fills = [whole_fill(nodes, tree) for nodes in kernels]
    for index, nodes in enumerate(kernels):
        name = f"looptool_k{index}"
        kind = llir.FunctionType(llir.VoidType(), [llir.PointerType()] * len(pointers) + [I64] * len(sizes))
        fn = llir.Function(module, kind, name=name)
        fn.calling_convention = "ptx_kernel"
        for arg, buffer in zip(fn.args, pointers):
            arg.name = buffer
            if buffer in tree.buffers and tree.buffers[buffer].kind == "input":
                arg.add_attribute("noalias")   # written buffers are shared between threads: not noalias
        for arg, (dim, _) in zip(fn.args[len(pointers):], tree.program.dynamic):
            arg.name = f"size.{dim}"
        filled = fills[index]
        programmatic = arch in PROGRAMMATIC_ARCHS and index > 0 and fills[index - 1] is not None
        releases = arch in PROGRAMMATIC_ARCHS and filled is not None and index < len(kernels) - 1
        if filled is not None:
            launches.append(_fill_kernel(tree, fn, dict(zip(pointers, fn.args)), filled, aligned_params, arch,
                                         programmatic, releases))
            aligned |= {filled} if aligned_params else set()
            _declare_block_size(module, fn, launches[-1].block)
            continue
        grid, block = launch_dims(nodes)
        producer = producer_warps(nodes, tree, arch, block)
        for node, path in walk(nodes):
            if isinstance(node, LoopNode) and pipeline_persistent(node.loop.annotation):
                check_persistent(node, path)
        builder = _GpuBuilder(tree, fn, dict(zip(pointers, fn.args)), aligned_params, tiles, copies, block, dynamic,
                              persistent_blocks(nodes), grouped_grid(nodes, grid), producer, arch)
        _programmatic_start(builder, programmatic, releases)
        builder.body(nodes, dict(zip(sizes, fn.args[len(pointers):])))
        builder.finish()
        aligned |= builder.aligned_params
        needed = builder.shared_bytes if dynamic or builder.shared_bytes > STATIC_SHARED else 0
        launches.append(Launch(name, grid, (block[0], block[1] + producer, block[2]), needed, programmatic))
        _declare_block_size(module, fn, launches[-1].block)
    return module, launches, params, tuple(sorted(aligned))


def whole_fill(nodes: list, tree: LoopTree) -> str | None:
    """The buffer a kernel's nodes only set to its reduction's identity, all of it (the init nest of a stage at
    the top level), where that buffer is a dense array of fixed size in global memory; else None."""
    statements = [node for node, _ in walk(nodes) if isinstance(node, StmtNode)]
    if len(statements) != 1 or statements[0].kind != "init" or tree.program.dynamic:
        return None
    plan = tree.buffers[statements[0].stage.name]
    dense = not plan.offsets and plan.block is None and plan.size == math.prod(plan.shape)
    return plan.name if plan.kind in ("temp", "output") and dense and plan.size else None


def _programmatic_start(builder: "_GpuBuilder", waits: bool, releases: bool):
    """A kernel's first instructions: where it is launched programmatically (`waits`), wait for the kernel
    before it to finish and its writes to be seen; where the next one is (`releases`), let it start."""
    if waits:
        builder.inline("griddepcontrol.wait;")
    if releases:
        builder.inline("griddepcontrol.launch_dependents;")


def _fill_kernel(tree: LoopTree, fn: llir.Function, pointers: dict, name: str, aligned: bool, arch: str,
                 programmatic: bool, releases: bool) -> "Launch":
    """`fn` setting buffer `name` to its stage's reduction identity, each thread one 16-byte vector (one element
    where the buffer may not be `aligned`; the last thread the elements past the whole vectors), FILL_THREADS
    threads a block, launched `programmatic`ally or not and releasing the next kernel or not
    (`_programmatic_start`); its Launch."""
    stage, plan = tree.program.stage(name), tree.buffers[name]
    lanes = 16 // ITEM_BYTES[plan.dtype] if aligned else 1
    vectors = -(-plan.size // lanes)
    builder = _GpuBuilder(tree, fn, pointers, aligned, {}, {}, (FILL_THREADS, 1, 1), arch=arch)
    _programmatic_start(builder, programmatic, releases)
    b = builder.builder
    thread = b.add(b.mul(b.zext(builder.special_register("ctaid.x"), I64), constant(I64, FILL_THREADS)),
                   b.zext(builder.special_register("tid.x"), I64))
    first = b.mul(thread, constant(I64, lanes))
    identity = constant(VALUE_TYPE[plan.dtype], IDENTITY[stage.reduce_op])
    whole = plan.size // lanes * lanes
    with b.if_else(b.icmp_signed("<", first, constant(I64, whole))) as (vector, rest):
        with vector:
            splat = constant(llir.VectorType(VALUE_TYPE[plan.dtype], lanes), [IDENTITY[stage.reduce_op]] * lanes)
            builder.store_value(splat, builder.element(pointers[name], first, plan.dtype), plan.dtype,
                                align=lanes * ITEM_BYTES[plan.dtype])
        with rest, b.if_then(b.icmp_signed("==", first, constant(I64, whole))):
            for lane in range(plan.size - whole):
                builder.store_value(identity, builder.element(pointers[name], constant(I64, whole + lane), plan.dtype),
                                    plan.dtype)
    builder.finish()
    return Launch(fn.name, (-(-vectors // FILL_THREADS), 1, 1), (FILL_THREADS, 1, 1), 0, programmatic)


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
    """(grid, block) of the kernel that runs these top-level nodes (a producer warpgroup, `producer_warps`,
    is launched besides the block)."""
    extents = {axis: 1 for axis in GPU_AXES}
    for current in _loop_nodes(nodes):
        loop = current.loop
        if loop.annotation in GPU_AXES:
            extents[loop.annotation] = _widest(extents[loop.annotation], loop.extent * _threads_per_value(current)
                                               if not isinstance(loop.extent, ir.Size) else loop.extent, loop)
        if tensor_role(loop):
            extents["thread.x"] = WARP         # the lanes of the warps that run its tiles
            if is_warpgroup(tensor_role(loop)[0]):
                extents["thread.y"] = max(extents["thread.y"], 4)
    grid = tuple(extents[f"block.{a}"] for a in "xyz")
    persistent = persistent_blocks(nodes)
    if persistent:
        grid = (min(persistent, grid[0] * grid[1] * grid[2]), 1, 1)
    block = tuple(extents[f"thread.{a}"] for a in "xyz")
    if block[0] * block[1] * block[2] > 1024:
        raise ValueError(f"a GPU block of {block[0]}x{block[1]}x{block[2]} threads exceeds the 1024-thread limit; "
                         f"split the thread-bound loops")
    return grid, block


def persistent_blocks(nodes: list) -> int:
    """The blocks of a persistent kernel's grid (its pipelined loop's `persistent`), 0 for other kernels."""
    return max((pipeline_persistent(current.loop.annotation) for current in _loop_nodes(nodes)), default=0)


def _widest(extent: int, other: int, loop) -> int:
    """The launch extent along an axis that two loops bound to it need: the larger, where both are known
    (an `ir.Size`, sized at launch, only with loops of one iteration or of the same run-time extent)."""
    if not isinstance(extent, ir.Size) and not isinstance(other, ir.Size):
        return max(extent, other)
    if extent == 1 or other == 1 or str(extent) == str(other):
        return other if extent == 1 else extent
    raise NotImplementedError(f"loop '{loop.name}' runs {other} iterations on {loop.annotation}, where another loop "
                              f"of the kernel runs {extent}: a GPU axis bound to a dynamic dim takes loops of that "
                              f"extent only")


def _threads_per_value(node: LoopNode) -> int:
    """Threads along its axis that one value of a GPU-bound loop takes: 4 for a loop over
    warpgroups, else 1."""
    return 4 if counts_warpgroups(node) else 1


def counts_warpgroups(node: LoopNode) -> bool:
    """Whether a loop bound to thread.y runs over warpgroups (it holds wgmma tiles): its value is
    then thread.y / 4, each warpgroup being 4 warps of consecutive thread.y."""
    return node.loop.annotation == "thread.y" and holds_wgmma(node.body)


@functools.cache
def _target_data() -> llvm.TargetData:
    """NVPTX's data layout, which sizes shared buffers' elements."""
    return llvm.create_target_data(DATA_LAYOUT)


# LLVM's optimization pipeline level and the NVPTX back end's: -O2 and 2 took half of -O3's time and made kernels as
# fast (H100, session 32, scratch timing, PTX generation s / kernels x torch at 3,3 -> 2,2: f32 1000x1500x777
# 1.59 / 0.975 -> 0.84 / 0.987, f32 4096^3 1.06 / 1.003 -> 0.41 / 1.003, attention 2048x128 1.72 / 0.775 -> 0.85 /
# 0.782, bf16 4096^3 0.83 / 0.990 -> 0.49 / 0.996, softmax 8192x1000 1.063 -> 1.076; -O1 made convolutions 0.35 ->
# 0.24x)
LLVM_SPEED_LEVEL = 2
LLVM_CODEGEN_OPT = 2


def _compile(text: str, arch: str, features: str = "") -> str:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    machine = llvm.Target.from_triple(TRIPLE).create_target_machine(cpu=arch, features=features, opt=LLVM_CODEGEN_OPT)
    module = llvm.parse_assembly(text)
    module.verify()
    options = llvm.create_pipeline_tuning_options(speed_level=LLVM_SPEED_LEVEL)
    builder = llvm.create_pass_builder(machine, options)
    builder.getModulePassManager().run(module, builder)
    return machine.emit_assembly(module)


LLVM_UNROLL_FROM = 16       # unrolled loops this long are left to LLVM's unroll (`_GpuBuilder.llvm_unrolls`)


class _GpuBuilder(TensorCoreLowering, AsyncCopyLowering, FunctionBuilder):
    """The CPU loop-tree walker with GPU-bound loops read from special registers; tensor-core tiles
    (`TensorCoreLowering`) and asynchronous copies (`AsyncCopyLowering`) come from their modules."""

    def __init__(self, tree: LoopTree, fn: llir.Function, pointers: dict, aligned_params: bool,
                 tiles: dict[int, TensorTile], copies: dict[int, BulkCopy], block: tuple[int, int, int],
                 dynamic: bool = False, persistent: int = 0, grouped: tuple[int, int, int] | None = None,
                 producer: int = 0, arch: str = "sm_90"):
        super().__init__(tree, fn, pointers, threads=1)
        self.arch = arch
        self.vector_atomics = arch in VECTOR_ATOMIC_ARCHS  # float32 atomic adds of 2 or 4 lanes (`add_atomically`)
        self.producer = producer                           # warps of a producer warpgroup after the block's (`produce`)
        self.producing = False                             # ... while its code is built
        self.producer_exited = False                       # ... past where it left: barriers count the others
        self.added_atomically = {id(stmt) for stmt, path in tree.statements() if across_blocks(stmt, path)}
        self.block = block                                 # the warps computing (a producer warpgroup launched besides)
        self.persistent_blocks = persistent                # a persistent kernel's grid (`persistent_tiles`)
        self.persisted = None                              # its pipeline and tiles, while its tiles are built
        self.grouped_grid = grouped                        # a grid whose blocks take tiles in groups (`block_index`)
        self.grouped_values: dict[str, llir.Value] = {}
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
        self.vector_store_bytes = VECTOR_STORE_BYTES   # a copy tile's store width (`store_tile`)
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
        walks = {id(node) for node, path in tree.walk()
                 if isinstance(node, LoopNode) and predicated_walk(node, path) and id(node) not in whole}
        self.edge_tails |= walks                       # run as edge tiles, each testing its own tail
        self.hoisted = hoisted_tail_checks(tree, functools.partial(tail_host, whole, self.edge_tails, skip=walks))
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
        written, read = buffers_touched(node)
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
        if self.producer_exited:
            self.inline(f"bar.sync 1, {math.prod(self.block)};")
            return
        self.builder.call(self.declare("llvm.nvvm.barrier0", llir.VoidType(), []), [])

    def inline(self, ptx: str, operands: list = ()):
        """An inline PTX instruction with 32-bit ('r') and 64-bit ('l') operands and no result, kept in
        place (a side effect that touches memory)."""
        constraints = ",".join(["l" if value.type == I64 else "r" for value in operands] + ["~{memory}"])
        self.builder.asm(llir.FunctionType(llir.VoidType(), [value.type for value in operands]), ptx, constraints,
                         list(operands), side_effect=True)

    def counted_loop(self, start: llir.Value, end: llir.Value, emit_body, name: str, rolled: bool = False,
                     unroll_full: bool = False):
        """A loop whose every iteration ends with its wgmma instructions done."""
        def body(i):
            emit_body(i)
            if not self.wgmma_overlap:
                self.settle_wgmma()
        super().counted_loop(start, end, body, name, rolled, unroll_full)

    def llvm_unrolls(self, node: LoopNode) -> bool:
        """At least LLVM_UNROLL_FROM iterations, no wgmma tile inside, and no buffer a thread keeps in
        registers indexed by the loop (a register tile's k steps: their shared-memory reads move with k,
        the accumulators do not): LLVM's unroll makes the same code (the same PTX for float32 register
        tiles) from one copy of the body, where building 32 copies in Python took half the kernel's
        generation time."""
        if node.loop.extent < LLVM_UNROLL_FROM or holds_wgmma(node.body):
            return False
        name = node.loop.name
        for stmt, _ in walk(node.body):
            if not isinstance(stmt, StmtNode):
                continue
            for access in accesses(stmt):
                if self.is_fragment(access.buffer) and any(
                        name == v for ix in access.index for v, _ in ix.substitute(stmt.index).terms):
                    return False
        return True

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
        if axis in BLOCK_AXES and self.persistent_blocks and node.loop.name not in env:
            self.persistent_tiles(node, env, self.persistent_blocks)
            return
        kind, dim = axis.split(".")
        if kind == "block":
            self.allocate_placed(node)
        if axis in BLOCK_AXES and node.loop.name in env:        # a persistent kernel's tile (`persistent_tiles`)
            self.close_body = False
            self.loop_body(node, env)
            return
        value = self.block_index(axis) if kind == "block" else \
            self.builder.zext(self.special_register(f"{SREG[kind]}.{dim}"), I64)
        if counts_warpgroups(node):
            value = self.builder.lshr(value, constant(I64, 2))
        inside = {**env, node.loop.name: value}
        nested = bool(self.thread_loops)
        combined = self.combined_reductions(node) if kind == "thread" and (not nested or self.in_warps(node)) else []
        for stmt in combined:
            ty = VALUE_TYPE[stmt.stage.dtype]
            self.partials[id(stmt)] = self.allocas.alloca(ty)
            self.builder.store(constant(ty, IDENTITY[stmt.stage.reduce_op]), self.partials[id(stmt)])
        if kind == "thread":
            self.thread_loops.append(node.loop.name)
            self.allocate_placed(node)         # an iteration of a thread's own: its buffers are the thread's
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
        return kind == "thread" and holds_wgmma(node.body) and isinstance(count, llir.Constant) \
            and count.constant * _threads_per_value(node) == self.block["xyz".index(axis)]

    def shared_alignment(self, name: str) -> int:
        """Bytes a shared buffer starts on: 16, or WGMMA_ALIGN for a wgmma operand."""
        return WGMMA_ALIGN if name in self.wgmma_operands else 16

    def special_register(self, name: str) -> llir.Value:
        """The 32-bit PTX special register `name` ('tid.x', 'ctaid.y', ...) read here."""
        return self.builder.call(self.declare(f"llvm.nvvm.read.ptx.sreg.{name}", I32, []), [])

    def bfloat16_bits(self, value: llir.Value) -> llir.Value:
        """float32 values -> bfloat16 bits by the hardware's round to nearest even (sm_80 on): two lanes an
        instruction (`cvt.rn.bf16x2.f32`), an odd last lane alone; a NaN becomes the canonical NaN. Rounded by
        integer arithmetic before sm_80 (and on the CPU: `FunctionBuilder.bfloat16_bits`), 9 instructions a
        value: a 128 x 256 wgmma tile's write-back took 1152 of them a thread."""
        if capability(self.arch) < 80:
            return super().bfloat16_bits(value)
        b, width = self.builder, lane_count(value.type)
        lanes = [value] if width is None else [b.extract_element(value, constant(I32, k)) for k in range(width)]
        pair, single = llir.FunctionType(I32, [F32, F32]), llir.FunctionType(I16, [F32])
        words = [b.asm(pair, "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f", [high, low], side_effect=False)
                 for low, high in zip(lanes[0::2], lanes[1::2])]
        last = [b.asm(single, "cvt.rn.bf16.f32 $0, $1;", "=h,f", [lanes[-1]], side_effect=False)] if len(lanes) % 2 else []
        if width is None:
            return last[0]
        halves = [half for word in words
                  for half in (b.trunc(word, I16), b.trunc(b.lshr(word, constant(I32, 16)), I16))] + last
        bits = llir.Constant(llir.VectorType(I16, width), None)
        for k, half in enumerate(halves):
            bits = b.insert_element(bits, half, constant(I32, k))
        return bits

    def shared_address(self, pointer: llir.Value) -> llir.Value:
        """A generic pointer into shared memory as a 32-bit shared-space address."""
        return self.builder.ptrtoint(self.builder.addrspacecast(pointer, llir.PointerType(addrspace=3)), I32)

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
        elif id(stmt) in self.added_atomically:
            self.add_atomically(stmt, env, lanes)
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
        if id(stmt) in self.added_atomically:
            self.add_atomically(stmt, env)
            return
        partial = self.partials.get(id(stmt))
        if partial is None:
            if self.copied_asynchronously(stmt) and self.copy_elements(stmt):
                self.copy_element(stmt, env)
            else:
                super().statement(stmt, env)
            return
        old = self.builder.load(partial, typ=VALUE_TYPE[stmt.stage.dtype])
        value = self.accumulate(stmt.stage.reduce_op, old, stmt.stage.expr, lambda e: self.expr(e, stmt, env))
        self.builder.store(value, partial)

    def add_atomically(self, stmt: StmtNode, env: dict, lanes: Lanes | None = None):
        """An update of a sum whose reduction loop is bound to blocks (`across_blocks`): its term added into
        the result in memory by an atomic add; a vector of float32 lanes at consecutive addresses by the
        widest `red.global.add.v4/v2.f32` its alignment allows (sm_90), other lanes one by one."""
        b, stage = self.builder, stmt.stage
        if lanes is None:
            self.add_element(stmt, env, self.expr(stage.expr, stmt, env))
            return
        value = self.vector_expr(stage.expr, stmt, env, lanes)
        base, step, align = self.linear_address(stage.name, Affine.identity(stage.dims), stmt, env, lanes)
        width = min(4, align // 4) if self.vector_atomics and step == 1 and stage.dtype == "float32" else 1
        width = width if lanes.width % width == 0 else 1
        for first in range(0, lanes.width, width):
            terms = [b.extract_element(value, constant(I32, first + k)) for k in range(width)]
            if width > 1:
                self.add_vector(self.element(base, constant(I64, first), stage.dtype), terms)
            else:
                self.add_element(stmt, {**env, lanes.name: constant(I64, first)}, terms[0])

    def add_element(self, stmt: StmtNode, env: dict, term: llir.Value):
        """`term` added into the element of the statement's result at `env` by one atomic add."""
        target = self.access(stmt.stage.name, Affine.identity(stmt.stage.dims), False, stmt, env)
        self.builder.atomic_rmw("fadd", target, term, "monotonic")

    def add_vector(self, pointer: llir.Value, terms: list):
        """float32 `terms` added into consecutive elements from `pointer` (aligned to all of them) by one
        `red.global.add.v2/v4.f32`."""
        b = self.builder
        address = b.addrspacecast(pointer, llir.PointerType(addrspace=1))
        operands = "{" + ", ".join(f"${k + 1}" for k in range(len(terms))) + "}"
        b.asm(llir.FunctionType(llir.VoidType(), [address.type] + [F32] * len(terms)),
              f"red.global.add.v{len(terms)}.f32 [$0], {operands};",
              ",".join(["l"] + ["f"] * len(terms) + ["~{memory}"]), [address, *terms], side_effect=True)

    # Edge tiles: register tiles cut by a tail -------------------------------------------------
    def edge_loop(self, node: LoopNode, env: dict):
        """An unrolled or vectorized loop whose tail cuts a register tile, or a `predicated_walk`, in an edge
        tile: every copy (every lane) is run, its statements taking effect only where it is inside the loop's
        limits (a rolled tail loop would index the tile by a variable, which moves it to local memory)."""
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
                rooms = [self.room(lim, value, env) for value in values]
                room = constant(llir.VectorType(I64, len(values)), [r.constant for r in rooms]) \
                    if all(isinstance(r, llir.Constant) for r in rooms) else self.packed(rooms)
                rest = self.splat(rest, len(values))
            else:
                room = self.room(lim, values, env)
            holds = b.icmp_signed("<", rest, room)
            inside = holds if inside is None else b.and_(inside, holds)
        return inside

    def room(self, lim, value: int, env: dict) -> llir.Value:
        """bound - coeff * value of a tail: a constant, or for a bound set at run time an i64 of the size
        the kernel takes."""
        if not isinstance(lim.bound, ir.Size):
            return constant(I64, lim.bound - lim.coeff * value)
        return self.builder.sub(self.extent(lim.bound, env), constant(I64, lim.coeff * value))

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
        """A statement of an edge tile or a `predicated_walk`: into a register tile or a reduction's partial
        combined across threads, computed anyway (loads that may leave their buffer clamped into it) and kept
        only where the predicate holds, by a select; otherwise run under a branch."""
        b, condition, stage = self.builder, self.predicate, stmt.stage
        partial = self.partials.get(id(stmt))
        with self.predicated(None):
            if partial is not None:        # a term of a reduction combined across threads
                old = b.load(partial, typ=VALUE_TYPE[stage.dtype])
                new = self.accumulate(stage.reduce_op, old, self.edge_expr(stmt), lambda e: self.expr(e, stmt, env))
                b.store(b.select(condition, new, old), partial)
                return
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
        zeros = {loop.name: ZERO for loop in _loops([node])}
        target = self.access(stage.name, Affine.identity(stage.dims), False, stmt, {**env, **zeros})
        if self.thread_loops:          # a warp a row (`in_warps`): each lane folds the total into its own copy
            total = self.warp_total(partial, op, self.block[0])
            self.store_value(self.binary(op, self.load_value(target, stage.dtype), total), target, stage.dtype)
            return
        if self.shuffles_combine(node):
            total = self.combine_by_shuffles(partial, stage, tid)
        else:
            total = self.combine_in_shared(partial, stage, node.loop.extent, tid)
        with b.if_then(b.icmp_signed("==", tid, ZERO)):
            self.store_value(self.binary(op, self.load_value(target, stage.dtype), total), target, stage.dtype)
        self.barrier()

    def in_warps(self, node: LoopNode) -> bool:
        """Whether a thread.x loop inside other thread-bound loops runs in blocks a warp or a power-of-two part of
        one wide, so a reduction bound to it combines within those lanes of a warp (the legality check's
        `_combined_in_warps`)."""
        return node.loop.annotation == "thread.x" and self.block[0] in WARP_PARTS

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

    def warp_total(self, value: llir.Value, op: str, lanes: int = WARP) -> llir.Value:
        """`op` over the values of each run of `lanes` lanes of a warp (a power of two: a block that many threads
        wide along x, whose rows of threads a warp holds whole), by shfl.sync.bfly: every lane ends with its
        run's total. Below a warp, each run's shuffles name only its own lanes, as a tail of rows may leave the
        warp's other runs out."""
        mask = None if lanes == WARP else self.lanes_mask(lanes)
        offset = lanes // 2
        while offset:
            value = self.binary(op, value, self.shuffle_xor(value, offset, mask, lanes))
            offset //= 2
        return value

    def lanes_mask(self, lanes: int) -> llir.Value:
        """The mask of this thread's run of `lanes` lanes in its warp: the run of its row of threads (tid.y and
        tid.z), `WARP // lanes` rows a warp."""
        b = self.builder
        row = self.special_register("tid.y")
        if self.block[2] > 1:
            row = b.add(row, b.mul(self.special_register("tid.z"), constant(I32, self.block[1])))
        first = b.mul(b.urem(row, constant(I32, WARP // lanes)), constant(I32, lanes))
        return b.shl(constant(I32, (1 << lanes) - 1), first)

    def shuffle_xor(self, value: llir.Value, offset: int, mask: llir.Value | None = None, lanes: int = WARP) -> llir.Value:
        """The value of lane (this lane XOR offset) among the `mask` lanes (default: the whole warp), in runs of
        `lanes` lanes; float64 as two 32-bit halves."""
        b = self.builder
        mask = constant(I32, 0xFFFFFFFF) if mask is None else mask
        if value.type in (F32, I32):
            kind = "f32" if value.type == F32 else "i32"
            shuffle = self.declare(f"llvm.nvvm.shfl.sync.bfly.{kind}", value.type, [I32, value.type, I32, I32])
            runs = (WARP - lanes) << 8 | (WARP - 1)           # the runs of lanes, and the highest lane
            return b.call(shuffle, [mask, value, constant(I32, offset), constant(I32, runs)])
        halves = b.bitcast(value, llir.VectorType(I32, 2))
        moved = [self.shuffle_xor(b.extract_element(halves, constant(I32, i)), offset, mask, lanes) for i in (0, 1)]
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

    def exp_f32(self, x: llir.Value) -> llir.Value:
        """As the shared builder's, without its tests of the range: x held to [EXP_LOW, EXP_OVER] gives 0 below
        it and inf above it by itself, and NaN stays NaN through the held value and `exp_core`."""
        held = self.binary("minimum", self.binary("maximum", x, constant_like(x.type, EXP_LOW)),
                           constant_like(x.type, EXP_OVER))
        return self.exp_core(held, halves=True)

    def exp_core(self, x: llir.Value, halves: bool) -> llir.Value:
        """As the shared builder's, but 2**f by the hardware's ex2.approx for x = (n + f) ln 2, f in [-1/2, 1/2]
        (log2 e in two parts, by fused multiply-adds; relative error about 2**-22), and n converted by PTX's
        cvt (a NaN gives 0, not LLVM's poison): a dozen instructions fewer than the polynomial, which on short rows
        (softmax 65536x48) bounded the kernel's pace."""
        b, ty = self.builder, x.type

        def c(v):
            return constant_like(ty, v)
        n = b.call(self.intrinsic("llvm.rint", ty, 1), [b.fmul(x, c(LOG2_E))])
        f = self.fma(x, c(LOG2_E_LOW), self.fma(x, c(LOG2_E), b.fneg(n)))
        ex2 = self.declare("llvm.nvvm.ex2.approx.ftz.f", F32, [F32])
        to_int = self.declare("llvm.nvvm.f2i.rz", I32, [F32])
        y, whole = self.lane_by_lane(ex2, f, F32), self.lane_by_lane(to_int, n, I32)
        return self.times_power_of_two(y, whole, halves)

    def binary(self, op: str, x: llir.Value, y: llir.Value) -> llir.Value:
        """As the shared builder's, but x / y is x times y's reciprocal: a row's divisions by its one total
        share one reciprocal (LLVM's `arcp` alone makes one only where two divisions meet in a block)."""
        if op == "div":
            return super().binary("mul", x, super().binary("div", constant_like(x.type, 1.0), y))
        return super().binary(op, x, y)

    def unary(self, op: str, x):
        """As the shared builder, but float64 exp, log, tanh and erf are refused: they would need libm."""
        if op in INLINE_F32 and element_type(x.type) == F64:
            raise ValueError(f"{op} of float64 is not supported on the GPU backend (NVPTX has no libm; "
                             f"float32 {op} is inline): compute it in float32")
        return super().unary(op, x)


def predicated_walk(node: LoopNode, path: list[LoopNode]) -> bool:
    """Whether a loop is a thread's short unrolled walk with a tail (its part of a short row: shorter than
    LLVM_UNROLL_FROM, in thread-bound loops with only unrolled ones between and inside), which always runs as an
    edge tile (`_GpuBuilder.edge_loop`: every copy predicated), its tail not tested at a loop around it
    (`tail_host`'s `skip`): that test split a warp's lanes between a copy free of it and one with it (rows of
    48: lanes 0-15 two elements, 16-31 one), and the warp ran both, the tail a rolled loop of one load at a time."""
    bound = [k for k, n in enumerate(path) if thread_bound(n)]
    return PREDICATED_TAILS and node.loop.annotation == "unroll" and bool(node.limits) \
        and node.loop.extent < LLVM_UNROLL_FROM and bool(bound) \
        and all(n.loop.annotation == "unroll" for n in path[bound[-1] + 1:] + _loop_nodes(node.body))


def _loop_nodes(body: list) -> list[LoopNode]:
    """The loop nodes in `body`, nested ones included."""
    return [current for current, _ in walk(body) if isinstance(current, LoopNode)]


def _loops(body: list):
    """The loops in `body`, nested ones included."""
    return [node.loop for node in _loop_nodes(body)]


def describe(module: GpuModule) -> str:
    """The launches of a GPU module, one line each."""
    return "\n".join(f"{k.name}: grid {k.grid}, block {k.block}" for k in module.launches)

