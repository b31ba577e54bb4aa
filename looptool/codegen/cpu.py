"""LLVM CPU backend: a loop tree becomes a native kernel for the host.

The kernel is `void kernel(ptr buf0, ptr buf1, ...)`, one noalias pointer per
input, runtime-made temporary and output buffer (in `CpuKernelSource.params`
order).  Parallel loops are outlined and run on the thread pool (threadpool.py); the C entry point
allocates the temporaries itself.  `HostTarget` is the JIT target: this CPU, or the one `LOOPTOOL_CPU` names.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite import ir as llir

from .. import ir
from ..analysis import target as target_model
from ..autoschedule.model import WORK_PER_THREAD
from ..schedule import LoopNode, LoopTree, StmtNode, walk
from .accumulators import run_in_registers
from .llvm import I1, I32, I64, ITEM_BYTES, PTR, ZERO, FunctionBuilder, constant, kernel_params, size_variable
from .threadpool import declare_parallel_for


@dataclass
class CpuKernelSource:
    """The generated module and the buffer name of each kernel parameter.

    `kernel(params...)` takes every buffer; the C entry `int <entry>(inputs..., output)`
    allocates the temporaries itself and returns 0 (or 1 when out of memory)."""

    module: llir.Module
    params: list[str]
    entry: str
    entry_params: list[str]


def generate(tree: LoopTree, triple: str, threads: int, entry: str = "looptool_kernel") -> CpuKernelSource:
    """Build the LLVM module for a loop tree; parallel loops split their range over `threads`."""
    module = llir.Module(name="looptool")
    module.triple = triple
    params = kernel_params(tree)
    dims = [dim for dim, _ in tree.program.dynamic]
    fn = llir.Function(module, llir.FunctionType(llir.VoidType(), [PTR] * len(params) + [I64] * len(dims)),
                       name="kernel")
    for arg, name in zip(fn.args, params):
        arg.name = name
        arg.add_attribute("noalias")
    sizes = {size_variable(dim): arg for dim, arg in zip(dims, fn.args[len(params):])}
    for dim, arg in zip(dims, fn.args[len(params):]):
        arg.name = f"size.{dim}"
    builder = CpuFunctionBuilder(tree, fn, dict(zip(params, fn.args)), threads)
    builder.body(tree.root, sizes)
    builder.finish()
    entry_params = [name for name in params if tree.buffers[name].kind != "temp"]
    _c_entry(module, fn, tree, params, entry_params, entry)
    return CpuKernelSource(module, params, entry, entry_params)


def _c_entry(module: llir.Module, kernel: llir.Function, tree: LoopTree, params: list[str],
             entry_params: list[str], name: str):
    """`int name(inputs..., output, sizes...)`: check the pointers and the sizes of dynamic dims, allocate
    the temporaries, run the kernel, free them. Returns 0, 1 (out of memory), 2 (a NULL pointer), 3 (a
    pointer not aligned to its element size) or 4 (a dynamic size below its dim's minimum)."""
    dynamic = tree.program.dynamic
    fn = llir.Function(module, llir.FunctionType(I32, [PTR] * len(entry_params) + [I64] * len(dynamic)), name=name)
    b = llir.IRBuilder(fn.append_basic_block("entry"))
    given = dict(zip(entry_params, fn.args))
    sizes = {dim: arg for (dim, _), arg in zip(dynamic, fn.args[len(entry_params):])}
    _refuse_bad_pointers(b, tree, given)
    for dim, minimum in dynamic:
        with b.if_then(b.icmp_signed("<", sizes[dim], constant(I64, minimum)), likely=False):
            b.ret(constant(I32, 4))
    alloc = llir.Function(module, llir.FunctionType(PTR, [I64, I64]), name="aligned_alloc") \
        if "aligned_alloc" not in module.globals else module.globals["aligned_alloc"]
    free = module.globals.get("free") or llir.Function(module, llir.FunctionType(llir.VoidType(), [PTR]), name="free")
    temps = {}
    for param in params:
        if param not in given:
            temps[param] = b.call(alloc, [constant(I64, 64), _temp_bytes(b, tree.buffers[param], sizes)])
    failed = constant(I1, 0)
    for pointer in temps.values():
        failed = b.or_(failed, b.icmp_unsigned("==", b.ptrtoint(pointer, I64), ZERO))
    with b.if_then(b.not_(failed)):
        b.call(kernel, [given[p] if p in given else temps[p] for p in params] + list(sizes.values()))
    for pointer in temps.values():
        b.call(free, [pointer])
    b.ret(b.zext(failed, I32))


def _temp_bytes(b: llir.IRBuilder, plan, sizes: dict) -> llir.Value:
    """The bytes of a temporary, a multiple of 64 and never 0 (NULL is failure); a dynamic first axis
    of its storage (`BufferPlan.storage_shape`: its blocks, where it has them) takes its extent from the
    entry's arguments (at least 1: smaller sizes were refused)."""
    shape = plan.storage_shape
    if not shape or not isinstance(shape[0], ir.Size):
        return constant(I64, max(64, -(-plan.size * ITEM_BYTES[plan.dtype] // 64) * 64))
    divisor = constant(I64, shape[0].divisor)
    extent = b.udiv(b.add(sizes[shape[0].dim], b.sub(divisor, constant(I64, 1))), divisor)
    count = b.mul(extent, constant(I64, math.prod(shape[1:])))
    padded = b.and_(b.add(b.mul(count, constant(I64, ITEM_BYTES[plan.dtype])), constant(I64, 63)), constant(I64, -64))
    return b.select(b.icmp_unsigned("<", padded, constant(I64, 64)), constant(I64, 64), padded)


def _refuse_bad_pointers(b: llir.IRBuilder, tree: LoopTree, given: dict):
    """Return 2 if a pointer is NULL, else 3 if one is not aligned to its element size."""
    status = constant(I32, 0)
    for check, code in (("aligned", 3), ("null", 2)):
        for name, pointer in given.items():
            address = b.ptrtoint(pointer, I64)
            if check == "null":
                bad = b.icmp_unsigned("==", address, ZERO)
            else:
                element = constant(I64, ITEM_BYTES[tree.buffers[name].dtype])
                bad = b.icmp_unsigned("!=", b.urem(address, element), ZERO)
            status = b.select(bad, constant(I32, code), status)
    with b.if_then(b.icmp_unsigned("!=", status, constant(I32, 0)), likely=False):
        b.ret(status)


class CpuFunctionBuilder(FunctionBuilder):
    """The shared builder plus parallel loops, outlined and run on threads, and register tiles whose
    accumulators stay in registers across their reduction loop, edges included (`Accumulators`)."""

    def plain_loop(self, node: LoopNode, env: dict, count: llir.Value):
        """A reduction loop around a register tile keeps the tile's accumulators in registers across it
        (`Accumulators`), across the whole nest of plain reduction loops it heads; other loops run as
        on every target."""
        if not run_in_registers(self, node, env, count, nested=True):
            super().plain_loop(node, env, count)

    def parallel(self, node: LoopNode, env: dict, count: llir.Value):
        """A parallel loop on threads (`threaded`); one of dynamic extent only where this call's trip
        count gives every thread enough work (`model.worth_threads`'s rule), else as a plain loop."""
        if not isinstance(node.loop.extent, ir.Size):
            self.threaded(node, env, count)
            return
        b = self.builder
        work = b.mul(count, constant(I64, iteration_work(node)))
        enough = b.and_(b.icmp_signed(">=", count, constant(I64, self.threads)),
                        b.icmp_signed(">=", work, constant(I64, WORK_PER_THREAD * self.threads)))
        with b.if_else(enough) as (then, otherwise):
            with then:
                self.threaded(node, env, count)
            with otherwise:
                self.allocate_placed(node)
                self.plain_loop(node, env, count)

    def threaded(self, node: LoopNode, env: dict, count: llir.Value):
        """Outline the loop into body(noalias buffers..., outer loop values..., start, end) and run
        chunks of its range on threads through a (ctx, start, end) wrapper.  Buffers placed at the
        loop are allocated in the body, one per thread, as the legality check assumes."""
        module = self.fn.module
        pointers, values = list(self.pointers.items()), list(env.items())
        name = f"{self.fn.name}.{node.loop.name}.par{len(module.globals)}"
        body_fn = llir.Function(module, llir.FunctionType(
            llir.VoidType(), [PTR] * len(pointers) + [I64] * (len(values) + 2)), name=name)
        for arg in body_fn.args[:len(pointers)]:
            arg.add_attribute("noalias")
        wrapper = llir.Function(module, llir.FunctionType(llir.VoidType(), [PTR, I64, I64]), name=name + ".ctx")

        b = self.builder
        ctx = self.allocas.alloca(I64, size=constant(I64, max(1, len(pointers) + len(values))), name="ctx")
        for k, (_, value) in enumerate(pointers + values):
            b.store(b.ptrtoint(value, I64) if isinstance(value.type, llir.PointerType) else value,
                    b.gep(ctx, [constant(I64, k)], source_etype=I64))
        b.call(declare_parallel_for(module), [wrapper, ctx, count, constant(I64, self.threads)])

        wb = llir.IRBuilder(wrapper.append_basic_block())
        slots = [wb.load(wb.gep(wrapper.args[0], [constant(I64, k)], source_etype=I64), typ=I64)
                 for k in range(len(pointers) + len(values))]
        args = [wb.inttoptr(v, PTR) for v in slots[:len(pointers)]] + slots[len(pointers):]
        wb.call(body_fn, args + list(wrapper.args[1:]))
        wb.ret_void()

        inner = CpuFunctionBuilder(self.tree, body_fn, dict(zip([n for n, _ in pointers], body_fn.args)), self.threads)
        inner.allocate_placed(node)  # buffers placed at this loop: one per thread, not shared
        inner_env = dict(zip([n for n, _ in values], body_fn.args[len(pointers):]))
        start, end = body_fn.args[-2:]
        lp = node.loop
        inner.full, inner.holding, inner.proven = set(self.full), set(self.holding), set(self.proven)
        inner.counted_loop(start, end, lambda i: inner.loop_body(node, {**inner_env, lp.name: i}), lp.name,
                           inner.around_register_tile(node))
        inner.finish()


def iteration_work(node: LoopNode) -> int:
    """The statement instances one iteration of a loop runs (the loops inside it at their planned extents)."""
    return max(1, sum(math.prod(int(p.loop.extent) for p in path)
                      for stmt, path in walk(node.body) if isinstance(stmt, StmtNode)))


class HostTarget:
    """The JIT target: triple, CPU name and features of this CPU, or of the CPU `LOOPTOOL_CPU` names
    (`analysis.target.llvm_cpu`); makes O3 target machines."""

    _instance = None

    def __init__(self):
        self.llvm_cpu = target_model.llvm_cpu()
        self.triple, self.cpu, self.features = self.llvm_cpu.triple, self.llvm_cpu.name, self.llvm_cpu.features

    def new_machine(self) -> llvm.TargetMachine:
        """A fresh target machine: an MCJIT engine owns (and frees) the one it is given."""
        return target_model.new_machine(self.llvm_cpu, codemodel="jitdefault", jit=True)

    @property
    def name(self) -> str:
        """What a tuned schedule is specific to: the CPU model and its features."""
        digest = hashlib.sha256(self.features.encode()).hexdigest()[:12]
        return f"cpu:{self.cpu}:{digest}"

    @classmethod
    def get(cls) -> "HostTarget":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def optimize(self, text: str, machine: llvm.TargetMachine) -> llvm.ModuleRef:
        """Parse, verify and optimize LLVM IR with the new pass manager at O3."""
        mod = llvm.parse_assembly(text)
        mod.triple = self.triple
        mod.data_layout = str(machine.target_data)
        mod.verify()
        options = llvm.create_pipeline_tuning_options(speed_level=3)
        options.loop_vectorization = True
        options.slp_vectorization = True
        options.loop_unrolling = True
        builder = llvm.create_pass_builder(machine, options)
        builder.getModulePassManager().run(mod, builder)
        return mod
