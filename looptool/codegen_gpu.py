"""NVIDIA GPU backend: a loop tree becomes PTX through LLVM's NVPTX target.

Each top-level nest of the tree is one kernel launch (launches run in order, so
stages at the root are separated by a grid-wide barrier).  Loops bound to
`block.x/y/z` and `thread.x/y/z` read the matching special registers; every
other loop runs inside each thread.  A bound loop whose trip count is smaller
than the launch dimension guards its body, so no thread touches memory outside
its tile.  Kernel parameters are generic pointers, which NVPTX lowers to
global memory for kernel arguments.  Shared-memory staging is not implemented
yet: the legality check rejects any dependence between two threads of one
kernel, so every accepted schedule is race-free without barriers.
"""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite import ir as llir

from .codegen_cpu import FLOAT, I64, _element, _FunctionBuilder, kernel_params
from .looptree import LoopNode, LoopTree
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
            arg.add_attribute("noalias")
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

    def loop(self, node: LoopNode, env: dict):
        axis = node.loop.annotation
        if axis == "parallel":
            raise ValueError(f"loop '{node.loop.name}' is marked parallel: on a GPU, bind it to blocks or threads")
        if axis not in GPU_AXES:
            super().loop(node, env)
            return
        for plan in self.tree.local_buffers.get(id(node), []):
            self.pointers[plan.name] = self.allocate(plan)
        kind, dim = axis.split(".")
        register = self.declare(f"llvm.nvvm.read.ptx.sreg.{SREG[kind]}.{dim}", llir.IntType(32), [])
        value = self.builder.zext(self.builder.call(register, []), I64)
        inside = {**env, node.loop.name: value}
        with self.builder.if_then(self.builder.icmp_signed("<", value, self.trip_count(node, env))):
            self.loop_body(node, inside)

    def allocate(self, plan):
        size = plan.size * (4 if plan.dtype == "float32" else 8)
        if size > LOCAL_LIMIT:
            raise ValueError(f"buffer {plan.name} ({size} bytes) is too large for a GPU thread's local memory; "
                             f"place it deeper")
        return self.allocas.alloca(FLOAT[plan.dtype], size=llir.Constant(I64, plan.size), name=plan.name)

    def unary(self, op: str, x):
        if op in ("log",) or (op == "exp" and _element(x.type) == FLOAT["float64"]):
            raise ValueError(f"{op} of {_element(x.type)} is not supported on the GPU backend yet")
        return super().unary(op, x)


def describe(module: GpuModule) -> str:
    """The launches of a GPU module, one line each."""
    return "\n".join(f"{k.name}: grid {k.grid}, block {k.block}" for k in module.launches)

