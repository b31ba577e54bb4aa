"""NVIDIA GPU backend: a loop tree becomes PTX through LLVM's NVPTX target.

Each top-level nest of the tree is one kernel launch (launches run in order, so
stages at the root are separated by a grid-wide barrier).  Loops bound to
`block.x/y/z` and `thread.x/y/z` read the matching special registers; every
other loop runs inside each thread.  A bound loop whose trip count is smaller
than the launch dimension guards its body, so no thread touches memory outside
its tile.  Kernel parameters are generic pointers, which NVPTX lowers to
global memory for kernel arguments.

Code outside thread-bound loops ("block level") runs in every thread of a block;
a barrier follows each of its statements and nests, so what threads wrote in one
nest is visible to all of them in the next (the legality check relies on this).
A buffer placed at block level and written only inside thread-bound loops lives
in shared memory; otherwise each thread keeps its own copy.  A reduction whose
loop is bound to threads accumulates per-thread partials and combines them
through shared memory (a tree over the threads), then thread 0 updates the result.
"""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite import ir as llir

from .codegen_cpu import FLOAT, I64, IDENTITY, REDUCE_BINARY, ZERO, _element, _FunctionBuilder, kernel_params
from .ir import Affine
from .looptree import LoopNode, LoopTree, StmtNode
from .schedule import GPU_AXES

TRIPLE = "nvptx64-nvidia-cuda"
DATA_LAYOUT = "e-p:64:64:64-i64:64-i128:128-v16:16-v32:32-n16:32:64"
SREG = {"block": "ctaid", "thread": "tid"}
LOCAL_LIMIT = 16 * 1024


@dataclass
class Launch:
    """One kernel of the module: its name and launch dimensions (x, y, z)."""

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]


@dataclass
class GpuModule:
    """PTX text, the kernels to launch in order, and the buffer name of each parameter."""

    ptx: str
    llvm_ir: str
    launches: list[Launch]
    params: list[str]
    arch: str


def generate(tree: LoopTree, arch: str = "sm_90") -> GpuModule:
    """Lower every top-level nest of `tree` to a kernel and compile the module to PTX for `arch`."""
    module = llir.Module(name="looptool_gpu")
    module.triple = TRIPLE
    module.data_layout = DATA_LAYOUT
    params = kernel_params(tree)
    launches = []
    for index, node in enumerate(tree.root):
        name = f"looptool_k{index}"
        fn = llir.Function(module, llir.FunctionType(llir.VoidType(), [llir.PointerType()] * len(params)), name=name)
        fn.calling_convention = "ptx_kernel"
        for arg, buffer in zip(fn.args, params):
            arg.name = buffer
            if tree.buffers[buffer].kind == "input":
                arg.add_attribute("noalias")   # written buffers are shared between threads: not noalias
        builder = _GpuBuilder(tree, fn, dict(zip(params, fn.args)))
        builder.body([node], {})
        builder.finish()
        launches.append(Launch(name, *_launch_dims(node)))
    text = str(module)
    return GpuModule(_compile(text, arch), text, launches, params, arch)


def _launch_dims(node) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    extents = {axis: 1 for axis in GPU_AXES}
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, LoopNode):
            if current.loop.annotation in GPU_AXES:
                extents[current.loop.annotation] = max(extents[current.loop.annotation], current.loop.extent)
            stack.extend(current.body)
    grid = tuple(extents[f"block.{a}"] for a in "xyz")
    block = tuple(extents[f"thread.{a}"] for a in "xyz")
    if block[0] * block[1] * block[2] > 1024:
        raise ValueError(f"a GPU block of {block[0]}x{block[1]}x{block[2]} threads exceeds the 1024-thread limit; "
                         f"split the thread-bound loops")
    return grid, block


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


class _GpuBuilder(_FunctionBuilder):
    """The CPU loop-tree walker with GPU-bound loops read from special registers."""

    def __init__(self, tree: LoopTree, fn: llir.Function, pointers: dict):
        super().__init__(tree, fn, pointers, threads=1)
        self.thread_depth = 0
        self.partials: dict[int, llir.Value] = {}

    def body(self, nodes: list, env: dict):
        for node in nodes:
            super().body([node], env)
            if self.thread_depth == 0:
                self.barrier()

    def barrier(self):
        self.builder.call(self.declare("llvm.nvvm.barrier0", llir.VoidType(), []), [])

    def loop(self, node: LoopNode, env: dict):
        axis = node.loop.annotation
        if axis == "parallel":
            raise ValueError(f"loop '{node.loop.name}' is marked parallel: on a GPU, bind it to blocks or threads")
        if axis not in GPU_AXES:
            super().loop(node, env)
            return
        self.allocate_placed(node)
        kind, dim = axis.split(".")
        register = self.declare(f"llvm.nvvm.read.ptx.sreg.{SREG[kind]}.{dim}", llir.IntType(32), [])
        value = self.builder.zext(self.builder.call(register, []), I64)
        inside = {**env, node.loop.name: value}
        combined = self.combined_reductions(node) if kind == "thread" and self.thread_depth == 0 else []
        for stmt in combined:
            ty = FLOAT[stmt.stage.dtype]
            self.partials[id(stmt)] = self.allocas.alloca(ty)
            self.builder.store(llir.Constant(ty, IDENTITY[stmt.stage.reduce_op]), self.partials[id(stmt)])
        self.thread_depth += kind == "thread"
        with self.builder.if_then(self.builder.icmp_signed("<", value, self.trip_count(node, env))):
            self.loop_body(node, inside)
        self.thread_depth -= kind == "thread"
        for stmt in combined:
            self.combine_across_threads(stmt, node, value, env)

    def combined_reductions(self, node: LoopNode) -> list[StmtNode]:
        """Reduction updates under a thread-bound loop over one of their reduction dims, into a target
        that does not depend on it (and with no other thread-bound loop inside)."""
        found, stack = [], list(node.body)
        while stack:
            current = stack.pop()
            if isinstance(current, LoopNode):
                if current.loop.annotation.startswith("thread"):
                    return []
                stack.extend(current.body)
            elif current.kind == "update" and node.loop.dim in current.stage.reduce_dims:
                own = tuple(Affine.var(d) for d in current.stage.dims)
                if not self.linear_offset(current.stage.name, own, current).coeffs().get(node.loop.name):
                    found.append(current)
        return found

    def statement(self, stmt: StmtNode, env: dict):
        partial = self.partials.get(id(stmt))
        if partial is None:
            super().statement(stmt, env)
            return
        dims = {d: self.affine(a, env) for d, a in stmt.index.items()}
        old = self.builder.load(partial, typ=FLOAT[stmt.stage.dtype])
        value = self.accumulate(stmt.stage.reduce_op, old, stmt.stage.expr, lambda e: self.expr(e, dims, env))
        self.builder.store(value, partial)

    def combine_across_threads(self, stmt: StmtNode, node: LoopNode, tid: llir.Value, env: dict):
        """Tree-combine the threads' partials in shared memory; thread 0 folds the total into the target."""
        b, stage = self.builder, stmt.stage
        ty, extent = FLOAT[stage.dtype], node.loop.extent
        scratch = self.shared(ty, extent, f"{stage.name}.partials")
        op = REDUCE_BINARY[stage.reduce_op]

        def at(index):
            return b.gep(scratch, [index], source_etype=ty)
        with b.if_then(b.icmp_signed("<", tid, llir.Constant(I64, extent))):
            b.store(b.load(self.partials.pop(id(stmt)), typ=ty), at(tid))
        self.barrier()
        step = 1 << max(extent - 1, 0).bit_length()
        while step > 1:
            step //= 2
            other = b.add(tid, llir.Constant(I64, step))
            active = b.and_(b.icmp_signed("<", tid, llir.Constant(I64, step)),
                            b.icmp_signed("<", other, llir.Constant(I64, extent)))
            with b.if_then(active):
                b.store(self.binary(op, b.load(at(tid), typ=ty), b.load(at(other), typ=ty)), at(tid))
            self.barrier()
        zeros = {name: ZERO for name in _loop_names(node)}
        here = {**env, **zeros}
        dims = {d: self.affine(a, here) for d, a in stmt.index.items()}
        target = self.address(self.tree.buffers[stage.name], [dims[d] for d in stage.dims], False, here)
        with b.if_then(b.icmp_signed("==", tid, ZERO)):
            b.store(self.binary(op, b.load(target, typ=ty), b.load(at(ZERO), typ=ty)), target)
        self.barrier()

    def shared(self, ty, count: int, name: str) -> llir.Value:
        module = self.fn.module
        unique = f"{self.fn.name}.{name}.{len(module.globals)}"
        variable = llir.GlobalVariable(module, llir.ArrayType(ty, count), unique, addrspace=3)
        variable.linkage = "internal"
        variable.align = 16
        return self.allocas.addrspacecast(variable, llir.PointerType())

    def allocate(self, plan):
        if self.thread_depth == 0 and self._written_by_threads(plan.name):
            return self.shared(FLOAT[plan.dtype], plan.size, plan.name)
        size = plan.size * (4 if plan.dtype == "float32" else 8)
        if size > LOCAL_LIMIT:
            raise ValueError(f"buffer {plan.name} ({size} bytes) is too large for a GPU thread's local memory; "
                             f"place it deeper")
        return self.allocas.alloca(FLOAT[plan.dtype], size=llir.Constant(I64, plan.size), name=plan.name)

    def _written_by_threads(self, buffer: str) -> bool:
        """Every non-init write of the buffer happens inside a thread-bound loop."""
        writers = [path for stmt, path in self.tree.statements() if stmt.stage.name == buffer and stmt.kind != "init"]
        return bool(writers) and all(any(n.loop.annotation.startswith("thread") for n in path) for path in writers)

    def unary(self, op: str, x):
        if op in ("log",) or (op == "exp" and _element(x.type) == FLOAT["float64"]):
            raise ValueError(f"{op} of {_element(x.type)} is not supported on the GPU backend yet")
        return super().unary(op, x)


def _loop_names(node: LoopNode) -> set[str]:
    names, stack = set(), [node]
    while stack:
        current = stack.pop()
        if isinstance(current, LoopNode):
            names.add(current.loop.name)
            stack.extend(current.body)
    return names


def describe(module: GpuModule) -> str:
    """The launches of a GPU module, one line each."""
    return "\n".join(f"{k.name}: grid {k.grid}, block {k.block}" for k in module.launches)

