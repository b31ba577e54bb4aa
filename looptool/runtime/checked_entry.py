"""A kernel's checked entry: a few dozen machine instructions, generated per call signature, that take
the NumPy array objects themselves, check each against what the kernel was compiled for (type, rank,
sizes, strides, dtype, flags, and that the output overlaps no input) by reading the fields of NumPy's
array object, and call the kernel on their data only when every check holds. A call through it costs
one ctypes call; Python loops over the arguments cost a microsecond more (issue 28).

The checks may refuse more than the caller's own checks would (an equal dtype that is another object,
an input whose bounds touch the output's without sharing an element): a refused call returns non-zero
and the caller checks in Python, which either runs the kernel or raises the error that names the
argument. They never accept less.

The fields' offsets are NumPy's `PyArrayObject` layout, found by looking, not assumed (`array_fields`):
where they are not where NumPy's header puts them, there is no checked entry and calls check in Python.
"""
from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass

import numpy as np

# NumPy's array flags (ndarraytypes.h), confirmed on arrays by `array_fields`
C_CONTIGUOUS, ALIGNED, WRITEABLE = 0x0001, 0x0100, 0x0400
_NAMES = itertools.count()


@dataclass(frozen=True)
class ArrayFields:
    """Byte offsets of the fields of an ndarray object: its type (the object header's), data pointer,
    rank (int), pointers to its sizes and strides (npy_intp each), dtype object and flags (int)."""

    type: int
    data: int
    nd: int
    dimensions: int
    strides: int
    descr: int
    flags: int


_DATA_OFFSET: list[int] = []
_FIELDS: list[ArrayFields | None] = []


def data_offset() -> int:
    """Where an ndarray object keeps its data pointer (after the object header: 16 bytes on CPython's
    usual builds), found by looking, not assumed: the one offset that holds the data pointer of
    several arrays."""
    if not _DATA_OFFSET:
        arrays = [np.empty(n, dtype=np.uint8) for n in (7, 1000, 3)]
        pointer = ctypes.sizeof(ctypes.c_void_p)
        _DATA_OFFSET.append(next(
            offset for offset in range(pointer, 16 * pointer, pointer)
            if all(ctypes.c_void_p.from_address(id(a) + offset).value == a.ctypes.data for a in arrays)))
    return _DATA_OFFSET[0]


def array_fields() -> ArrayFields | None:
    """The ndarray object's field offsets: NumPy's header order after the data pointer (rank,
    sizes, strides, base, dtype, flags, each in a pointer-sized slot), confirmed on sample arrays (views,
    read-only, misaligned, 0-d); None where they are not there or pointers are not 64 bits."""
    if not _FIELDS:
        pointer = ctypes.sizeof(ctypes.c_void_p)
        data = data_offset()
        fields = ArrayFields(type=pointer, data=data, nd=data + pointer, dimensions=data + 2 * pointer,
                             strides=data + 3 * pointer, descr=data + 5 * pointer, flags=data + 6 * pointer)
        _FIELDS.append(fields if pointer == 8 and all(_read_as_numpy_says(fields, a) for a in _samples())
                       else None)
    return _FIELDS[0]


def _samples() -> list[np.ndarray]:
    """Arrays that differ in every field `array_fields` reads."""
    read_only = np.arange(6.0).reshape(2, 3)
    read_only.setflags(write=False)
    return [np.empty((3, 5), np.float32)[:, ::2], read_only, np.empty(9, np.uint8)[1:].view(np.int64),
            np.zeros((4, 1, 7), np.int16).T, np.array(3.0, np.float32), np.empty(0, np.complex64)]


def _read_as_numpy_says(fields: ArrayFields, array: np.ndarray) -> bool:
    """Whether the fields read at `fields`' offsets of `array` are its type, data, shape, strides,
    dtype and flags."""
    base = id(array)

    def word(offset):
        return ctypes.c_int64.from_address(base + offset).value

    rank = ctypes.c_int32.from_address(base + fields.nd).value
    flags = ctypes.c_int32.from_address(base + fields.flags).value
    axes = range(array.ndim)
    return (word(fields.type) == id(np.ndarray) and word(fields.data) == array.ctypes.data
            and rank == array.ndim and word(fields.descr) == id(array.dtype)
            and all(ctypes.c_int64.from_address(word(fields.dimensions) + 8 * i).value == array.shape[i]
                    for i in axes)
            and all(ctypes.c_int64.from_address(word(fields.strides) + 8 * i).value == array.strides[i]
                    for i in axes)
            and bool(flags & C_CONTIGUOUS) == array.flags.c_contiguous
            and bool(flags & ALIGNED) == array.flags.aligned and bool(flags & WRITEABLE) == array.flags.writeable)


@dataclass(frozen=True)
class Expected:
    """What one array object passed to a checked entry must be. `shape` per axis: a size, `Dim(k)` (the
    size of dynamic dim k: read from the first array that has it, compared in the others), or None (not
    checked); `strides` in bytes, or None for the output, which must be C-contiguous and writeable
    instead. Every array must be exactly an ndarray, aligned, of this dtype (the same dtype object)."""

    shape: tuple
    strides: tuple[int, ...] | None
    dtype: np.dtype


@dataclass(frozen=True)
class Dim:
    """The size of dynamic dim `index` (in the order the kernel takes the sizes)."""

    index: int


@dataclass(frozen=True)
class Entry:
    """A checked entry's plan. `arrays`: what each array object passed must be (None: a buffer the
    caller made, passed unchecked); `output`: the index of the one that must overlap no other checked
    array; `kernel_args`: per kernel parameter, the index of an array object or the address of a
    constant's data (`Address`); then the kernel takes the size of each dynamic dim, whose minimum
    size is in `minimums`."""

    arrays: tuple[Expected | None, ...]
    output: int
    kernel_args: tuple
    minimums: tuple[int, ...]


@dataclass(frozen=True)
class Address:
    """A fixed data address passed to the kernel (a captured array's data, kept alive by the caller)."""

    value: int


def entry_ir(entry: Entry, kernel_address: int, fields: ArrayFields) -> tuple[str, str]:
    """The LLVM IR of `entry` calling the kernel at `kernel_address`, and the name of its function
    (unique in the process): a function of the array objects returning 0 when it ran the kernel, 1
    when a check refused."""
    name = f"checked_entry_{next(_NAMES)}"
    code = _Code(fields)
    for index, expected in enumerate(entry.arrays):
        code.check(index, expected)
    for index, minimum in enumerate(entry.minimums):
        code.require(f"icmp sge i64 {code.sizes[index]}, {minimum}")
    for index, expected in enumerate(entry.arrays):
        if expected is not None and index != entry.output:
            code.disjoint(entry.output, index)
    args = [f"ptr {code.data[a]}" if isinstance(a, int) else f"ptr inttoptr (i64 {a.value} to ptr)"
            for a in entry.kernel_args] + [f"i64 {code.sizes[i]}" for i in range(len(entry.minimums))]
    params = ", ".join(f"ptr %a{i}" for i in range(len(entry.arrays)))
    body = "\n".join(code.lines)
    return (f"define i32 @{name}({params}) {{\nentry:\n{body}\n  call void inttoptr (i64 {kernel_address} to ptr)"
            f"({', '.join(args)})\n  ret i32 0\nrefuse:\n  ret i32 1\n}}\n", name)


class _Code:
    """The checks' instructions, one block per condition: each `require` goes on to the next block when
    its condition holds and to `refuse` when not, so no field is read before its object is known to be
    an ndarray of that rank."""

    def __init__(self, fields: ArrayFields):
        self.fields, self.lines, self.count = fields, [], 0
        self.sizes: dict[int, str] = {}        # dynamic dim -> its size's value
        self.data: dict[int, str] = {}         # array object -> its data pointer's value
        self.extents: dict[int, tuple[str, str]] = {}   # checked array -> its first and past-last byte

    def value(self, text: str) -> str:
        name = f"%v{self.count}"
        self.count += 1
        self.lines.append(f"  {name} = {text}")
        return name

    def load(self, kind: str, base: str, offset: int) -> str:
        address = self.value(f"getelementptr i8, ptr {base}, i64 {offset}")
        return self.value(f"load {kind}, ptr {address}")

    def require(self, condition: str):
        holds = self.value(condition)
        label = f"ok{self.count}"
        self.lines.append(f"  br i1 {holds}, label %{label}, label %refuse\n{label}:")

    def check(self, index: int, expected: Expected | None):
        """Check array object `index` against `expected` and note its data pointer (and extent)."""
        obj, f = f"%a{index}", self.fields
        if expected is not None:
            self.require(f"icmp eq i64 {self.load('i64', obj, f.type)}, {id(np.ndarray)}")
            self.require(f"icmp eq i32 {self.load('i32', obj, f.nd)}, {len(expected.shape)}")
            self.require(f"icmp eq i64 {self.load('i64', obj, f.descr)}, {id(expected.dtype)}")
            flags = ALIGNED | (WRITEABLE | C_CONTIGUOUS if expected.strides is None else 0)
            found = self.value(f"and i32 {self.load('i32', obj, f.flags)}, {flags}")
            self.require(f"icmp eq i32 {found}, {flags}")
        self.data[index] = self.load("ptr", obj, f.data)
        if expected is None:
            return
        sizes = self._sizes(obj, expected.shape)
        if expected.strides is not None:
            pointer = self.load("ptr", obj, f.strides)
            for axis, stride in enumerate(expected.strides):
                found = self.load("i64", self.value(f"getelementptr i64, ptr {pointer}, i64 {axis}"), 0)
                self.require(f"icmp eq i64 {found}, {stride}")
        self.extents[index] = self._extent(index, sizes, expected)

    def _sizes(self, obj: str, shape: tuple) -> list[str]:
        """Each axis's size, checked against `shape` (a dynamic dim's first appearance defines it)."""
        if not shape:
            return []
        pointer, sizes = self.load("ptr", obj, self.fields.dimensions), []
        for axis, want in enumerate(shape):
            size = self.load("i64", self.value(f"getelementptr i64, ptr {pointer}, i64 {axis}"), 0)
            if isinstance(want, int):
                self.require(f"icmp eq i64 {size}, {want}")
            elif isinstance(want, Dim) and want.index in self.sizes:
                self.require(f"icmp eq i64 {size}, {self.sizes[want.index]}")
            elif isinstance(want, Dim):
                self.sizes[want.index] = size
            sizes.append(size)
        return sizes

    def _extent(self, index: int, sizes: list[str], expected: Expected) -> tuple[str, str]:
        """The first byte and the byte past the last that the array's elements can occupy (its data plus
        the most negative and most positive offsets of its strides; C order for the output)."""
        start = self.value(f"ptrtoint ptr {self.data[index]} to i64")
        if expected.strides is None:
            count = "1"
            for size in sizes:
                count = self.value(f"mul i64 {count}, {size}")
            length = self.value(f"mul i64 {count}, {expected.dtype.itemsize}")
            return start, self.value(f"add i64 {start}, {length}")
        low, high = start, self.value(f"add i64 {start}, {expected.dtype.itemsize}")
        for size, stride in zip(sizes, expected.strides):
            last = self.value(f"sub i64 {size}, 1")
            reach = self.value(f"mul i64 {last}, {stride}")
            if stride < 0:
                low = self.value(f"add i64 {low}, {reach}")
            else:
                high = self.value(f"add i64 {high}, {reach}")
        return low, high

    def disjoint(self, output: int, other: int):
        """Refuse where the output's bytes and `other`'s could overlap (the caller's exact check decides)."""
        (out_low, out_high), (low, high) = self.extents[output], self.extents[other]
        before = self.value(f"icmp ule i64 {high}, {out_low}")
        after = self.value(f"icmp ule i64 {out_high}, {low}")
        self.require(f"or i1 {before}, {after}")
