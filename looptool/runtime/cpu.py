"""Compiling, caching and calling kernels on NumPy arrays."""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import math
import os
import time
import weakref
from dataclasses import dataclass
from typing import Callable

import llvmlite.binding as llvm
import numpy as np

from .. import ir
from ..analysis import target as target_model
from ..autoschedule import auto_tree
from ..codegen import cpu as codegen_cpu
from ..codegen.llvm import ITEM_BYTES
from ..frontend import graph
from ..schedule import LoopTree
from . import interpreter, threadpool, tuning_db
from .cache import KernelCache
from .checked_entry import Entry, array_fields, data_offset, entry_ir
from .gpu import to_host
from .schedules import resolve_schedule, schedule_steps
from .sizes import DynamicSizes

ALIGNMENT = 64
# a made buffer this small is not aligned to ALIGNMENT: aligning costs 1.3 us a call over np.empty's
# 0.2 (numpy's own blocks are 16-byte aligned), more than split cache lines cost its stores
ALIGNED_FROM_BYTES = 1 << 16
_THREADS = [os.cpu_count() or 1]


def set_num_threads(n: int) -> None:
    """Threads that parallel loops use in kernels compiled from now on (default: all cores)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"set_num_threads: need a positive integer, got {n!r}")
    _THREADS[0] = n


def get_num_threads() -> int:
    """Threads that parallel loops use."""
    return _THREADS[0]


@dataclass(frozen=True)
class KernelObject:
    """A loop tree's kernel compiled to object code for this host: it loads in any process on it
    (the tuner compiles candidates in one process and runs them in another)."""

    params: tuple[str, ...]
    llvm_ir: str
    optimized_ir: str
    code: bytes
    seconds: float


def compile_object(tree: LoopTree, threads: int) -> KernelObject:
    """Generate, optimize (O3) and assemble the kernel of `tree` for this CPU, `threads` for its
    parallel loops."""
    start = time.perf_counter()
    target = codegen_cpu.HostTarget.get()
    with _collected_young():
        source = codegen_cpu.generate(tree, target.triple, threads)
        params, llvm_ir = tuple(source.params), str(source.module)
        del source
    machine = target.new_machine()
    module = target.optimize(llvm_ir, machine)
    return KernelObject(params, llvm_ir, str(module), machine.emit_object(module), time.perf_counter() - start)


@contextlib.contextmanager
def _collected_young():
    """Python's cycle collector paused while the block builds and prints an LLVM module, then run once
    over the young objects. A module is about 10^5 objects in cycles (values and their blocks point to
    each other); left on, the collector ran dozens of times while one was built, moved it to the oldest
    generation, and freed it only in full collections: 20-30 ms of a 512³ matmul kernel's compile."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.collect(0)


class Kernel:
    """A compiled loop tree: call it with the input arrays (in `program.inputs` order).  `compiled`
    is its object code when it was compiled elsewhere (`compile_object`)."""

    def __init__(self, tree: LoopTree, threads: int, compiled: KernelObject | None = None):
        compiled = compiled or compile_object(tree, threads)
        start = time.perf_counter()
        threadpool.ensure_loaded()
        self.tree, self.params = tree, list(compiled.params)
        self.llvm_ir, self.optimized_ir = compiled.llvm_ir, compiled.optimized_ir
        self._assembly = None
        self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), codegen_cpu.HostTarget.get().new_machine())
        self._engine.add_object_file(llvm.ObjectFileRef.from_data(compiled.code))
        self._engine.finalize_object()
        self._address = self._engine.get_function_address("kernel")
        self._array_entry = None
        program = tree.program
        # Per call only these are compared and allocated (a call of a small kernel is dominated by it).
        self._inputs = [(buf, np.dtype(buf.dtype), tuple(s * np.dtype(buf.dtype).itemsize for s in buf.strides))
                        for buf in program.inputs]
        # where each dynamic dim's size is read: the first axis of the inputs that have it
        self.dynamic = DynamicSizes.of_program(program, [buf.name for buf in program.inputs])
        self._shapes = [self.dynamic.template(buf.shape) for buf in program.inputs]
        self._made = [(plan.name, self.dynamic.template(plan.storage_shape), plan.dtype) for plan in tree.buffers.values()
                      if plan.kind in ("temp", "output")]
        self._output = program.output.name
        self.compile_seconds = compiled.seconds + time.perf_counter() - start

    @property
    def array_entry(self):
        """The compiled function, called with the NumPy arrays themselves (in `params` order), then the
        sizes of the dynamic dims (`dynamic.dims` order): a shim reads each array's data pointer, a few
        nanoseconds where `ndarray.ctypes.data` costs a microsecond. The caller vouches that every argument
        is an ndarray of the shape, dtype and strides compiled for, at those sizes (`__call__` checks them).
        Built on first use (about 3 ms)."""
        if self._array_entry is None:
            self._array_entry = _array_shim(self._engine, self._address, len(self.params), len(self.dynamic.dims))
        return self._array_entry

    def checked_entry(self, entry: Entry):
        """A ctypes function of the array objects `entry` plans for, that checks them and runs the kernel
        (0), or refuses (1): see `checked_entry`. None where ndarray's fields were not found."""
        fields = array_fields()
        if fields is None:
            return None
        text, name = entry_ir(entry, self._address, fields)
        kind = ctypes.CFUNCTYPE(ctypes.c_int32, *[ctypes.py_object] * len(entry.arrays))
        return _add_function(self._engine, text, name, kind)

    @property
    def assembly(self) -> str:
        """Native assembly of the optimized kernel (made on first use: it costs a backend run)."""
        if self._assembly is None:
            target = codegen_cpu.HostTarget.get()
            module = llvm.parse_assembly(self.optimized_ir)
            self._assembly = target.new_machine().emit_assembly(module)
        return self._assembly

    @property
    def loop_tree(self) -> LoopTree:
        return self.tree

    def __call__(self, arrays: list[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """Run on the input arrays; write into `out` (C-contiguous, right shape and dtype) if given."""
        if len(arrays) != len(self._inputs):
            raise ValueError(f"kernel takes {len(self._inputs)} input arrays, got {len(arrays)}")
        for (buf, _, _), array in zip(self._inputs, arrays):
            if not isinstance(array, np.ndarray) or array.ndim != len(buf.shape):
                raise _input_mismatch(buf, array)
        sizes = self.dynamic.of(arrays)
        memory = {}
        for (buf, dtype, strides), shape, array in zip(self._inputs, self._shapes, arrays):
            if array.shape != self.dynamic.at(shape, sizes) or array.dtype != dtype \
                    or array.strides != strides or not array.flags.aligned:
                raise _input_mismatch(buf, array)
            memory[buf.name] = array
        for name, shape, dtype in self._made:
            memory[name] = buffer_array(self.dynamic.at(shape, sizes), dtype)
            if name == self._output and out is not None:
                check_output(memory[name].shape, dtype, out,
                             {buf.name: array for buf, array in zip(self.tree.program.inputs, arrays)})
                memory[name] = out
        self.array_entry(*[memory[name] for name in self.params], *sizes)
        return memory[self._output]


def _array_shim(engine, kernel_address: int, count: int, sizes: int = 0):
    """A function of `count` ndarray objects and `sizes` integers that calls the kernel at `kernel_address`
    with the arrays' data pointers (read at `data_offset()` in each object) and the integers, as a ctypes
    function of `py_object`s and `int64`s."""
    args = ", ".join([f"ptr %a{i}" for i in range(count)] + [f"i64 %s{i}" for i in range(sizes)])
    body = "".join(f"  %g{i} = getelementptr i8, ptr %a{i}, i64 {data_offset()}\n  %d{i} = load ptr, ptr %g{i}\n"
                   for i in range(count))
    call = ", ".join([f"ptr %d{i}" for i in range(count)] + [f"i64 %s{i}" for i in range(sizes)])
    text = (f"define void @kernel_arrays({args}) {{\n{body}  %f = inttoptr i64 {kernel_address} to ptr\n"
            f"  call void %f({call})\n  ret void\n}}\n")
    return _add_function(engine, text, "kernel_arrays",
                         ctypes.CFUNCTYPE(None, *[ctypes.py_object] * count, *[ctypes.c_int64] * sizes))


def _add_function(engine, text: str, name: str, kind):
    """Function `name` of LLVM IR `text`, compiled into `engine`, as a ctypes function of type `kind`."""
    module = llvm.parse_assembly(text)
    module.triple = codegen_cpu.HostTarget.get().triple
    engine.add_module(module)
    engine.finalize_object()
    return kind(engine.get_function_address(name))


def _input_mismatch(buf: ir.Buffer, array: np.ndarray) -> ValueError:
    """The error for an input array that is not the buffer the kernel was compiled for."""
    if not isinstance(array, np.ndarray):
        return ValueError(f"kernel input {buf.name} must be a NumPy array, got {type(array).__name__}")
    shape = "(" + ", ".join(map(str, buf.shape)) + ("," if len(buf.shape) == 1 else "") + ")"
    return ValueError(f"kernel input {buf.name} expects shape {shape}, dtype {buf.dtype}, strides "
                      f"{buf.strides}, aligned; got shape {array.shape}, dtype {array.dtype}, strides "
                      f"{array.strides}, aligned: {array.flags.aligned}")


def check_output(shape: tuple[int, ...], dtype: str, out: np.ndarray, inputs: dict[str, np.ndarray]):
    """`out` must be a writeable, aligned, C-contiguous array of the output's shape and dtype that
    shares no memory with an input (by name; the kernel writes it while it still reads them)."""
    if not isinstance(out, np.ndarray):
        raise ValueError(f"out must be a NumPy array, got {type(out).__name__}")
    if out.shape != shape or out.dtype.name != dtype or not out.flags.c_contiguous \
            or not out.flags.aligned:
        raise ValueError(f"out must be an aligned, C-contiguous {dtype} array of shape {shape}; got "
                         f"{out.dtype} {out.shape} (contiguous: {out.flags.c_contiguous}, aligned: "
                         f"{out.flags.aligned})")
    if not out.flags.writeable:
        raise ValueError(f"out (shape {out.shape}) is read-only: the kernel writes its result there")
    for name, array in inputs.items():
        if np.may_share_memory(out, array) and np.shares_memory(out, array):
            raise ValueError(f"out shares memory with input {name} (shape {array.shape}): the kernel would "
                             f"overwrite the input while reading it; pass a separate array")


def aligned_empty(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    raw = np.empty(count + -(-ALIGNMENT // dtype.itemsize), dtype=dtype)
    start = (-data_address(raw) % ALIGNMENT) // dtype.itemsize
    return raw[start:start + count].reshape(shape)


def buffer_array(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """A temp or output buffer of a call: `aligned_empty` from ALIGNED_FROM_BYTES up, else np.empty."""
    small = math.prod(shape) * ITEM_BYTES[dtype] < ALIGNED_FROM_BYTES
    return np.empty(shape, dtype) if small else aligned_empty(shape, dtype)


def data_address(array: np.ndarray) -> int:
    """The address of an ndarray's data, read from the object (`data_offset`): a fifth of the time
    `array.ctypes.data` takes."""
    return ctypes.c_void_p.from_address(id(array) + data_offset()).value


CACHE = KernelCache(lambda tree: Kernel(tree, _THREADS[0]), lambda: _THREADS[0])


def cache_info() -> dict:
    """Kernel cache statistics: hits, misses (= compilations) and size."""
    return {"hits": CACHE.hits, "misses": CACHE.misses, "size": len(CACHE._kernels)}


def clear_cache():
    """Forget every compiled kernel and reset the statistics."""
    CACHE.clear()


def lower_on_host(node: graph.Node) -> tuple[ir.Program, list[np.ndarray]]:
    """Lower a graph for the CPU: its Program and input arrays, device arrays copied to the host, a
    transcendental value that two reductions read and a costly factor of a contraction computed once,
    in stages of their own (`ir.lower`'s `separate_costly`)."""
    return ir.lower(node, to_host, separate_costly=True)


def loop_tree_of(node: graph.Node, schedule=None) -> LoopTree:
    """The loop tree of a graph under a schedule (a Schedule, LoopTree, or JSON text)."""
    program, _ = lower_on_host(node)
    return LoopTree(program, resolve_schedule(program, schedule))


_AUTO: dict[tuple[ir.Program, int], LoopTree] = {}


def auto_schedule(tensor) -> LoopTree:
    """The automatic schedule of a tensor's computation for this CPU and `get_num_threads()` threads,
    as a loop tree (`explain()` says why); chosen once per computation and thread count."""
    program, _ = lower_on_host(tensor.node)
    return automatic_tree(program)


def automatic_tree(program: ir.Program) -> LoopTree:
    """The memoized automatic loop tree of a program for this CPU and the current thread count."""
    key = (program, _THREADS[0])
    if key not in _AUTO:
        _AUTO[key] = auto_tree(program, target_model.host().with_cores(_THREADS[0]))
    return _AUTO[key]


def chosen_schedule(program: ir.Program):
    """What runs when no schedule is given: the tuned schedule stored for this workload and CPU,
    else the automatic one."""
    return chosen_tree(program).schedule


def chosen_tree(program: ir.Program) -> LoopTree:
    """`chosen_schedule` as a loop tree: the automatic one keeps its `explain()`."""
    tuned = tuning_db.lookup(program, codegen_cpu.HostTarget.get().name)
    return LoopTree(program, resolve_schedule(program, tuned)) if tuned is not None else automatic_tree(program)


def kernel_for(node: graph.Node, schedule=None) -> Kernel:
    """The compiled kernel for a graph (no schedule: `chosen_schedule`), from the cache when it was built before."""
    program, _ = lower_on_host(node)
    return _cached_kernel(program, schedule)


def evaluate(node: graph.Node, schedule=None) -> np.ndarray:
    """Compile (cached) and run a graph; the result's axes follow the graph's dims.

    With no schedule given, the tuned schedule stored for this workload is used, else the automatic one
    (through `prepared_call`, so calling again costs little more than the kernel)."""
    if schedule is None:
        return prepared_call(node)()
    program, arrays = lower_on_host(node)
    return _cached_kernel(program, schedule)(arrays)


def prepared_call(node: graph.Node) -> Callable[[], np.ndarray]:
    """The call that runs a graph with no schedule given: lowered, scheduled and compiled once, and kept
    while the graph lives, the thread count is unchanged and this process stores no tuned schedule. A graph
    whose lowered inputs are not its own arrays (device arrays brought to the host, misaligned ones copied)
    is not kept: each call lowers it again, so the copies are never stale."""
    key = (tuning_db.generation(), _THREADS[0])
    kept = _PREPARED.get(node)
    if kept is not None and kept[0] == key:
        return kept[1]
    program, arrays = lower_on_host(node)
    call = functools.partial(_cached_kernel(program, None), arrays)
    if _own_arrays(node, arrays):
        _PREPARED[node] = (key, call)
    return call


_PREPARED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()     # graph -> ((db generation, threads), call)


def _own_arrays(node: graph.Node, arrays: list) -> bool:
    """Whether every lowered input is one of the graph's own arrays, used in place."""
    own, todo, seen = set(), [node], set()
    while todo:
        here = todo.pop()
        if id(here) in seen:
            continue
        seen.add(id(here))
        if isinstance(here, graph.Input):
            own.add(id(here.array))
        todo.extend(here.children())
    return all(id(array) in own for array in arrays)


def _cached_kernel(program: ir.Program, schedule) -> Kernel:
    """The kernel of `program` under `schedule` (None: `chosen_schedule`); a cache hit builds no tree."""
    if schedule is None:
        schedule = chosen_schedule(program)
    return CACHE.get_for(program, schedule_steps(schedule),
                         lambda: LoopTree(program, resolve_schedule(program, schedule)))


def interpret(tensor, schedule=None) -> np.ndarray:
    """Run a tensor's computation with the NumPy reference interpreter (no compilation)."""
    program, arrays = lower_on_host(tensor.node)
    return interpreter.interpret(LoopTree(program, resolve_schedule(program, schedule)), arrays)


def _load_system_libraries():
    """libm for exp/log, libpthread for parallel loops (part of libc on new glibc), libgcc_s for
    float16 conversions on CPUs without instructions for them (x86 without F16C)."""
    for lib in ("m", "pthread", "gcc_s"):
        name = ctypes.util.find_library(lib)
        if name:
            llvm.load_library_permanently(name)


_load_system_libraries()
