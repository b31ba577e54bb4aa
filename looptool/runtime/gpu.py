"""Running loop trees on NVIDIA GPUs: PTX from codegen.gpu, loaded and launched through CuPy.

CuPy (the optional extra `looptool[gpu]`) loads PTX modules, launches kernels on
its current stream, owns device memory and speaks DLPack, so PyTorch tensors and
CuPy arrays come in without copies; cuda-python would need all of that by hand.
CuPy has no bfloat16 dtype: bfloat16 arrays on the GPU are `BFloat16Array`s, CuPy
uint16 arrays of the elements' bits that carry the bfloat16 dtype.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import itertools
import math
import threading
import weakref
from dataclasses import dataclass
from typing import Callable

import numpy as np
from llvmlite import binding as llvm

from .. import ir
from ..analysis.gpu_target import GpuTarget, assumed_gpu
from ..analysis.tma import GLOBAL_ALIGN, BulkCopy
from ..autoschedule import gpu as templates
from ..autoschedule import gpu_rules
from ..codegen import cpu as codegen_cpu
from ..codegen import gpu as codegen_gpu
from ..codegen import gpu_launch
from ..frontend import dtypes
from ..memo import BoundedMemo
from ..schedule import LoopTree
from . import ptx_cache, tuning_db
from .cache import KernelCache
from .schedules import resolve_schedule, schedule_steps
from .sizes import DynamicSizes

OPT_IN_SHARED_ATTRIBUTE = 97           # cudaDevAttrMaxSharedMemoryPerBlockOptin
MULTIPROCESSORS_ATTRIBUTE = 16         # cudaDevAttrMultiProcessorCount
THREADS_PER_SM_ATTRIBUTE = 39          # cudaDevAttrMaxThreadsPerMultiProcessor
SHARED_PER_SM_ATTRIBUTE = 81           # cudaDevAttrMaxSharedMemoryPerMultiprocessor
REGISTERS_PER_SM_ATTRIBUTE = 82        # cudaDevAttrMaxRegistersPerMultiprocessor
L2_BYTES_ATTRIBUTE = 38                 # cudaDevAttrL2CacheSize
MAX_DYNAMIC_SHARED_ATTRIBUTE = 8       # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
TENSOR_MAP_ELEMENT = {1: 0, 2: 1, 4: 2}   # CU_TENSOR_MAP_DATA_TYPE_UINT8/16/32: TMA copies bits
SWIZZLE_128B, L2_PROMOTION_256B, NO_INTERLEAVE, OOB_ZERO = 3, 3, 0, 0
TENSOR_MAP_CACHE = 16                  # tensor map sets a kernel keeps, by input addresses
# a convolution runs as a gather of its windows and a matrix product (`ir.im2col`) where the gathered
# matrix takes at most this much device memory (it is allocated at each call, from CuPy's pool)
IM2COL_BYTES = 1 << 30


def cupy():
    """The cupy module, or a clear error where it (or a GPU) is missing."""
    try:
        import cupy as cp
    except ImportError:
        raise RuntimeError("the GPU backend needs CuPy: pip install 'looptool[gpu]' (cupy-cuda12x)") from None
    return cp


def device_arch() -> str:
    """The current GPU as an NVPTX target name, e.g. 'sm_90'."""
    return f"sm_{cupy().cuda.Device().compute_capability}"


class BFloat16Array:
    """A bfloat16 array on the GPU: `bits` is a CuPy uint16 array of its elements' bits (CuPy has no
    bfloat16), and `dtype` is bfloat16. `get()` copies it to a NumPy bfloat16 array; `to_torch()`
    views it as a PyTorch bfloat16 tensor, without a copy."""

    dtype = dtypes.bfloat16

    def __init__(self, bits):
        if bits.dtype != np.uint16:
            raise TypeError(f"BFloat16Array holds uint16 bits, got a {bits.dtype} array")
        self.bits = bits

    @property
    def shape(self) -> tuple[int, ...]:
        return self.bits.shape

    @property
    def ndim(self) -> int:
        return self.bits.ndim

    @property
    def strides(self) -> tuple[int, ...]:
        return self.bits.strides

    @property
    def itemsize(self) -> int:
        return 2

    @property
    def data(self):
        """The device memory (CuPy's MemoryPointer, with `.ptr`)."""
        return self.bits.data

    def reshape(self, shape: tuple[int, ...]) -> "BFloat16Array":
        """The same elements in another shape (a view where CuPy's reshape gives one)."""
        return BFloat16Array(self.bits.reshape(shape))

    def get(self) -> np.ndarray:
        """A NumPy bfloat16 copy on the host."""
        return cupy().asnumpy(self.bits).view(dtypes.bfloat16)

    def to_torch(self):
        """The same memory as a PyTorch bfloat16 tensor (DLPack; PyTorch must be installed)."""
        import torch
        return torch.from_dlpack(self.bits.view(cupy().int16)).view(torch.bfloat16)

    def __repr__(self):
        return f"BFloat16Array(shape={self.shape}, strides={self.strides})"


def _is_torch(data) -> bool:
    return type(data).__module__.startswith("torch")


def _is_torch_bfloat16(data) -> bool:
    """A PyTorch bfloat16 CUDA tensor (its __cuda_array_interface__ refuses bfloat16)."""
    return _is_torch(data) and str(getattr(data, "dtype", "")) == "torch.bfloat16" \
        and bool(getattr(data, "is_cuda", False))


def is_device_array(data) -> bool:
    """True for CUDA arrays: CuPy, PyTorch (bfloat16 too), `BFloat16Array`, anything with
    __cuda_array_interface__ or on a CUDA DLPack device."""
    if _is_torch(data):                 # its __cuda_array_interface__ is a property that builds a dict
        return bool(data.is_cuda)
    if isinstance(data, BFloat16Array):
        return True
    if hasattr(data, "__cuda_array_interface__"):
        return True
    return hasattr(data, "__dlpack_device__") and data.__dlpack_device__()[0] == 2


def as_device(data):
    """A device view of a CUDA array (no copy), or a host array copied to the GPU: a CuPy array, or a
    `BFloat16Array` for bfloat16."""
    cp = cupy()
    if isinstance(data, BFloat16Array):
        return data
    if _is_torch_bfloat16(data):
        import torch
        return BFloat16Array(cp.from_dlpack(data.view(torch.int16)).view(cp.uint16))
    if isinstance(data, np.ndarray) and data.dtype == dtypes.bfloat16:
        return BFloat16Array(_copied_with_strides(data.view(np.uint16)))
    return _copied_with_strides(data) if isinstance(data, np.ndarray) else cp.asarray(data)


def _copied_with_strides(array: np.ndarray):
    """A device copy of a host array with the same strides (a kernel is built for its layout): the
    bytes its elements span are copied, so a view such as x[:, :1000] keeps its row stride."""
    cp = cupy()
    if array.flags.c_contiguous or array.size == 0 or min(array.strides) < 0:
        return cp.asarray(np.ascontiguousarray(array))
    span = sum((n - 1) * s for n, s in zip(array.shape, array.strides)) // array.itemsize + 1
    covering = np.lib.stride_tricks.as_strided(array, shape=(span,), strides=(array.itemsize,))
    device = cp.asarray(np.array(covering))
    return cp.ndarray(array.shape, array.dtype, memptr=device.data, strides=array.strides)


def device_empty(shape: tuple[int, ...], dtype: str):
    """An uninitialized device array of `dtype` (a `BFloat16Array` for bfloat16)."""
    return _array_maker(shape, dtype)()


def poisoned_empty(shape: tuple[int, ...], dtype: str):
    """`device_empty` filled with NaN (all bits set, for bfloat16), so a kernel that skips an output shows it."""
    array = device_empty(shape, dtype)
    bits = kernel_argument(array)
    bits.fill(0xFFFF if bits.dtype == np.uint16 else np.nan)
    return array


def _array_maker(shape: tuple[int, ...] | None, dtype: str) -> Callable:
    """A function making a new device array of `shape` (or of the shape it is given, with `shape` None) and
    `dtype` from CuPy's memory pool (a `BFloat16Array` for bfloat16), the dtype looked up once; an array of no
    elements still gets a byte, so a kernel is given a valid address. (CuPy allocating the array itself took
    2.2 us against 3.9 for an allocation wrapped in one, alone on an H100's host; a whole `.cuda()` call in one
    process measured the same within 0.2 us either way, session 34.)"""
    cp = cupy()
    bits = dtype == dtypes.bfloat16.name
    item = np.dtype(np.uint16) if bits else np.dtype(dtype)

    def make(shape: tuple[int, ...] = shape):
        array = cp.ndarray(shape, item, None if math.prod(shape) else cp.cuda.alloc(1))
        return BFloat16Array(array) if bits else array
    return make


def kernel_argument(array):
    """What a kernel launch is given for a device array: the CuPy array (of bits, for bfloat16)."""
    return array.bits if isinstance(array, BFloat16Array) else array


def shared_limit() -> int:
    """Bytes of shared memory a block may use on the current GPU, where its kernel opts in."""
    cp = cupy()
    return cp.cuda.runtime.deviceGetAttribute(OPT_IN_SHARED_ATTRIBUTE, cp.cuda.Device().id)


def opt_in_shared(launch, function):
    """Let a loaded kernel use the dynamic shared memory its launch asks for (beyond 48 KB a block
    a kernel must opt in); refused in plain words above what the GPU allows."""
    limit = shared_limit()
    if launch.dynamic_shared > limit:
        raise ValueError(f"kernel {launch.name} needs {launch.dynamic_shared} bytes of shared memory a block; "
                         f"this GPU allows {limit}: use smaller tiles or fewer pipeline stages")
    cupy().cuda.driver.funcSetAttribute(function.ptr, MAX_DYNAMIC_SHARED_ATTRIBUTE, launch.dynamic_shared)


@functools.cache
def _libcuda():
    return ctypes.CDLL("libcuda.so.1")


def tensor_map(copy: BulkCopy, pointer: int, shape: tuple[int, ...], strides: tuple[int, ...],
               itemsize: int) -> bytes:
    """The 128-byte CUtensorMap (cuTensorMapEncodeTiled) a TMA copy reads its input through: the
    input at `pointer` (`shape`, `strides` in elements), boxes of `copy.box`, 128-byte swizzle, zeros
    outside the input. CuPy has no binding for it, so it is called in libcuda through ctypes."""
    rank = len(shape)
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    encoded = (ctypes.c_uint8 * codegen_gpu.TENSOR_MAP_BYTES)()
    error = _libcuda().cuTensorMapEncodeTiled(
        encoded, TENSOR_MAP_ELEMENT[itemsize], rank, ctypes.c_void_p(pointer), (u64 * rank)(*shape[::-1]),
        (u64 * rank)(*[s * itemsize for s in strides[:-1][::-1]]), (u32 * rank)(*copy.box(rank)[::-1]),
        (u32 * rank)(*[1] * rank), NO_INTERLEAVE, SWIZZLE_128B, L2_PROMOTION_256B, OOB_ZERO)
    if error:
        raise RuntimeError(f"cuTensorMapEncodeTiled refused the tensor map of {copy.source} (shape {shape}, strides "
                           f"{strides}, box {copy.box(rank)}): CUDA error {error}")
    return bytes(encoded)


class Launcher:
    """Launches a module's kernels in order on CuPy's current stream by one call of the module's native
    launcher (`codegen.gpu_launch`), from one argument block: a call writes the stream and the buffers'
    addresses into it and makes one foreign call.
    Where the driver refuses (a thread with no current context, say) it launches through CuPy."""

    def __init__(self, loaded: "LoadedModule", varying: list[str]):
        # varying: the parameters a call passes, in its order
        self.loaded, self.params = loaded, loaded.module.params
        count = len(self.params)
        self.block = (ctypes.c_uint64 * gpu_launch.launch_block_words(count))()
        base, word = ctypes.addressof(self.block), ctypes.sizeof(ctypes.c_uint64)
        for i in range(count):
            self.block[1 + count + i] = base + (1 + i) * word
        self.address = ctypes.c_void_p(base)
        self.slots = [1 + self.params.index(name) for name in varying]
        self.current_stream = cupy().cuda.get_current_stream
        self.lock = threading.Lock()

    def __call__(self, pointers: list[int]):
        """Launch every kernel with `pointers` (device addresses, in the order of `varying`)."""
        block = self.block
        with self.lock:
            block[0] = self.current_stream().ptr
            for slot, pointer in zip(self.slots, pointers):
                block[slot] = pointer
            refused = self.loaded.launch_all(self.address)
            if refused:
                self.through_cupy(refused - 1)

    def through_cupy(self, start: int):
        args = tuple(np.uint64(self.block[1 + i]) for i in range(len(self.params)))
        launches, slots = self.loaded.module.launches, size_slots(self.loaded.module)
        for launch, function in list(zip(launches, self.loaded.functions))[start:]:
            grid = grid_at(launch.grid, lambda dim: self.block[1 + slots[dim]])
            function(grid, launch.block, args, shared_mem=launch.dynamic_shared)


@dataclass(frozen=True)
class LoadedModule:
    """A GpuModule loaded on the current GPU: its CuPy module, its kernels' functions and the native
    function that launches them all (`codegen.gpu_launch`)."""

    module: codegen_gpu.GpuModule
    cuda_module: object
    functions: list
    launch_all: Callable


def load_module(module: codegen_gpu.GpuModule) -> LoadedModule:
    """Load a module's PTX on the current GPU (kernels that need more than 48 KB of shared memory a
    block opted in) and build its native launcher."""
    cuda_module = cupy().cuda.function.Module()
    cuda_module.load(module.ptx.encode())
    functions = [cuda_module.get_function(k.name) for k in module.launches]
    for launch, function in zip(module.launches, functions):
        if launch.dynamic_shared:
            opt_in_shared(launch, function)
    launch_kernel_ex = _launch_kernel_ex()
    kernels = [gpu_launch.KernelLaunch(function.ptr, launch.grid, launch.block, launch.dynamic_shared,
                                       launch.programmatic and bool(launch_kernel_ex))
               for launch, function in zip(module.launches, functions)]
    launch_kernel = ctypes.cast(_libcuda().cuLaunchKernel, ctypes.c_void_p).value
    launcher = native_launcher(kernels, len(module.params), launch_kernel, size_slots(module), launch_kernel_ex)
    return LoadedModule(module, cuda_module, functions, launcher)


_LOADER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="looptool-gpu-load")


def _load_on(device: int, module: codegen_gpu.GpuModule) -> LoadedModule:
    """`load_module` in a thread of its own, on `device` (a thread's current device is its own)."""
    cupy().cuda.runtime.setDevice(device)
    return load_module(module)


def _launch_kernel_ex() -> int:
    """The address of the driver's `cuLaunchKernelEx` (CUDA 12), or 0 where it has none (kernels marked
    programmatic are then launched plainly, after the kernel before them; their waits return at once)."""
    try:
        return ctypes.cast(_libcuda().cuLaunchKernelEx, ctypes.c_void_p).value or 0
    except AttributeError:
        return 0


def size_slots(module: codegen_gpu.GpuModule) -> dict[str, int]:
    """Each dynamic dim's parameter index in a module (its size, a 64-bit integer parameter)."""
    prefix = codegen_gpu.size_variable("")
    return {name[len(prefix):]: index for index, name in enumerate(module.params) if name.startswith(prefix)}


def grid_at(grid: tuple, words: Callable[[str], int]) -> tuple[int, int, int]:
    """A launch's grid where its extents sized at launch (`ir.Size`) take the sizes `words(dim)` gives."""
    return tuple(-(-words(g.dim) // g.divisor) if isinstance(g, ir.Size) else g for g in grid)


_LAUNCHER_NUMBERS = itertools.count()


def native_launcher(kernels: list, param_count: int, launch_kernel: int,
                    slots: dict[str, int] | None = None, launch_kernel_ex: int = 0) -> Callable:
    """The compiled `codegen.gpu_launch` function for these kernels, calling `cuLaunchKernel` at address
    `launch_kernel` (`cuLaunchKernelEx` at `launch_kernel_ex` for programmatic ones), as a ctypes function
    of the argument block's address (dynamic dims' sizes at their parameters' `slots`)."""
    name = f"{gpu_launch.ENTRY}_{next(_LAUNCHER_NUMBERS)}"
    module = llvm.parse_assembly(gpu_launch.launcher_ir(launch_kernel, kernels, param_count, name, slots,
                                                        launch_kernel_ex))
    module.triple = codegen_cpu.HostTarget.get().triple
    engine = _launcher_engine()
    engine.add_module(module)
    engine.finalize_object()
    return ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(engine.get_function_address(name))


@functools.cache
def _launcher_engine():
    """The JIT engine that holds the native launchers of this process's loaded modules."""
    return llvm.create_mcjit_compiler(llvm.parse_assembly(""), codegen_cpu.HostTarget.get().new_machine())


@dataclass(frozen=True)
class BufferSpec:
    """A buffer a GPU module is launched with: its name, shape, dtype and strides (in elements)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...]


class ModuleRunner:
    """A GpuModule loaded on the current GPU: each call checks the inputs against their specs,
    allocates the temps and the output, and launches the kernels in order. `unaligned` builds the
    module again for inputs that are not 16-byte aligned where the module assumes they are."""

    def __init__(self, module: codegen_gpu.GpuModule, inputs: list[BufferSpec], scratch: list[BufferSpec],
                 output: str, unaligned: Callable[[], codegen_gpu.GpuModule], dynamic: DynamicSizes | None = None):
        self.module, self.inputs, self.scratch, self.output = module, inputs, scratch, output
        # dynamic dims: where a call reads their sizes (the inputs' first axes), and the shapes at those sizes
        self.dynamic = dynamic or DynamicSizes((), [], [])
        self.output_template = self.dynamic.template(next(spec.shape for spec in scratch if spec.name == output))
        self._unaligned = unaligned
        self._loaded: dict[bool, LoadedModule | concurrent.futures.Future] = {}
        self._entries: dict[tuple, Callable] = {}
        self._tensor_maps = BoundedMemo(TENSOR_MAP_CACHE)

    def __call__(self, arrays: list, out=None):
        """Run on device (or host, copied) arrays in the order of `inputs`, into `out` if given; returns
        a CuPy array (a `BFloat16Array` for a bfloat16 result)."""
        return self.prepare(arrays, out)(out)

    def prepare(self, arrays: list, out=None, shape: tuple[int, ...] | None = None) -> Callable:
        """Check these inputs once and return a call that only allocates the temps and the output
        (from CuPy's memory pool, in `shape` if given: the elements are the same, unless it is given
        `out`) and launches the kernels (`entry`): the inputs' device views and the module for their
        alignment are worked out here, not on every call. Host arrays are copied at every call (they
        may have changed)."""
        sizes = self.sizes(arrays)
        devices = [checked_input(spec, array, self.dynamic.at(self.dynamic.template(spec.shape), sizes))
                   for spec, array in zip(self.inputs, arrays)]
        pointers = [device.data.ptr for device in devices]
        run = self.entry(self.aligned(pointers), shape)
        host = [(index, array) for index, array in enumerate(arrays) if not is_device_array(array)]

        def call(out=None):
            if host:
                copies = [(index, kernel_argument(as_device(array))) for index, array in host]    # kept until launched
                pointers[:] = [device.data.ptr for device in devices]
                for index, device in copies:
                    pointers[index] = device.data.ptr
            return self.launch(run, pointers, out, sizes)
        return call

    def sizes(self, arrays: list) -> list[int]:
        """The sizes of the dynamic dims in a call on `arrays` (in `inputs` order): read from their first
        axes, checked where inputs share a dim and against each dim's minimum (`DynamicSizes.of`)."""
        if not self.dynamic.dims:
            return []
        for spec, array in zip(self.inputs, arrays):
            if len(array.shape) != len(spec.shape):
                raise ValueError(f"GPU kernel input {spec.name} expects {len(spec.shape)} dimensions; got shape "
                                 f"{tuple(array.shape)}")
        return self.dynamic.of(arrays)

    def output_shape(self, sizes: list[int]) -> tuple[int, ...]:
        """The output's shape at these sizes of the dynamic dims."""
        return self.dynamic.at(self.output_template, sizes)

    def launch(self, run: Callable, pointers: list[int], out=None, sizes: list[int] = ()):
        """`run` (an `entry` for aligned buffers) on the inputs at `pointers`: into a new array, which it
        returns, or into `out` (through the entry for its alignment), which it returns."""
        if out is None:
            return run(pointers, None, sizes)
        address = kernel_argument(out).data.ptr
        (run if address % 16 == 0 else self.entry(self.aligned(pointers + [address])))(pointers, address, sizes)
        return out

    def aligned(self, pointers: list[int]) -> bool:
        """Whether these buffer addresses (the inputs, then the output where given) are 16-byte aligned
        wherever the module assumes so: the module built on that assumption runs, else one built without."""
        names = [spec.name for spec in self.inputs] + [self.output]
        return all(pointer % 16 == 0 for name, pointer in zip(names, pointers) if name in self.module.aligned)

    def entry(self, aligned: bool, shape: tuple[int, ...] | None = None) -> Callable:
        """`run(inputs, out=None, sizes=())`: launch the kernels of the module for `aligned` buffers on the
        inputs at device addresses `inputs` (in the order of `inputs`), at `sizes` of the dynamic dims,
        into the output at address `out`, or into a new CuPy array (in `shape` if given, else the
        output's at the sizes), which it returns. Temps are raw allocations from CuPy's stream-ordered
        pool, given back once launched; TMA tensor maps are kept by the addresses they were encoded
        for."""
        key = (aligned, shape)
        if key not in self._entries:
            self._entries[key] = self._entry(aligned, shape)
        return self._entries[key]

    def load_in_background(self):
        """Start loading the module on the current GPU in a thread of its own (`loaded` waits for it): the
        driver's JIT of its PTX then overlaps what the caller does next, generating a second program's module
        (an attention head's weighted sum: H100, first call 0.95 -> 0.54 s for the two modules' JIT and the
        second's generation)."""
        device = cupy().cuda.runtime.getDevice()
        self._loaded.setdefault(True, _LOADER.submit(_load_on, device, self.module))

    def loaded(self, aligned: bool = True) -> LoadedModule:
        """The module (built again for unaligned inputs unless `aligned`) as loaded on the current GPU."""
        current = self._loaded.get(aligned)
        if current is None:
            current = load_module(self.module if aligned else self._unaligned())
        elif isinstance(current, concurrent.futures.Future):
            current = current.result()
        self._loaded[aligned] = current
        return current

    def _entry(self, aligned: bool, shape: tuple[int, ...] | None) -> Callable:
        loaded = self.loaded(aligned)
        module = loaded.module
        specs = {spec.name: spec for spec in self.scratch}
        output = specs.pop(self.output)
        temps = [(name, spec) for name, spec in specs.items() if name in module.params]
        maps = [codegen_gpu.TENSOR_MAPS] if module.tensor_maps else []
        sizes = [codegen_gpu.size_variable(dim) for dim in self.dynamic.dims]
        varying = [spec.name for spec in self.inputs] + [name for name, _ in temps] + [self.output] + maps + sizes
        used = [i for i, name in enumerate(varying) if name in module.params]     # an input no kernel reads: none
        launcher = Launcher(loaded, [varying[i] for i in used])
        sources = [varying.index(copy.source) for copy in module.tensor_maps]     # where each TMA source's address is
        if sizes:
            return self._dynamic_run(launcher, [spec for _, spec in temps], output, shape, used, len(varying), sources)
        temp_bytes = [math.prod(spec.shape) * codegen_gpu.ITEM_BYTES[spec.dtype] for _, spec in temps]
        output_array = _array_maker(shape or output.shape, output.dtype)
        alloc = cupy().cuda.alloc

        def run(inputs: list[int], out: int | None = None, _sizes=()):
            result = output_array() if out is None else None
            kept = [alloc(max(nbytes, 1)) for nbytes in temp_bytes]      # alive until launched
            pointers = inputs + [temp.ptr for temp in kept]
            pointers.append(out if result is None else kernel_argument(result).data.ptr)
            if maps:
                kept.append(self.tensor_maps(module.tensor_maps, tuple([pointers[i] for i in sources])))
                pointers.append(kept[-1].data.ptr)
            launcher(pointers if len(used) == len(varying) else [pointers[i] for i in used])
            return result
        return run

    def _dynamic_run(self, launcher: Launcher, temps: list[BufferSpec], output: BufferSpec, shape, used: list[int],
                     count: int, sources: list[int]) -> Callable:
        """`run` of a module with dynamic dims: the temps, the output, the grid and the TMA tensor maps (of
        the copies' sources, at `sources` among the buffers' addresses) at a call's sizes, which follow the
        buffers' addresses (and the maps') among the launch's words."""
        copies = launcher.loaded.module.tensor_maps
        shapes = [(self.dynamic.template(spec.shape), codegen_gpu.ITEM_BYTES[spec.dtype]) for spec in temps]
        limits = [(self.dynamic.dims.index(extent.dim), extent.divisor, f"block.{axis}", launch.name)
                  for launch in launcher.loaded.module.launches
                  for axis, extent in zip("xyz", launch.grid) if isinstance(extent, ir.Size)]
        alloc = cupy().cuda.alloc
        new_array = _array_maker(None, output.dtype)          # its shape given at each call

        def run(inputs: list[int], out: int | None = None, sizes=()):
            for index, divisor, axis, name in limits:
                blocks = -(-sizes[index] // divisor)
                if blocks > templates.GRID_LIMITS[axis]:
                    raise ValueError(f"dynamic dim '{self.dynamic.dims[index]}' has size {sizes[index]}: kernel {name} "
                                     f"would launch {blocks} blocks along {axis}, over the GPU's "
                                     f"{templates.GRID_LIMITS[axis]}")
            result = new_array(shape or self.output_shape(sizes)) if out is None else None
            kept = [alloc(max(1, math.prod(self.dynamic.at(template, sizes)) * item_bytes))
                    for template, item_bytes in shapes]
            words = inputs + [temp.ptr for temp in kept] + [out if result is None else kernel_argument(result).data.ptr]
            if copies:
                kept.append(self.tensor_maps(copies, tuple([words[i] for i in sources]), tuple(sizes)))
                words.append(kept[-1].data.ptr)
            words += sizes
            launcher(words if len(used) == count else [words[i] for i in used])
            return result
        return run

    def tensor_maps(self, copies: tuple[BulkCopy, ...], sources: tuple[int, ...], sizes: tuple[int, ...] = ()):
        """The device array of the TMA copies' tensor maps for their sources at these addresses, at these
        sizes of the dynamic dims (kept by both)."""
        return self._tensor_maps.get((sources, sizes), lambda: self._encode_tensor_maps(copies, sources, sizes))

    def _encode_tensor_maps(self, copies: tuple[BulkCopy, ...], sources: tuple[int, ...], sizes: tuple[int, ...]):
        for copy, pointer in zip(copies, sources):
            if pointer % GLOBAL_ALIGN:
                raise ValueError(f"input {copy.source} starts at address {pointer:#x}, not {GLOBAL_ALIGN}-byte aligned: "
                                 f"this kernel copies it with TMA, which needs aligned tensors (pass a fresh array)")
        specs = {spec.name: spec for spec in self.inputs + self.scratch}
        shapes = {name: self.dynamic.at(self.dynamic.template(spec.shape), sizes) for name, spec in specs.items()}
        encoded = b"".join(tensor_map(copy, pointer, shapes[copy.source], specs[copy.source].strides,
                                      codegen_gpu.ITEM_BYTES[specs[copy.source].dtype])
                           for copy, pointer in zip(copies, sources))
        return cupy().asarray(np.frombuffer(encoded, dtype=np.uint8))


def checked_input(spec: BufferSpec, array, shape: tuple[int, ...] | None = None):
    """The kernel argument for an input array (copied to the device where it is on the host), where its
    shape (`shape`, for a spec with dynamic dims: at the call's sizes), dtype and strides are those of
    `spec`; else a ValueError naming both."""
    device, shape = as_device(array), spec.shape if shape is None else shape
    if device.shape != shape or device.dtype.name != spec.dtype or \
            tuple(s // device.itemsize for s in device.strides) != spec.strides:
        raise ValueError(f"GPU kernel input {spec.name} expects shape {shape}, {spec.dtype}, strides "
                         f"{spec.strides}; got {device.shape}, {device.dtype}, {device.strides}")
    return kernel_argument(device)


class GpuKernel:
    """A loop tree compiled to PTX (or its PTX read from the disk cache, `ptx_cache`) and loaded on
    the current GPU."""

    def __init__(self, tree: LoopTree, arch: str | None = None):
        self.tree, self.arch = tree, arch or device_arch()
        self.module = ptx_cache.generate(tree, self.arch)
        self.ptx, self.llvm_ir = self.module.ptx, self.module.llvm_ir
        self.runner = ModuleRunner(self.module, input_specs(tree.program), scratch_specs(tree),
                                   tree.program.output.name,
                                   lambda: ptx_cache.generate(tree, self.arch, aligned_params=False),
                                   DynamicSizes.of_program(tree.program, [buf.name for buf in tree.program.inputs]))

    def __call__(self, arrays: list, out=None):
        """Run on device (or host, copied) arrays in `program.inputs` order, into `out` if given;
        returns a CuPy array (a `BFloat16Array` for a bfloat16 result)."""
        return self.prepare(arrays, out)(out)

    def prepare(self, arrays: list, out=None, shape: tuple[int, ...] | None = None) -> Callable:
        """A call of this kernel on these arrays that does the least work each time (`ModuleRunner.prepare`;
        the result in `shape` where given)."""
        empty = [dim for dim, size in self.tree.program.sizes if size == 0]
        if empty:
            raise ValueError(f"GPU kernels do not run over dimensions of size 0 yet ({empty}); "
                             f"use .numpy() on the CPU, which returns NumPy's empty result")
        return self.runner.prepare(arrays, out, shape)


def input_specs(program: ir.Program) -> list[BufferSpec]:
    """The specs of a program's inputs, in order."""
    return [BufferSpec(b.name, tuple(b.shape), b.dtype, tuple(b.strides)) for b in program.inputs]


def scratch_specs(tree: LoopTree) -> list[BufferSpec]:
    """The specs of the buffers a GPU call allocates: the temps between kernels and the output."""
    return [BufferSpec(plan.name, tuple(plan.storage_shape), plan.dtype, ir.row_major_strides(plan.storage_shape))
            for plan in tree.buffers.values() if plan.kind in ("temp", "output")]


CACHE = KernelCache(GpuKernel, device_arch)


def kernel_for(tree: LoopTree) -> GpuKernel:
    """The cached GPU kernel of a loop tree (legality checked for non-default schedules)."""
    return CACHE.get(tree)


def target_name(arch: str | None = None) -> str:
    """The tuning database's name for a GPU (default: the current one), e.g. 'cuda-sm_90'."""
    return f"cuda-{arch or device_arch()}"


def chosen_schedule(program: ir.Program, arch: str | None = None):
    """The schedule a GPU (default: the current one) runs when none is given: the one the tuner
    stored for it, else `automatic_tree`."""
    return tuning_db.lookup(program, target_name(arch)) or automatic_tree(program, arch)


def automatic_tree(program: ir.Program, arch: str | None = None) -> LoopTree:
    """The untuned GPU schedule (`autoschedule.gpu_rules.gpu_tree`) for `arch`: the current GPU's
    facts where `arch` is it (or None), else that architecture's reference part."""
    return _automatic_tree(program, gpu_target(arch))


@functools.lru_cache(maxsize=64)
def _automatic_tree(program: ir.Program, target: GpuTarget) -> LoopTree:
    return gpu_rules.gpu_tree(program, target)


def gpu_target(arch: str | None = None) -> GpuTarget:
    """The facts the scheduler uses about the current GPU, read from its device attributes; for
    another `arch`, or with no GPU at hand, that architecture's reference part (`assumed_gpu`)."""
    try:
        current = device_arch()
    except (RuntimeError, ImportError) as err:       # no CuPy, or no GPU
        if arch is None:
            raise RuntimeError(f"no GPU to read the facts of ({err}); name an arch such as 'sm_90'") from None
        return assumed_gpu(arch)
    if arch not in (None, current):
        return assumed_gpu(arch)
    return _device_target(cupy().cuda.Device().id)


@functools.lru_cache(maxsize=8)
def _device_target(device: int) -> GpuTarget:
    cp = cupy()
    attribute = functools.partial(cp.cuda.runtime.deviceGetAttribute, device=device)
    name = cp.cuda.runtime.getDeviceProperties(device)["name"]
    return GpuTarget(device_arch(), attribute(MULTIPROCESSORS_ATTRIBUTE), attribute(THREADS_PER_SM_ATTRIBUTE),
                     attribute(REGISTERS_PER_SM_ATTRIBUTE), attribute(SHARED_PER_SM_ATTRIBUTE),
                     attribute(OPT_IN_SHARED_ATTRIBUTE), name.decode() if isinstance(name, bytes) else str(name),
                     attribute(L2_BYTES_ATTRIBUTE))


def evaluate(node, schedule) -> object:
    """Run a graph on the GPU under `schedule`; the result is a CuPy array (axes follow the dims).

    With no schedule, one the tuner stored for this GPU is used, else `automatic_tree` (through
    `prepared_call`, so calling again costs little more than the launches)."""
    if schedule is None:
        return prepared_call(node)()
    program, arrays = lowered_for(node, schedule)
    return scheduled_kernel(program, schedule).prepare(arrays)()


def scheduled_kernel(program: ir.Program, schedule) -> GpuKernel:
    """The cached GPU kernel of `program` under `schedule` (steps, JSON or a loop tree)."""
    return CACHE.get_for(program, schedule_steps(schedule), lambda: LoopTree(program, resolve_schedule(program, schedule)))


def prepared_call(node) -> Callable:
    """The call that runs a graph on the GPU with no schedule given: the schedule the tuner stored for
    this GPU, else `automatic_tree`. It is prepared once per graph (lowering, schedule, kernel, input
    checks) and kept while the graph lives and the tuning database is not written in this process."""
    generation, call = _PREPARED.get(node, (None, None))
    if generation == tuning_db.generation():
        return call
    program, arrays = lowered_for(node)
    chain = chained(program)
    if chain is None:
        call = scheduled_kernel(program, chosen_schedule(program)).prepare(arrays, shape=node.shape)
    else:
        first = scheduled_kernel(chain.first, chosen_schedule(chain.first))
        first.runner.load_in_background()
        product = scheduled_kernel(chain.product, chosen_schedule(chain.product))
        call = _chained_call(first.prepare([arrays[i] for i in chain.inputs]), product, arrays[chain.other], node.shape)
    _PREPARED[node] = (tuning_db.generation(), call)
    return call


@dataclass(frozen=True)
class Chain:
    """Two programs `.cuda()` runs for one: `first` on the original inputs at `inputs`, then `product` on
    its result (the product's first input) and the original input at `other`."""

    first: ir.Program
    inputs: tuple[int, ...]
    product: ir.Program
    other: int


def chained(program: ir.Program, arch: str | None = None) -> Chain | None:
    """A convolution as its gather and a matrix product (`gathered`), or an attention head as its weights
    and their weighted sum (`weighted_apart`, the sum split along its reduction where the SMs ask for
    it); None where the program runs whole, as it does where a tuned schedule is stored for it on this GPU
    (or on `arch`'s)."""
    if tuning_db.lookup(program, target_name(arch)) is not None:
        return None
    parts = gathered(program, arch)
    if parts is not None:
        return Chain(parts.gather, (parts.windowed,), parts.product, parts.other)
    apart = weighted_apart(program, arch)
    if apart is not None:
        return Chain(apart.first, apart.inputs, _split_k(apart.product, arch), apart.other)
    return None


def weighted_apart(program: ir.Program, arch: str | None = None) -> ir.Apart | None:
    """The weights and the weighted sum `.cuda()` runs as two programs (`gpu_rules.weights_apart`: an
    attention head whose weighted sum would read too much walked in its softmax's rows); else None."""
    try:
        target = gpu_target(arch)
    except RuntimeError:
        return None
    return gpu_rules.weights_apart(program, target)


def gathered(program: ir.Program, arch: str | None = None) -> ir.Im2col | None:
    """The gather and the matrix product `.cuda()` runs a convolution as (`ir.im2col`), where the gathered
    matrix takes at most IM2COL_BYTES and the product gets a matrix template (its accumulators in
    registers: `cache_write`) other than float32's narrow block (40 output channels: H200, session 22,
    conv 3x3 f32 6x40x33x33 0.76x torch as its own program, 0.66-0.75x gathered); else None."""
    parts = None if program.dynamic else ir.im2col(program)      # (its matrix's size would be a dynamic one's)
    if parts is None or templates.narrow_float32(parts.product):
        return None
    matrix = parts.product.inputs[0]
    if math.prod(matrix.shape) * codegen_gpu.ITEM_BYTES[matrix.dtype] > IM2COL_BYTES:
        return None
    product = _as_tree(parts.product, chosen_schedule(parts.product, arch))
    return parts if any(step[0] == "cache_write" for step in product.schedule.steps) else None


def _chained_call(first: Callable, kernel: GpuKernel, other_array, shape: tuple[int, ...]) -> Callable:
    """The call that runs `first` (a prepared call: a convolution's gather, an attention head's weights),
    then the product's `kernel` on its result (viewed as the product's first input: no copy) and
    `other_array` (viewed as its second), the product's result in `shape`."""
    matrix, other = kernel.tree.program.inputs
    viewed = _viewed(other_array, other)
    if not is_device_array(viewed):            # a host array: checked and copied at each call
        return lambda out=None: kernel.prepare([_viewed(first(), matrix), viewed], out, shape)(out)
    runner = kernel.runner
    other_pointer = checked_input(runner.inputs[1], viewed).data.ptr
    run = runner.entry(runner.aligned([0, other_pointer]), shape)      # the first's result: a fresh, aligned one

    def call(out=None):
        result = kernel_argument(first())        # alive until the product is launched
        return runner.launch(run, [result.data.ptr, other_pointer], out)
    return call


def planned_trees(node, arch: str | None = None) -> list[LoopTree]:
    """The loop trees of the programs `.cuda()` runs, in order, for a graph with no schedule given: on this GPU,
    or as it would run on `arch` (that architecture's reference part where it is not this GPU's; no GPU
    needed: `python -m bench.gpu_plan_audit` audits plans so)."""
    program, _ = lowered_for(node, arch=arch)
    chain = chained(program, arch)
    programs = [program] if chain is None else [chain.first, chain.product]
    return [_as_tree(p, chosen_schedule(p, arch)) for p in programs]


def _as_tree(program: ir.Program, schedule) -> LoopTree:
    return schedule if isinstance(schedule, LoopTree) else LoopTree(program, resolve_schedule(program, schedule))


_PREPARED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()     # graph -> (db generation, call)


def lowered_for(node, schedule=None, arch: str | None = None) -> tuple[ir.Program, list]:
    """The program `.cuda()` runs, and its inputs: with no schedule given (or the tuner's), the GPU's
    lowering (an attention head's softmax inlined into its weighted sum, which the GPU rules fuse) with
    a pointwise program's two innermost dims (or a reduction's two innermost reduced dims) flattened into one
    where every array lays them out so (`ir.flattened`: the inputs are viewed flat, no copy); or the CPU's (costly values in stages of their
    own: what `c.loop_tree()` shows) where `schedule` is a loop tree made on that one. Dynamic dims are
    planned at `planned_sizes`; split-k's parts for this GPU's SMs, or `arch`'s."""
    planned = planned_sizes(node, schedule)
    program, arrays = ir.lower(node, planned=planned)
    if schedule is None:
        flat = _split_k(ir.flattened(program), arch)
        return flat, [_viewed(array, buffer) for array, buffer in zip(arrays, flat.inputs)]
    if isinstance(schedule, LoopTree) and schedule.program != program:
        separate, same_inputs = ir.lower(node, separate_costly=True, planned=planned)
        if separate == schedule.program:
            return separate, same_inputs
    return program, arrays


def planned_sizes(node, schedule=None) -> dict[str, int]:
    """The sizes a graph's dynamic dims are planned at on the GPU: a given loop tree's own, else each
    dim's size class (`ir.size_class`) at its size in the traced arrays, so that a large batch gets the
    tiles that fill the SMs at its scale (every planned kernel still runs every size)."""
    if isinstance(schedule, LoopTree):
        return {dim: n.representative for dim, n in schedule.program.sizes if isinstance(n, ir.Size)}
    return {dim: ir.size_class(node.sizes[dim]) for dim in node.dynamic}


def _split_k(program: ir.Program, arch: str | None = None) -> ir.Program:
    """`program` with its contraction's k cut into parts (`ir.split_k`) where this GPU's SMs (or `arch`'s) ask
    for it (`autoschedule.gpu.split_k_parts`, at the sizes a dynamic dim is planned at; not where there is no
    GPU to fill)."""
    if not ir.splittable(program):
        return program
    try:
        target = gpu_target(arch)
    except RuntimeError:
        return program
    parts = templates.split_k_parts(program, target.sms, target.tensor_cores == "wgmma")
    return ir.split_k(program, parts) if parts > 1 else program


def _viewed(array, buffer: ir.Buffer):
    """`array` as `buffer` lays it out, a view of the same elements (a device array from `as_device`; a host
    array stays on the host, copied at each call). A dynamic dim's extent (`ir.Size`) is the array's own."""
    if len(array.shape) == len(buffer.shape):
        shape = tuple(size if isinstance(planned, ir.Size) else planned for size, planned in zip(array.shape, buffer.shape))
    else:                   # (a dynamic dim is the first axis of both: split-k puts its parts after it)
        shape = tuple(array.shape[0] if isinstance(planned, ir.Size) else planned for planned in buffer.shape)
    if tuple(array.shape) == shape:
        return array
    viewed = array if isinstance(array, np.ndarray) else as_device(array)
    strides = tuple(stride * viewed.itemsize for stride in buffer.strides)
    if isinstance(viewed, BFloat16Array):         # (its bits viewed so: CuPy has no bfloat16)
        return BFloat16Array(cupy().lib.stride_tricks.as_strided(viewed.bits, shape, strides))
    tricks = np.lib.stride_tricks if isinstance(viewed, np.ndarray) else cupy().lib.stride_tricks
    return tricks.as_strided(viewed, shape, strides)


def to_host(array) -> np.ndarray:
    """A NumPy copy of a device array from `as_device` (host arrays pass through)."""
    if isinstance(array, BFloat16Array):
        return array.get()
    return cupy().asnumpy(array) if is_device_array(array) else np.asarray(array)


def device_facts(array) -> tuple[tuple, int] | None:
    """(signature, device address) of a device array: its type, shape, dtype, strides and whether its
    address is 16-byte aligned, read from a PyTorch tensor's own attributes (a CuPy view of it costs
    microseconds), else from its CuPy view; None for an array on the host."""
    if _is_torch(array):
        if not array.is_cuda:
            return None
        pointer = array.data_ptr()
        return (type(array), array.shape, array.dtype, array.stride(), pointer % 16 == 0), pointer
    if not is_device_array(array):
        return None
    device = kernel_argument(as_device(array))
    pointer = device.data.ptr
    return (type(array), device.shape, device.dtype, device.strides, pointer % 16 == 0), pointer


class DeviceFunctionCall:
    """One signature of a compiled function (`lt.function`) on the GPU: the kernels of the graph traced on
    device arrays (the tuned schedule for this GPU, else `automatic_tree`; two programs where `.cuda()`
    runs two: `chained`), called on other arrays of the same signature by their addresses. The result is a PyTorch tensor where the arguments are, else a
    CuPy array; `out` (of the same kind, C-contiguous, the result's shape and dtype) takes it instead."""

    def __init__(self, node, addresses: list[int], arguments: list, names: list[str] | None = None):
        program, arrays = lowered_for(node)
        self.constants = [kernel_argument(as_device(array)) for array in arrays]       # kept alive
        pointers = [device.data.ptr for device in self.constants]

        def source(pointer: int) -> tuple[bool, int]:
            """(True, the argument it is) or (False, the address of an array the function captured)."""
            return (True, addresses.index(pointer)) if pointer in addresses else (False, pointer)
        self.shape, self.dtype = node.shape, program.output.dtype
        chain, self.first = chained(program), None
        if chain is None:
            kernel = scheduled_kernel(program, chosen_schedule(program))
            kernel.prepare(arrays)          # refuses in words what the GPU cannot run (dims of size 0)
            inputs = pointers
        else:                               # two programs, as `.cuda()` runs them (a convolution, an attention head)
            first = scheduled_kernel(chain.first, chosen_schedule(chain.first))
            first.prepare([arrays[i] for i in chain.inputs])
            self.first = (first.runner.entry(first.runner.aligned([pointers[i] for i in chain.inputs])),
                          [source(pointers[i]) for i in chain.inputs])
            kernel = scheduled_kernel(chain.product, chosen_schedule(chain.product))
            checked_input(kernel.runner.inputs[1], _viewed(arrays[chain.other], chain.product.inputs[1]))
            inputs = [0, pointers[chain.other]]       # 0: the first's result, a fresh aligned one each call
        self.order = [source(p) for p in inputs]
        self.runner = kernel.runner
        # dynamic dims: each size read from the arguments at every call (one kernel, grid sized at launch)
        names = names or [f"{i}" for i in range(len(addresses))]
        labels = [f"argument {names[i]}" if argument else "a captured array" for argument, i in self.order]
        self.dynamic = DynamicSizes.of_program(program, labels, [i if argument else None for argument, i in self.order])
        for (argument, _), buffer in zip(self.order, program.inputs):
            if not argument and buffer.dims and buffer.dims[0] in self.dynamic.dims:
                raise ValueError(f"a function on the GPU captures an array of dims {buffer.dims} over a dynamic dim; "
                                 f"its size would be fixed: pass it as an argument")
        self.run = self.runner.entry(self.runner.aligned(inputs), None if self.dynamic.dims else self.shape)
        self.new_torch_result = next((self.torch_result_maker(a) for a in arguments if _is_torch(a)), None)

    def __call__(self, addresses: list[int], out=None, arguments: list = ()):
        """Launch on the arguments at `addresses` (the arrays themselves in `arguments`, whose first axes
        give the sizes of dynamic dims), into `out` where given."""
        inputs = [addresses[i] if argument else i for argument, i in self.order]
        if self.first is not None:
            run_first, sources = self.first
            result = kernel_argument(run_first([addresses[i] if argument else i for argument, i in sources]))
            inputs[0] = result.data.ptr          # (alive until launched)
        sizes = self.dynamic.of(arguments) if self.dynamic.dims else ()
        if out is None and self.new_torch_result is None:
            return self.run(inputs, None, sizes)
        shape = self.runner.output_shape(sizes) if sizes else self.shape
        result = self.new_torch_result(shape) if out is None else self.checked(out, shape)
        address = result.data_ptr() if _is_torch(result) else kernel_argument(result).data.ptr
        run = self.run if address % 16 == 0 else self.runner.entry(self.runner.aligned(inputs + [address]))
        run(inputs, address, sizes)
        return result

    def torch_result_maker(self, like) -> Callable:
        """A function of the result's shape making an uninitialized torch tensor for it, on `like`'s device."""
        import torch
        return functools.partial(torch.empty, dtype=getattr(torch, self.dtype), device=like.device)

    def checked(self, out, shape: tuple[int, ...]):
        """`out`, where it can take the result: a device array of its shape and dtype, C-contiguous."""
        if not is_device_array(out):
            raise ValueError(f"out must be a device array (the arguments are); got {type(out).__name__}")
        contiguous = out.is_contiguous() if _is_torch(out) else kernel_argument(as_device(out)).flags.c_contiguous
        dtype = str(out.dtype).replace("torch.", "")
        if tuple(out.shape) != tuple(shape) or dtype != self.dtype or not contiguous:
            raise ValueError(f"out must be a C-contiguous device array of shape {tuple(shape)} and dtype "
                             f"{self.dtype}; got {type(out).__name__} of shape {tuple(out.shape)}, {dtype}"
                             + ("" if contiguous else ", not contiguous"))
        return out
