"""Runs a GPU module's LLVM IR on this CPU, so GPU code generation is checked for results without a GPU.

The IR of CUDA-core kernels is rewritten for the host: each kernel takes its thread and block
indices and a barrier as extra parameters; shared memory becomes plain globals (blocks run one after
another), block barriers pthread barriers, cp.async a synchronous copy (every wait then finds its
copies done), and a programmatic launch's waits (`griddepcontrol`) nothing (kernels run one after another).
Each thread of a block is an OS thread (ctypes releases the GIL while a kernel runs). A warp's butterfly
shuffles (`shfl.sync.bfly`) exchange values through slots of its own, between two waits on a barrier of its
32 threads (of a row of threads, in a block narrower than a warp).
The hardware's bfloat16 rounding (`cvt.rn.bf16.f32`, `cvt.rn.bf16x2.f32`) becomes functions doing it in integer
arithmetic, the hardware's ex2.approx and cvt.rzi LLVM's exp2 and saturating conversion. Tensor-core and TMA
kernels (other inline PTX) are not supported."""
import ctypes
import re
import threading

import llvmlite.binding as llvm
import numpy as np

from looptool import ir

SPECIAL = re.compile(r'(%\S+) = call i32 @"llvm\.nvvm\.read\.ptx\.sreg\.(tid|ctaid)\.([xyz])"\(\)')
CP_ASYNC = re.compile(r'call void @"llvm\.nvvm\.cp\.async\.(?:cg|ca)\.shared\.global\.(\d+)"'
                      r'\((ptr [^,]+), (ptr [^)]+)\)')
EXTRA = ", ".join(f"i32 %__{kind}.{axis}" for kind in ("tid", "ctaid") for axis in "xyz") + \
    ", ptr %__barrier, ptr %__warp, i32 %__lane"
SHUFFLE = re.compile(r'call (float|i32) @"llvm\.nvvm\.shfl\.sync\.bfly\.(?:f32|i32)"\(i32 [^,]+, (?:float|i32) ([^,]+), '
                     r'i32 ([^,]+), i32 [^)]+\)')
WARP = 32
WARP_BYTES = 128 + 4 * WARP      # a warp's barrier, then a 32-bit slot a lane
LIBC = ctypes.CDLL(None)
BARRIER_BYTES = 128             # more than a pthread_barrier_t takes
BF16_ROUNDING = {
    re.compile(r'call i16 asm\s+"cvt\.rn\.bf16\.f32 \$0, \$1;", "=h,f"'): "call i16 @__bf16_rn",
    re.compile(r'call i32 asm\s+"cvt\.rn\.bf16x2\.f32 \$0, \$1, \$2;", "=r,f,f"'): "call i32 @__bf16x2_rn"}
HOST_INTRINSICS = {"llvm.nvvm.ex2.approx.ftz.f": "@llvm.exp2.f32", "llvm.nvvm.f2i.rz": "@llvm.fptosi.sat.i32.f32"}
PROGRAMMATIC = re.compile(r'\n\s*call void asm sideeffect\s+"griddepcontrol\.(wait|launch_dependents);", "~\{memory\}"\(\)')
BF16_FUNCTIONS = """
define internal i16 @__bf16_rn(float %x) {
  %bits = bitcast float %x to i32
  %upper = lshr i32 %bits, 16
  %odd = and i32 %upper, 1
  %half = add i32 %bits, 32767
  %up = add i32 %half, %odd
  %rounded = lshr i32 %up, 16
  %nan = fcmp uno float %x, %x
  %chosen = select i1 %nan, i32 32767, i32 %rounded
  %result = trunc i32 %chosen to i16
  ret i16 %result
}
define internal i32 @__shfl_bfly(ptr %warp, i32 %lane, i32 %value, i32 %offset) {
  %slots = getelementptr i8, ptr %warp, i64 128
  %mine = getelementptr i32, ptr %slots, i32 %lane
  store i32 %value, ptr %mine
  %stored = call i32 @pthread_barrier_wait(ptr %warp)
  %other = xor i32 %lane, %offset
  %theirs = getelementptr i32, ptr %slots, i32 %other
  %result = load i32, ptr %theirs
  %read = call i32 @pthread_barrier_wait(ptr %warp)
  ret i32 %result
}
define internal float @__shfl_bfly_float(ptr %warp, i32 %lane, float %value, i32 %offset) {
  %bits = bitcast float %value to i32
  %moved = call i32 @__shfl_bfly(ptr %warp, i32 %lane, i32 %bits, i32 %offset)
  %result = bitcast i32 %moved to float
  ret float %result
}
define internal i32 @__bf16x2_rn(float %high, float %low) {
  %h = call i16 @__bf16_rn(float %high)
  %l = call i16 @__bf16_rn(float %low)
  %hw = zext i16 %h to i32
  %lw = zext i16 %l to i32
  %hs = shl i32 %hw, 16
  %word = or i32 %hs, %lw
  ret i32 %word
}
"""


def host_ir(text: str) -> str:
    """A GPU module's LLVM IR rewritten to run on this CPU (see the module's docstring)."""
    for pattern, call in BF16_ROUNDING.items():
        text = pattern.sub(call, text)
    text = PROGRAMMATIC.sub("", text)
    text = SHUFFLE.sub(lambda m: f"call {m[1]} @__shfl_bfly{'_float' if m[1] == 'float' else ''}(ptr %__warp, "
                                 f"i32 %__lane, {m[1]} {m[2]}, i32 {m[3]})", text)
    if re.search(r"\basm\b", text):
        raise ValueError("inline PTX (tensor cores, TMA) cannot run on the host")
    text = re.sub(r" addrspace\(\d+\)", "", text).replace("addrspacecast", "bitcast").replace("ptx_kernel ", "")
    text = re.sub(r"target triple = .*", f'target triple = "{llvm.get_process_triple()}"', text)
    text = re.sub(r"target datalayout = .*\n", "", text)
    text = re.sub(r'(define void @"looptool_k\d+"\([^)]*)\)', rf"\1, {EXTRA})", text)
    text = SPECIAL.sub(r"\1 = add i32 %__\2.\3, 0", text)
    text = text.replace('call void @"llvm.nvvm.barrier0"()', "call i32 @pthread_barrier_wait(ptr %__barrier)")
    text = CP_ASYNC.sub(r"call void @llvm.memcpy.p0.p0.i64(\2, \3, i64 \1, i1 false)", text)
    text = re.sub(r'\n\s*call void @"llvm\.nvvm\.cp\.async\.(commit|wait)\.group"\([^)]*\)', "", text)
    for intrinsic, host in HOST_INTRINSICS.items():       # their declarations too
        text = text.replace(f'@"{intrinsic}"', host)
    text = re.sub(r'declare [^\n]*@"llvm\.nvvm[^\n]*\n', "", text)
    return text + BF16_FUNCTIONS + "\ndeclare i32 @pthread_barrier_wait(ptr)\ndeclare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)\n"


def run(module, buffers: dict[str, np.ndarray]):
    """Run every launch of a GPU module, in order, over `buffers` (parameter name -> C-contiguous
    array, written in place)."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    machine = llvm.Target.from_triple(llvm.get_process_triple()).create_target_machine(opt=1)
    ir_module = llvm.parse_assembly(host_ir(module.llvm_ir))
    ir_module.verify()
    engine = llvm.create_mcjit_compiler(ir_module, machine)
    engine.finalize_object()
    pointers = [ctypes.c_void_p(buffers[name].ctypes.data) for name in module.params]
    signature = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(pointers), *[ctypes.c_int32] * 6, ctypes.c_void_p,
                                 ctypes.c_void_p, ctypes.c_int32)
    for launch in module.launches:
        kernel = signature(engine.get_function_address(launch.name))
        for block in np.ndindex(*reversed(launch.grid)):
            _run_block(kernel, pointers, launch.block, tuple(reversed(block)))


def _run_block(kernel, pointers: list, block: tuple[int, int, int], index: tuple[int, int, int]):
    """One block: a thread per (x, y, z) of `block`, sharing a barrier; each warp (32 threads in the order of
    their linear index, x fastest) its slots and barrier for shuffles, or, in a block narrower than a warp, each
    row of threads (its shuffles stay within the row: a run of lanes of a warp)."""
    count = block[0] * block[1] * block[2]
    lanes = block[0] if block[0] < WARP and WARP % block[0] == 0 else WARP
    barrier = ctypes.create_string_buffer(BARRIER_BYTES)
    LIBC.pthread_barrier_init(barrier, None, count)
    runs = -(-count // lanes)
    warps = ctypes.create_string_buffer(WARP_BYTES * runs)
    base = ctypes.addressof(warps)
    for run in range(runs):
        LIBC.pthread_barrier_init(ctypes.c_void_p(base + run * WARP_BYTES), None, min(lanes, count - run * lanes))
    threads = [threading.Thread(target=kernel, args=(*pointers, *thread[::-1], *index, barrier,
                                                     ctypes.c_void_p(base + linear // lanes * WARP_BYTES), linear % lanes))
               for linear, thread in enumerate(np.ndindex(*reversed(block)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    LIBC.pthread_barrier_destroy(barrier)
    for run in range(runs):
        LIBC.pthread_barrier_destroy(ctypes.c_void_p(base + run * WARP_BYTES))


def run_tree(c, tree, module) -> np.ndarray:
    """The result of `tree` (a schedule of tensor `c`) computed by its GPU module on this CPU; the
    temps and the output start as NaN."""
    program, arrays = ir.lower(c.node)
    buffers = {spec.name: np.ascontiguousarray(array) for spec, array in zip(program.inputs, arrays)}
    for plan in tree.buffers.values():
        if plan.kind in ("temp", "output"):
            buffers[plan.name] = np.full(plan.shape, np.nan, dtype=plan.dtype)
    run(module, buffers)
    return buffers[program.output.name]
