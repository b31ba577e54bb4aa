"""The user-facing API: symbols, named-dimension tensors and their operations."""
from __future__ import annotations

import numbers
import warnings

import numpy as np

from ..hooks import Hook
from . import dtypes, graph

BACKEND = Hook("running a Tensor (numpy, cuda, compile, loop_tree; GPU arrays)", "looptool.runtime")


class Symbol:
    """A dimension name. Two symbols with the same name are the same dimension. A `dynamic` symbol's
    size is a parameter of the compiled kernel, which then serves every size from `min` up (see
    docs/frontend.md, "Dynamic sizes"); it must be the first (outermost) axis of every array that has it."""

    def __init__(self, name: str, dynamic: bool = False, min: int = 1):
        if not name.isidentifier():
            raise ValueError(f"symbol name {name!r} is not an identifier")
        if not isinstance(min, int) or min < 1:
            raise ValueError(f"symbol {name!r}: min must be a positive integer, got {min!r}")
        self.name, self.dynamic, self.min = name, bool(dynamic), min

    def __repr__(self):
        return self.name

    def __eq__(self, other):
        return isinstance(other, Symbol) and other.name == self.name

    def __hash__(self):
        return hash(("Symbol", self.name))


class Symbols(tuple):
    """The symbols made by `symbols()`: unpack them, or reach each one as an attribute."""

    def __getattr__(self, name):
        for sym in self:
            if sym.name == name:
                return sym
        raise AttributeError(f"no symbol named {name!r} among {tuple(self)}")


def symbols(names: str, dynamic: bool = False, min: int = 1) -> Symbols:
    """Make dimension symbols from a space- or comma-separated string: `m, k, n = symbols("m k n")`.
    With `dynamic=True` their sizes are run-time parameters of the kernels that use them: one kernel
    serves every size >= `min` (`b = symbols("b", dynamic=True)`)."""
    parts = names.replace(",", " ").split()
    if len(set(parts)) != len(parts):
        raise ValueError(f"symbols({names!r}) names a symbol twice")
    return Symbols(Symbol(p, dynamic, min) for p in parts)


def _name(dim, what: str) -> str:
    if isinstance(dim, Symbol):
        return dim.name
    raise TypeError(f"{what}: expected a Symbol (from lt.symbols), got {dim!r}")


class Tensor:
    """A lazy tensor with named dimensions. `Tensor(array).to(*symbols)` names an array's axes."""

    def __init__(self, data, *, _node: graph.Node | None = None):
        if _node is not None:
            self._node, self._array = _node, None
            return
        if isinstance(data, np.ndarray):
            array = data
        elif BACKEND.get().is_device_array(data):
            array = BACKEND.get().as_device(data)
        else:
            array = _as_array(data)
        if array.dtype not in dtypes.SUPPORTED_DTYPES:
            raise TypeError(f"lt.Tensor: dtype {array.dtype} is not supported; use float16, bfloat16 "
                            f"(ml_dtypes.bfloat16), float32 or float64 (e.g. array.astype(np.float32))")
        self._node, self._array = None, array

    def to(self, *dims: Symbol) -> "Tensor":
        """Name the array's axes, one symbol per axis."""
        if self._array is None:
            raise ValueError("Tensor.to: this tensor already has dimensions "
                             f"{self.dims}; .to() names the axes of an array")
        names = tuple(_name(d, "Tensor.to") for d in dims)
        array = self._array
        if len(names) != array.ndim:
            raise ValueError(f"Tensor.to: the array has {array.ndim} dimensions {array.shape} "
                             f"but {len(names)} names were given {names}")
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"Tensor.to: dimension name(s) {twice} given more than once in {names}")
        dynamic = {d.name: d.min for d in dims if d.dynamic}
        for axis, d in enumerate(dims):
            if d.dynamic and axis:
                raise NotImplementedError(f"Tensor.to: dynamic dim '{d.name}' is axis {axis} of {names}; a dynamic "
                                          f"dim must be the first (outermost) axis of an array")
            if d.dynamic and array.shape[axis] < d.min:
                raise ValueError(f"Tensor.to: dynamic dim '{d.name}' has size {array.shape[axis]}, below its "
                                 f"minimum {d.min} (shape {array.shape})")
        return Tensor(None, _node=graph.Input(array, names, dynamic))

    @property
    def node(self) -> graph.Node:
        if self._node is None:
            raise ValueError(f"this tensor of shape {self._array.shape} has no dimension names yet: "
                             f"call .to(...) with one symbol per axis first")
        return self._node

    @property
    def dims(self) -> tuple[Symbol, ...]:
        return tuple(Symbol(d) for d in self.node.dims)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def dtype(self) -> np.dtype:
        return self.node.dtype

    def __repr__(self):
        if self._node is None:
            return f"Tensor(unnamed, shape={self._array.shape}, dtype={self._array.dtype})"
        return f"Tensor(dims={self.dims}, shape={self.shape}, dtype={self.dtype})"

    # Pointwise operations
    def _map(self, op: str, *others) -> "Tensor":
        args = (self.node,) + tuple(_operand(o, self.node.dtype) for o in others)
        return Tensor(None, _node=graph.Map(op, args))

    def _rmap(self, op: str, other) -> "Tensor":
        return Tensor(None, _node=graph.Map(op, (_operand(other, self.node.dtype), self.node)))

    def __add__(self, o): return self._map("add", o)
    def __radd__(self, o): return self._rmap("add", o)
    def __sub__(self, o): return self._map("sub", o)
    def __rsub__(self, o): return self._rmap("sub", o)
    def __mul__(self, o): return self._map("mul", o)
    def __rmul__(self, o): return self._rmap("mul", o)
    def __truediv__(self, o): return self._map("div", o)
    def __rtruediv__(self, o): return self._rmap("div", o)
    def __neg__(self): return self._map("neg")

    def astype(self, dtype) -> "Tensor":
        """The values converted to `dtype` (`lt.float16`, `lt.bfloat16`, `lt.float32`, `lt.float64`),
        rounded to nearest even when narrower; the way to store a result in half precision."""
        target = dtypes.as_dtype(dtype, "astype")
        if target == self.dtype:
            return self
        return Tensor(None, _node=graph.Cast(self.node, target))

    def exp(self) -> "Tensor":
        """Elementwise e**x."""
        return self._map("exp")

    def log(self) -> "Tensor":
        """Elementwise natural logarithm."""
        return self._map("log")

    def tanh(self) -> "Tensor":
        """Elementwise hyperbolic tangent."""
        return self._map("tanh")

    def erf(self) -> "Tensor":
        """Elementwise error function, 2/sqrt(pi) times the integral of exp(-t*t) from 0 to x."""
        return self._map("erf")

    def sqrt(self) -> "Tensor":
        """Elementwise square root."""
        return self._map("sqrt")

    def abs(self) -> "Tensor":
        """Elementwise absolute value."""
        return self._map("abs")

    def reciprocal(self) -> "Tensor":
        """Elementwise 1/x."""
        return self._map("reciprocal")

    def relu(self) -> "Tensor":
        """Elementwise max(x, 0)."""
        return self._map("relu")

    def maximum(self, other) -> "Tensor":
        """Elementwise maximum with another tensor or a scalar (NaN propagates, as in NumPy)."""
        return self._map("maximum", other)

    def minimum(self, other) -> "Tensor":
        """Elementwise minimum with another tensor or a scalar (NaN propagates, as in NumPy)."""
        return self._map("minimum", other)

    # Reductions
    def _reduce(self, op: str, dims, dtype) -> "Tensor":
        if not dims:
            raise ValueError(f"{op}() needs at least one dimension to reduce over; "
                             f"this tensor has {self.dims}")
        names = tuple(_name(d, op) for d in dims)
        accumulator = None if dtype is None else dtypes.as_dtype(dtype, op)
        return Tensor(None, _node=graph.Reduce(op, self.node, names, accumulator))

    def sum(self, *dims: Symbol, dtype=None) -> "Tensor":
        """Sum over the named dimensions, accumulated in `dtype` (default: float32 for half-precision
        values, else their own dtype); the result has that dtype."""
        return self._reduce("sum", dims, dtype)

    def max(self, *dims: Symbol, dtype=None) -> "Tensor":
        """Maximum over the named dimensions, held in `dtype` (default as for `sum`)."""
        return self._reduce("max", dims, dtype)

    def min(self, *dims: Symbol, dtype=None) -> "Tensor":
        """Minimum over the named dimensions, held in `dtype` (default as for `sum`)."""
        return self._reduce("min", dims, dtype)

    def mean(self, *dims: Symbol, dtype=None) -> "Tensor":
        """Mean over the named dimensions, summed in `dtype` (default as for `sum`); NaN, with a
        RuntimeWarning, over fixed dimensions of size 0. Over a dynamic dim the count is summed at run
        time, in float64 (exact), then divides in the sum's dtype as a fixed count does."""
        total = self._reduce("sum", dims, dtype)
        names = [_name(d, "mean") for d in dims]
        dynamic = {d: self.node.dynamic[d] for d in names if d in self.node.dynamic}
        count = int(np.prod([self.node.sizes[d] for d in names if d not in dynamic]))
        if count == 0:
            warnings.warn(f"mean over {names}, which hold no elements: the result "
                          f"is NaN (0/0), as NumPy's 'Mean of empty slice'", RuntimeWarning, stacklevel=2)
        if not dynamic:
            return total / count
        rows = Tensor(None, _node=graph.Reduce("sum", graph.Ones(tuple(dynamic), self.node.sizes, dynamic),
                                               tuple(dynamic)))
        return total / (rows if count == 1 else rows * count).astype(total.dtype)

    # Index views
    def pad(self, dim: Symbol, new_dim: Symbol, amount, value: float = 0.0) -> "Tensor":
        """Replace `dim` by `new_dim`, padded by `amount` (int, or (before, after)) with `value`."""
        before, after = graph.pad_amounts(amount, "pad")
        _refuse_dynamic(self.node, _name(dim, "pad"), "pad", f"'{_name(new_dim, 'pad')}' of size "
                        f"{_name(dim, 'pad').upper()} + {before + after}")
        node = graph.Pad(self.node, _name(dim, "pad"), _name(new_dim, "pad"), amount, value)
        return Tensor(None, _node=node)

    def window(self, dim: Symbol, out_dim: Symbol, kernel_dim: Symbol, size: int, stride: int = 1,
               dilation: int = 1, padding=0) -> "Tensor":
        """Replace `dim` by (out_dim, kernel_dim): element [o, r] reads o*stride + r*dilation - padding.

        Positions that fall into the padding read 0. This is the sliding window of
        convolution and pooling: `size` is the kernel extent."""
        _refuse_dynamic(self.node, _name(dim, "window"), "window", f"'{_name(out_dim, 'window')}' of a size "
                        f"computed from {_name(dim, 'window').upper()}")
        node = graph.Window(self.node, _name(dim, "window"), _name(out_dim, "window"),
                            _name(kernel_dim, "window"), int(size), int(stride), int(dilation), padding)
        return Tensor(None, _node=node)

    # Running
    def numpy(self, schedule=None) -> np.ndarray:
        """Compile (or fetch from the cache) and run the computation; axes follow `.dims`.

        `schedule` may be a LoopTree, a Schedule or its JSON text; None means the tuned schedule
        stored for this workload, else the automatic one for this CPU."""
        return BACKEND.get().evaluate(self.node, schedule)

    def cuda(self, schedule=None):
        """Run on the GPU (CuPy, `looptool[gpu]`) under `schedule`; returns a CuPy array that stays on
        the device (for a bfloat16 result, which CuPy cannot type, a `looptool.runtime.gpu.BFloat16Array`).
        Inputs already on the GPU (CuPy, PyTorch, DLPack) are used in place. A kernel with dynamic dims
        takes their sizes at launch (its grid too): one kernel serves every size."""
        return BACKEND.get().evaluate_on_gpu(self.node, schedule)

    def loop_tree(self, schedule=None):
        """The loop tree this tensor lowers to, under `schedule` (default schedule if None)."""
        return BACKEND.get().loop_tree_of(self.node, schedule)

    def compile(self, schedule=None):
        """The compiled kernel (with .llvm_ir, .assembly and .loop_tree) for this computation, under
        `schedule` (None: the tuned one, else the automatic one, as for `numpy`)."""
        return BACKEND.get().kernel_for(self.node, schedule)


def _refuse_dynamic(node: graph.Node, dim: str, what: str, made: str):
    """Refuse a view over a dynamic dim: it would make a dim (`made`: its name and size) whose size is
    computed from the dynamic one's, which no kernel takes."""
    if dim in node.dynamic:
        raise NotImplementedError(f"{what} over dynamic dim '{dim}' of {graph.describe(node)}: it would make "
                                  f"{made}, but a kernel takes at run time only the sizes of the dynamic dims "
                                  f"themselves, read from its inputs; {what} the arrays before the call, or "
                                  f"make '{dim}' a fixed dim")


def _as_array(data) -> np.ndarray:
    try:
        array = np.asarray(data)
    except Exception as err:
        raise TypeError(f"lt.Tensor: cannot make an array from {type(data).__name__}: {err}") from None
    if array.dtype == object or not np.issubdtype(array.dtype, np.number):
        raise TypeError(f"lt.Tensor: expected a numeric array, got {type(data).__name__} "
                        f"with dtype {array.dtype}")
    return array


def _operand(value, dtype: np.dtype) -> graph.Node:
    if isinstance(value, Tensor):
        return value.node
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return graph.Scalar(value, dtypes.compute_dtype(dtype))
    raise TypeError(f"cannot combine a Tensor with {type(value).__name__} {value!r}")


def _unary(op: str):
    def fn(x: Tensor) -> Tensor:
        return getattr(x, op)()
    fn.__name__ = op
    fn.__doc__ = f"Elementwise {op} of a tensor (same as `x.{op}()`)."
    return fn


exp, log, tanh, erf, sqrt, abs, reciprocal, relu = (
    _unary(op) for op in ("exp", "log", "tanh", "erf", "sqrt", "abs", "reciprocal", "relu"))


def maximum(a, b) -> Tensor:
    """Elementwise maximum of two tensors (or a tensor and a scalar)."""
    return a.maximum(b) if isinstance(a, Tensor) else b._rmap("maximum", a)


def minimum(a, b) -> Tensor:
    """Elementwise minimum of two tensors (or a tensor and a scalar)."""
    return a.minimum(b) if isinstance(a, Tensor) else b._rmap("minimum", a)


def concat(tensors, dims, into: Symbol) -> Tensor:
    """Concatenate `tensors` along their dimensions `dims` (one per tensor) into the new dim `into`."""
    tensors, dims = list(tensors), list(dims)
    for t, d in zip(tensors, dims):
        sizes = [name.upper() if name in src.node.dynamic else str(src.node.sizes.get(name, "?"))
                 for src, name in zip(tensors, (_name(e, "concat") for e in dims))]
        _refuse_dynamic(t.node, _name(d, "concat"), "concat", f"'{_name(into, 'concat')}' of size {' + '.join(sizes)}")
    node = graph.Concat(tuple(t.node for t in tensors), tuple(_name(d, "concat") for d in dims),
                        _name(into, "concat"))
    return Tensor(None, _node=node)
