"""The lazy computation graph behind `lt.Tensor`: nodes with named dimensions.

Every node knows its dimension names (in order), the size of every symbol used
anywhere below it, and its dtype.  Building a node checks that each symbol keeps
one size, so errors surface where the user combined the tensors, not at run time.
"""
from __future__ import annotations

import functools

import numpy as np

from . import dtypes

UNARY_OPS = ("neg", "exp", "log", "tanh", "erf", "sqrt", "abs", "reciprocal", "relu")
BINARY_OPS = ("add", "sub", "mul", "div", "maximum", "minimum")
REDUCE_OPS = ("sum", "max", "min")


def describe(node: "Node") -> str:
    """A short human description of a node, used in error messages."""
    dims = ", ".join(node.dims)
    shape = tuple(node.sizes[d] for d in node.dims)
    return f"{node.label}(dims=({dims}), shape={shape})"


def check_halves_apart(nodes, what: str):
    """Refuse an operation where float16 and bfloat16 values meet, naming the tensors."""
    if dtypes.mixed_halves(n.dtype for n in nodes):
        listed = " and ".join(f"{n.dtype.name} {describe(n)}" for n in nodes if n.dtype in dtypes.HALF_DTYPES)
        raise TypeError(f"{what}: cannot combine {listed}: float16 and bfloat16 differ in range and precision; "
                        f"convert one first, e.g. x.astype(lt.float32) or x.astype(lt.bfloat16)")


def merge_sizes(nodes: list["Node"]) -> dict[str, int]:
    """Union of the symbol sizes of `nodes`; a symbol with two sizes is an error."""
    sizes: dict[str, int] = {}
    owner: dict[str, "Node"] = {}
    for node in nodes:
        for name, size in node.sizes.items():
            if name in sizes and sizes[name] != size:
                raise ValueError(
                    f"symbol '{name}' has two sizes: {sizes[name]} in {describe(owner[name])} "
                    f"and {size} in {describe(node)}")
            sizes[name] = size
            owner.setdefault(name, node)
    return sizes


class Node:
    """Base class of graph nodes. Subclasses set dims, sizes, dtype and label."""

    dims: tuple[str, ...]
    sizes: dict[str, int]
    dtype: np.dtype
    label: str

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.sizes[d] for d in self.dims)

    @functools.cached_property
    def dynamic(self) -> dict[str, int]:
        """The dynamic dims below this node (symbols made with dynamic=True), each with its minimum size."""
        found: dict[str, int] = {}
        for child in self.children():
            found.update(child.dynamic)
        return found

    def children(self) -> tuple["Node", ...]:
        return ()


class Input(Node):
    """A user array with named dimensions."""

    def __init__(self, array: np.ndarray, dims: tuple[str, ...], dynamic: dict[str, int] | None = None):
        self.array, self.dims, self.dtype, self.label = array, dims, array.dtype, "Tensor"
        self.sizes = dict(zip(dims, array.shape))
        self.dynamic = dict(dynamic or {})


class Ones(Node):
    """1.0 (float64) at every index of `dims`, of the sizes `sizes` gives them; `dynamic`: those of them
    that are dynamic, with their minimums. Summed, it counts the elements a mean over a dynamic dim
    divides by, a number known only at run time."""

    def __init__(self, dims: tuple[str, ...], sizes: dict[str, int], dynamic: dict[str, int]):
        self.dims, self.dtype, self.label = tuple(dims), np.dtype("float64"), "ones"
        self.sizes = {d: sizes[d] for d in dims}
        self.dynamic = dict(dynamic)


class Scalar(Node):
    """A Python number inside an expression; it takes the dtype its partner computes in."""

    def __init__(self, value: float, dtype: np.dtype):
        self.value, self.dtype, self.dims, self.sizes, self.label = float(value), dtype, (), {}, "scalar"


class Map(Node):
    """A pointwise operation; dimensions broadcast by name (left operand's dims first).
    It computes in float32, or float64 if an operand is float64 (`dtypes.arithmetic_dtype`)."""

    def __init__(self, op: str, args: tuple[Node, ...]):
        self.op, self.args, self.label = op, args, op
        self.sizes = merge_sizes(list(args))
        self.dims = tuple(dict.fromkeys(d for a in args for d in a.dims))
        check_halves_apart(args, op)
        self.dtype = dtypes.arithmetic_dtype(a.dtype for a in args)

    def children(self):
        return self.args


class Cast(Node):
    """The source's values converted to `dtype` (rounded to nearest even when narrower)."""

    def __init__(self, src: Node, dtype: np.dtype):
        self.src, self.dtype, self.dims, self.sizes, self.label = src, dtype, src.dims, src.sizes, "astype"

    def children(self):
        return (self.src,)


class Reduce(Node):
    """A reduction (sum, max or min) over some dimensions of its source, accumulated in `dtype`
    (default: the dtype the source computes in, so float32 for half-precision sources)."""

    def __init__(self, op: str, src: Node, reduce_dims: tuple[str, ...], dtype: np.dtype | None = None):
        for d in reduce_dims:
            if d not in src.dims:
                raise ValueError(f"cannot reduce over '{d}': {describe(src)} has no dimension '{d}'")
        if len(set(reduce_dims)) != len(reduce_dims):
            raise ValueError(f"reduction over {reduce_dims} names a dimension twice")
        empty = [d for d in reduce_dims if src.sizes[d] == 0]
        if empty and op in ("max", "min"):
            raise ValueError(f"{op}() over dimension '{empty[0]}' of size 0: the {op}imum of no elements "
                             f"is undefined (NumPy raises too); {describe(src)}")
        self.op, self.src, self.reduce_dims, self.label = op, src, reduce_dims, op
        self.dims = tuple(d for d in src.dims if d not in reduce_dims)
        self.sizes, self.dtype = dict(src.sizes), dtypes.compute_dtype(src.dtype) if dtype is None else dtype

    def children(self):
        return (self.src,)


def _replace_dim(node: Node, dim: str, new_dims: tuple[str, ...], new_sizes: dict[str, int], what: str):
    if dim not in node.dims:
        raise ValueError(f"{what}: {describe(node)} has no dimension '{dim}'")
    for new in new_dims:
        if new in node.dims:
            raise ValueError(f"{what}: new dimension '{new}' is already a dimension of {describe(node)}")
    for name, size in new_sizes.items():
        if size <= 0:
            raise ValueError(f"{what}: dimension '{name}' would have size {size} (from '{dim}' of size "
                             f"{node.sizes[dim]} in {describe(node)})")
    i = node.dims.index(dim)
    dims = node.dims[:i] + new_dims + node.dims[i + 1:]
    sizes = merge_sizes([node, _Sized(new_sizes, what)])
    return dims, sizes


class _Sized(Node):
    """Carries sizes for merge_sizes' conflict check."""

    def __init__(self, sizes: dict[str, int], label: str):
        self.sizes, self.dims, self.label = sizes, tuple(sizes), label


def pad_amounts(amount, what: str) -> tuple[int, int]:
    """(before, after) of a padding given as one int or a pair; negative amounts are refused."""
    before, after = (amount, amount) if isinstance(amount, (int, np.integer)) else tuple(amount)
    if before < 0 or after < 0:
        raise ValueError(f"{what}: padding must be non-negative, got {amount}")
    return int(before), int(after)


class Pad(Node):
    """Dimension `dim` replaced by `new_dim`, padded with `value` on both sides."""

    def __init__(self, src: Node, dim: str, new_dim: str, amount, value: float):
        self.before, self.after = pad_amounts(amount, "pad")
        self.src, self.dim, self.new_dim, self.dtype, self.label = src, dim, new_dim, src.dtype, "pad"
        self.value = float(src.dtype.type(value))   # the padding value as the source's dtype holds it
        size = src.sizes.get(dim, 0) + self.before + self.after
        self.dims, self.sizes = _replace_dim(src, dim, (new_dim,), {new_dim: size}, "pad")

    def children(self):
        return (self.src,)


class Window(Node):
    """Dimension `dim` replaced by (out_dim, kernel_dim): [o, r] reads o*stride + r*dilation - before."""

    def __init__(self, src: Node, dim: str, out_dim: str, kernel_dim: str, size: int, stride: int,
                 dilation: int, padding):
        if size < 1 or stride < 1 or dilation < 1:
            raise ValueError(f"window over '{dim}': size, stride and dilation must be >= 1, "
                             f"got size={size}, stride={stride}, dilation={dilation}")
        self.before, self.after = pad_amounts(padding, f"window over '{dim}'")
        self.src, self.dim, self.out_dim, self.kernel_dim = src, dim, out_dim, kernel_dim
        self.size, self.stride, self.dilation, self.dtype, self.label = size, stride, dilation, src.dtype, "window"
        if dim not in src.dims:
            raise ValueError(f"window: {describe(src)} has no dimension '{dim}'")
        padded = src.sizes[dim] + self.before + self.after
        span = dilation * (size - 1) + 1
        if span > padded:
            raise ValueError(f"window over '{dim}': a window spans {span} elements but '{dim}' has only "
                             f"{padded} (size {src.sizes[dim]} plus padding {self.before}+{self.after})")
        out = (padded - span) // stride + 1
        self.dims, self.sizes = _replace_dim(src, dim, (out_dim, kernel_dim), {out_dim: out, kernel_dim: size},
                                             f"window over '{dim}'")

    def children(self):
        return (self.src,)


class Concat(Node):
    """Sources concatenated along their dims `src_dims` (one per source) into `new_dim`."""

    def __init__(self, srcs: tuple[Node, ...], src_dims: tuple[str, ...], new_dim: str):
        if len(srcs) != len(src_dims) or not srcs:
            raise ValueError(f"concat: got {len(srcs)} tensors but {len(src_dims)} dimensions to join")
        for src, d in zip(srcs, src_dims):
            if d not in src.dims:
                raise ValueError(f"concat: {describe(src)} has no dimension '{d}'")
        first = [x for x in srcs[0].dims if x != src_dims[0]]
        for src, d in zip(srcs[1:], src_dims[1:]):
            rest = [x for x in src.dims if x != d]
            if sorted(rest) != sorted(first):  # matched by name, in any order
                raise ValueError(f"concat: {describe(src)} has other dimensions {tuple(rest)} than "
                                 f"{describe(srcs[0])} {tuple(first)} besides the joined one")
        self.srcs, self.src_dims, self.new_dim, self.label = srcs, src_dims, new_dim, "concat"
        check_halves_apart(srcs, "concat")
        self.dtype = dtypes.view_dtype(s.dtype for s in srcs)
        total = sum(s.sizes[d] for s, d in zip(srcs, src_dims))
        self.dims, first = _replace_dim(srcs[0], src_dims[0], (new_dim,), {new_dim: total}, "concat")
        self.sizes = merge_sizes([*srcs[1:], _Sized(first, "concat")])

    def children(self):
        return self.srcs
