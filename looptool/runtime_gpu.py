"""Running loop trees on NVIDIA GPUs: PTX from codegen_gpu, loaded and launched through CuPy.

CuPy (the optional extra `looptool[gpu]`) loads PTX modules, launches kernels on
its current stream, owns device memory and speaks DLPack, so PyTorch tensors and
CuPy arrays come in without copies; cuda-python would need all of that by hand.
"""
from __future__ import annotations

import numpy as np

from . import codegen_gpu, ir
from .looptree import LoopTree

_CACHE = None


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


def is_device_array(data) -> bool:
    """True for CUDA arrays (CuPy, PyTorch, anything with __cuda_array_interface__)."""
    return hasattr(data, "__cuda_array_interface__")


def as_device(data):
    """A CuPy view of a CUDA array (no copy), or a host array copied to the GPU."""
    cp = cupy()
    return cp.asarray(data)


class GpuKernel:
    """A loop tree compiled to PTX and loaded on the current GPU."""

    def __init__(self, tree: LoopTree, arch: str | None = None):
        self.tree = tree
        self.module = codegen_gpu.generate(tree, arch or device_arch())
        self.ptx, self.llvm_ir = self.module.ptx, self.module.llvm_ir
        cp = cupy()
        self._cuda_module = cp.cuda.function.Module()
        self._cuda_module.load(self.module.ptx.encode())
        self._functions = [self._cuda_module.get_function(k.name) for k in self.module.launches]

    def __call__(self, arrays: list, out=None):
        """Run on device (or host, copied) arrays in `program.inputs` order; returns a CuPy array."""
        cp = cupy()
        program = self.tree.program
        memory = {}
        for buf, array in zip(program.inputs, arrays):
            device = as_device(array)
            if device.shape != buf.shape or device.dtype.name != buf.dtype or \
                    tuple(s // device.itemsize for s in device.strides) != buf.strides:
                raise ValueError(f"GPU kernel input {buf.name} expects shape {buf.shape}, {buf.dtype}, strides "
                                 f"{buf.strides}; got {device.shape}, {device.dtype}, {device.strides}")
            memory[buf.name] = device
        for plan in self.tree.buffers.values():
            if plan.kind in ("temp", "output"):
                memory[plan.name] = cp.empty(plan.shape, dtype=plan.dtype)
        if out is not None:
            memory[program.output.name] = out
        args = tuple(memory[name] for name in self.module.params)
        for launch, function in zip(self.module.launches, self._functions):
            function(launch.grid, launch.block, args)
        return memory[program.output.name]


def kernel_for(tree: LoopTree) -> GpuKernel:
    """The cached GPU kernel of a loop tree (legality checked for non-default schedules)."""
    return _cache().get(tree)


def _cache():
    global _CACHE
    if _CACHE is None:
        from .runtime import KernelCache
        _CACHE = KernelCache(GpuKernel, device_arch)
    return _CACHE


def evaluate(node, schedule) -> object:
    """Run a graph on the GPU under `schedule`; the result is a CuPy array (axes follow the dims)."""
    from .runtime import _schedule_for, _steps_of
    program, arrays = ir.lower(node, on_device=True)
    kernel = _cache().get_for(program, _steps_of(schedule),
                              lambda: LoopTree(program, _schedule_for(program, schedule)))
    return kernel(arrays)


def to_host(array) -> np.ndarray:
    """A NumPy copy of a device array (host arrays pass through)."""
    return cupy().asnumpy(array) if is_device_array(array) else np.asarray(array)
