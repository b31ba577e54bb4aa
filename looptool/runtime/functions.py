"""Compiled functions: `lt.function` turns a Python function of named tensors into one that takes
arrays, traces it once per signature of its arguments (shapes, dtypes, strides) and then calls the
compiled kernel directly: the arguments are checked by one tuple comparison and passed by address,
with no lowering, graph or dictionary per call.

    m, k, n = lt.symbols("m k n")

    @lt.function
    def matmul(a: lt.In[m, k], b: lt.In[k, n]):
        return (a * b).sum(k)

    c = matmul(a_np, b_np)

On device arrays (CuPy, PyTorch CUDA tensors, DLPack) the same function runs on the GPU: traced once per
signature, then launched on the arrays' addresses (`gpu.DeviceFunctionCall`), returning a PyTorch tensor
for PyTorch arguments, else a CuPy array.
"""
from __future__ import annotations

import functools
import inspect
import math
import sys
import weakref

import numpy as np

from ..frontend import Tensor
from .. import ir
from ..ir.lowering import graph_nodes
from ..schedule import LoopTree
from . import gpu
from .checked_entry import Address, Dim, Entry, Expected
from .cpu import (ALIGNED_FROM_BYTES, Kernel, aligned_empty, buffer_array, check_output, chosen_tree, data_address,
                  kernel_for, loop_tree_of, lower_on_host)
from .sizes import DynamicSizes


class In:
    """A parameter's dims, as its annotation: `a: lt.In[m, k]` (the symbols, outermost first)."""

    def __init__(self, dims: tuple):
        self.dims = dims

    def __class_getitem__(cls, dims) -> "In":
        return cls(dims if isinstance(dims, tuple) else (dims,))

    def __repr__(self):
        return f"lt.In[{', '.join(str(d) for d in self.dims)}]"


def function(fn) -> "Function":
    """`fn`, a function of named tensors whose parameters are annotated with their dims (`lt.In[...]`),
    as a compiled function of arrays (see the module's docstring)."""
    return Function(fn, sys._getframe(1).f_locals)


class Function:
    """A traced, compiled function: call it with arrays (NumPy, or anything `np.asarray` takes) in the
    order of its parameters, and optionally `out=` (an aligned C-contiguous array of the result's
    shape and dtype). Each new signature (shapes, dtypes, strides of the arguments) is traced once and
    compiled with the schedule `use_schedule` set for it, else the tuned schedule stored for it, else the
    automatic one, as `Tensor.numpy()` does."""

    def __init__(self, fn, scope: dict | None = None):
        # `scope`: the names where `fn` was decorated, for annotations kept as strings
        # (`from __future__ import annotations`) that name symbols local to a function
        annotations = inspect.get_annotations(fn, eval_str=True, locals=scope)
        self.fn = fn
        self.params: list[tuple[str, In]] = []
        for name in inspect.signature(fn).parameters:
            spec = annotations.get(name)
            if not isinstance(spec, In):
                raise TypeError(f"lt.function: parameter {name!r} of {fn.__name__} needs its dims as an annotation, "
                                f"e.g. {name}: lt.In[m, k]")
            self.params.append((name, spec))
        self._calls: dict[tuple, _Call] = {}
        self._last_trace: list[weakref.ref] = []       # the host arrays of the latest trace, not kept alive
        self._fast: _Call | None = None                 # the latest host call's signature, tried first
        self._schedules: dict[tuple, object] = {}       # signature -> the schedule `use_schedule` set
        # per parameter, whether its first dim is dynamic (its size is then left out of the signature);
        # empty where none is
        leading = [bool(spec.dims) and getattr(spec.dims[0], "dynamic", False) for _, spec in self.params]
        self._leading = leading if any(leading) else []
        functools.update_wrapper(self, fn)

    def __call__(self, *arrays, out=None):
        """The function on these arrays (into `out` where given): through the latest host signature's
        checked entry when they fit it, else checked in Python (`_checked_call`)."""
        fast = self._fast
        if fast is not None:                 # the latest host signature's checked entry: one ctypes call
            result = fast.run(arrays, out)
            if result is not None:
                return result
        return self._checked_call(arrays, out)

    def _checked_call(self, arrays: tuple, out):
        """A call checked in Python: the signature looked up (traced when new), each argument checked
        with errors in words, and the signature's checked entry kept for the next call."""
        self._check_count(arrays)
        for a in arrays:
            if type(a) is not np.ndarray:
                if gpu.is_device_array(a):
                    self._fast = None
                    return self._on_gpu(arrays, out)
                arrays = [np.asarray(a) for a in arrays]
                break
        key = self._signature(arrays)
        call = self._calls.get(key)
        if call is None:
            call = self._calls[key] = self._traced(arrays)
        result = call(arrays, out)
        self._fast = call if call.checked is not None else None
        return result

    def _signature(self, arrays) -> tuple:
        """The signature of host arrays: each one's shape, dtype and strides (a dynamic first size left out:
        one kernel serves every size)."""
        if self._leading:
            return tuple([(a.shape[1:] if lead else a.shape, a.dtype, a.strides)
                          for a, lead in zip(arrays, self._leading)])
        return tuple([(a.shape, a.dtype, a.strides) for a in arrays])

    def use_schedule(self, schedule, *arrays) -> None:
        """From now on, run calls of these host arrays' signature under `schedule` (a LoopTree, a Schedule
        or its JSON text: e.g. the notebook editor's, `ScheduleEditor.use()`) instead of the tuned or
        automatic one; None goes back to those. Compiled now: a schedule that is illegal (for any size
        of a dynamic dim) is refused here, and the signature keeps what it ran before."""
        self._check_count(arrays)
        if any(gpu.is_device_array(a) for a in arrays):
            raise TypeError(f"{self.fn.__name__}.use_schedule takes host arrays (CPU schedules); got device arrays")
        arrays = [np.asarray(a) for a in arrays]
        key = self._signature(arrays)
        before = self._schedules.pop(key, None)
        if schedule is not None:
            self._schedules[key] = schedule
        try:
            call = self._traced(arrays)
        except Exception:
            self._schedules.pop(key, None)
            if before is not None:
                self._schedules[key] = before
            raise
        self._calls[key], self._fast = call, None

    def _schedule_for(self, arrays) -> object:
        """The schedule `use_schedule` set for these host arrays' signature, else None (tuned or automatic)."""
        if not self._schedules or any(gpu.is_device_array(a) for a in arrays):
            return None
        return self._schedules.get(self._signature([np.asarray(a) for a in arrays]))

    def last_example(self) -> tuple | None:
        """The arrays of the latest call on the host that traced a new signature, while they are all still
        alive (the function keeps no reference that holds them); None when there is none."""
        arrays = tuple(ref() for ref in self._last_trace)
        return arrays if arrays and all(a is not None for a in arrays) else None

    def tensor(self, *arrays) -> Tensor:
        """The function's result on these arrays, as a lazy tensor (traced, not run)."""
        self._check_count(arrays)
        return self._result([self._named(a, name, spec) for a, (name, spec) in zip(arrays, self.params)])

    def _check_count(self, arrays):
        if len(arrays) != len(self.params):
            raise TypeError(f"{self.fn.__name__} takes {len(self.params)} arrays "
                            f"({', '.join(name for name, _ in self.params)}), got {len(arrays)}")

    def _result(self, tensors: list[Tensor]) -> Tensor:
        result = self.fn(*tensors)
        if not isinstance(result, Tensor):
            raise TypeError(f"{self.fn.__name__} must return an lt.Tensor, got {type(result).__name__}")
        return result

    def loop_tree(self, *arrays) -> LoopTree:
        """The loop tree that runs for arrays of these arrays' signature: the one `use_schedule` set, else
        the tuned one stored for it, else the automatic one (its `explain()` says why)."""
        node, schedule = self.tensor(*arrays).node, self._schedule_for(arrays)
        return chosen_tree(lower_on_host(node)[0]) if schedule is None else loop_tree_of(node, schedule)

    def explain(self, *arrays) -> str:
        """Why the loop tree that runs for these arrays' signature looks as it does."""
        return self.loop_tree(*arrays).explain()

    def kernel(self, *arrays) -> Kernel:
        """The compiled kernel for arrays of these arrays' signature (`.llvm_ir`, `.assembly`, `.loop_tree`)."""
        return kernel_for(self.tensor(*arrays).node, self._schedule_for(arrays))

    def _on_gpu(self, arrays, out):
        """The call on device arrays (CuPy, PyTorch, DLPack): traced once per signature (`gpu.device_facts`),
        then launched on the arrays' addresses (`gpu.DeviceFunctionCall`)."""
        facts = [gpu.device_facts(a) for a in arrays]
        if None in facts:
            name = self.params[facts.index(None)][0]
            raise TypeError(f"{self.fn.__name__}: argument {name} is on the host while others are on the GPU; "
                            f"pass every argument on one device")
        signatures = [signature for signature, _ in facts]
        if self._leading:       # a dynamic first dim's size stands by its size class: the size its kernel is planned at
            signatures = [(kind, (ir.size_class(shape[0]), *shape[1:]) if lead else shape, *rest)
                          for (kind, shape, *rest), lead in zip(signatures, self._leading)]
        key = tuple(signatures)
        addresses = [address for _, address in facts]
        call = self._calls.get(key)
        if call is None:
            tensors = [self._named(a, name, spec) for a, (name, spec) in zip(arrays, self.params)]
            call = self._calls[key] = gpu.DeviceFunctionCall(self._result(tensors).node, addresses, list(arrays),
                                                             [name for name, _ in self.params])
        return call(addresses, out, arrays)

    def _named(self, data, name: str, spec: In) -> Tensor:
        try:
            return Tensor(data if gpu.is_device_array(data) else np.asarray(data)).to(*spec.dims)
        except ValueError as err:
            raise ValueError(f"{self.fn.__name__}, argument {name} ({spec!r}): {err}") from None

    def _traced(self, arrays: list[np.ndarray]) -> "_Call":
        self._last_trace = [weakref.ref(a) for a in arrays]
        views = [a.view() for a in arrays]             # distinct objects: each parameter found among the inputs
        tensors = [self._named(view, name, spec) for view, (name, spec) in zip(views, self.params)]
        node = self._result(tensors).node
        program, inputs = lower_on_host(node)
        slots = {buf.name: _slot(array, views) for buf, array in zip(program.inputs, inputs)}
        found = {slot for slot in slots.values() if isinstance(slot, int)}
        used = {id(each) for each in graph_nodes(node)}
        for index, ((name, _), tensor) in enumerate(zip(self.params, tensors)):
            if id(tensor.node) in used and index not in found:    # copied while lowering: frozen into the kernel
                raise RuntimeError(f"{self.fn.__name__}: argument {name} was copied while lowering, so later calls "
                                   f"could not pass it by address")
        for buf in program.inputs:
            if not isinstance(slots[buf.name], int) and set(buf.dims) & set(dict(program.dynamic)):
                raise ValueError(f"{self.fn.__name__} captures an array of dims {buf.dims} (shape "
                                 f"{slots[buf.name].shape}) over a dynamic dim; its size would be fixed: pass it as "
                                 f"an argument")
        kernel = kernel_for(node, self._schedules.get(self._signature(arrays)))
        return _Call(kernel, slots, [name for name, _ in self.params], arrays, self._leading)


def _slot(array: np.ndarray, views: list[np.ndarray]):
    """A kernel input's source: the index of the argument it is, or the array itself (a constant the
    function captured)."""
    return next((index for index, view in enumerate(views) if view is array), array)


class _Call:
    """One signature's compiled call: the kernel's arguments in its parameter order (the caller's
    arrays, captured constants, buffers made per call). `run` passes the array objects to the kernel's
    checked entry, which checks them against the signature in machine code; `__call__` checks in Python
    (after the signature was looked up: alignment, dynamic sizes, `out`) with errors in words, then
    passes them to the kernel's `array_entry`."""

    def __init__(self, kernel: Kernel, slots: dict, names: list[str], arrays: list[np.ndarray],
                 leading: list[bool]):
        self.kernel, self.entry, self.names = kernel, kernel.array_entry, names
        plans = kernel.tree.buffers
        self.output = kernel.tree.program.output.name
        self.order = []                  # per kernel parameter: argument index, constant, or buffer to make
        program = kernel.tree.program
        # each dynamic dim's size is read from the arguments (constants over dynamic dims are refused when traced)
        positions = [slots[buf.name] if isinstance(slots[buf.name], int) else None for buf in program.inputs]
        self.dynamic = DynamicSizes.of_program(program, [f"argument {names[p]}" if p is not None else
                                                         "a captured array" for p in positions], positions)
        for name in kernel.params:
            if name in slots:
                self.order.append(slots[name])
            else:
                self.order.append((self.dynamic.template(plans[name].storage_shape), plans[name].dtype, name == self.output))
        self.arguments = sorted({s for s in self.order if isinstance(s, int)})
        self.count = len(names)
        self.checked = self._checked_entry(arrays, leading or [False] * len(arrays))

    def _checked_entry(self, arrays: list[np.ndarray], leading: list[bool]):
        """The kernel's checked entry for this signature (`checked_entry`): every argument's type, shape
        (a dynamic first size read, compared where dims are shared), strides, dtype and alignment, then
        the output (made here, or the caller's `out`) and the buffers made per call; with the makers of
        those buffers (`make_output`, `make_temps`). None where the output is no kernel parameter."""
        made = [slot for slot in self.order if type(slot) is tuple]
        if not any(is_output for _, _, is_output in made):
            return None
        made.sort(key=lambda slot: not slot[2])                          # the output first
        dim_of = {position: index for index, sources in enumerate(self.dynamic.sources) for position, _ in sources}
        expected = []
        for position, (array, lead) in enumerate(zip(arrays, leading)):
            if position in dim_of:              # read or compared
                shape = (Dim(dim_of[position]),) + array.shape[1:]
            elif lead:                          # left out of the signature, not read by the kernel
                shape = (None,) + array.shape[1:]
            else:
                shape = array.shape
            expected.append(Expected(shape, array.strides, array.dtype))
        self.make_output, *self.make_temps = [_maker(template, dtype, self.dynamic) for template, dtype, _ in made]
        for template, dtype, is_output in made:
            rest, index, _ = template        # (an output: its dynamic axis is the whole dim)
            expected.append(Expected(rest if index is None else (Dim(index),) + rest, None, np.dtype(dtype))
                            if is_output else None)
        objects = {id(slot): len(arrays) + i for i, slot in enumerate(made)}
        kernel_args = tuple(slot if type(slot) is int else objects[id(slot)] if type(slot) is tuple
                            else Address(data_address(slot)) for slot in self.order)
        return self.kernel.checked_entry(Entry(tuple(expected), len(arrays), kernel_args,
                                               tuple(self.dynamic.minimum[dim] for dim in self.dynamic.dims)))

    def run(self, arrays: tuple, out) -> np.ndarray | None:
        """The call through the checked entry: the result, or None where it refused (or the arrays are
        not even arrays), for the caller to check in Python."""
        if len(arrays) != self.count:
            return None
        try:
            if out is None:
                out = self.make_output(arrays)
            temps = [make(arrays) for make in self.make_temps] if self.make_temps else ()
        except (AttributeError, IndexError, TypeError):
            return None
        return out if self.checked(*arrays, out, *temps) == 0 else None

    def __call__(self, arrays: list[np.ndarray], out=None) -> np.ndarray:
        for index in self.arguments:
            if not arrays[index].flags.aligned:
                raise ValueError(f"argument {self.names[index]} (shape {arrays[index].shape}) is not aligned to "
                                 f"its {arrays[index].dtype} elements")
        sizes = self.dynamic.of(arrays) if self.dynamic.dims else ()
        result, objects = None, []
        for slot in self.order:
            if type(slot) is int:
                objects.append(arrays[slot])
            elif type(slot) is tuple:
                shape, dtype, is_output = slot
                shape = self.dynamic.at(shape, sizes)
                if is_output and out is not None:
                    check_output(shape, dtype, out, dict(zip(self.names, arrays)))
                    made = out
                else:
                    made = buffer_array(shape, dtype)
                result = made if is_output else result
                objects.append(made)
            else:
                objects.append(slot)
        self.entry(*objects, *sizes)
        return result


def _maker(template: tuple, dtype: str, dynamic: DynamicSizes):
    """A function of a call's arrays that makes a buffer of planned shape `template` (`DynamicSizes.template`:
    a dynamic first size, ceil(n / divisor), is read from the argument the call reads it from)."""
    rest, index, divisor = template
    dtype = np.dtype(dtype)
    row = math.prod(rest) * dtype.itemsize      # bytes: the whole buffer, or one value of its dynamic first axis
    if index is None:
        return (lambda arrays: np.empty(rest, dtype)) if row < ALIGNED_FROM_BYTES else \
            (lambda arrays: aligned_empty(rest, dtype))
    position = dynamic.sources[index][0][0]

    def make(arrays):
        rows = -(-arrays[position].shape[0] // divisor)
        return (np.empty if rows * row < ALIGNED_FROM_BYTES else aligned_empty)((rows, *rest), dtype)
    return make
