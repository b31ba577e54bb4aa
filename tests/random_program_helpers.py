"""Random programs from the whole frontend with their float64 NumPy values, shared by the random
program tests (tests/frontend/test_random_programs.py on the CPU, tests/runtime/test_gpu_random_programs.py
on the GPU).

A program is an expression tree over named inputs (1 to 3 dims from a small pool, sizes 1..40,
float32 or float64, sometimes mixed): pointwise unary and binary operations with broadcasting by
name and Python scalars, sum/max/min/mean over any of a term's dims (so reductions chain), and the
index views pad, window and concat (`Builder`).  Each `Term` carries the float64 NumPy evaluation of
the same expression, written independently of looptool, and the largest magnitude computed on the
way, which `check` measures errors against.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import math

import numpy as np
from hypothesis import HealthCheck

import looptool as lt
from tests.schedule_helpers import draw_size

MAX_ELEMENTS = 3_000       # of any term: keeps compile and run times small
MAX_DEPTH = 4


@dataclass
class Term:
    """A looptool tensor with its float64 NumPy value, axes in `dims` order, and the largest
    magnitude of any value computed on the way (float32 rounding errors scale with it)."""

    tensor: lt.Tensor
    value: np.ndarray
    dims: tuple[str, ...]
    magnitude: float


def made(tensor: lt.Tensor, value: np.ndarray, dims: tuple[str, ...], *parts: Term | float) -> Term:
    """The Term of `tensor`, computed from `parts` (terms, or magnitudes reached on the way)."""
    largest = float(np.abs(value).max(initial=0.0))
    return Term(tensor, value, dims, max([largest] + [getattr(p, "magnitude", p) for p in parts]))


class Builder:
    """Draws terms; every dim name has one size, fresh names for the dims views make."""

    def __init__(self, ch, rng: np.random.Generator):
        self.ch, self.rng = ch, rng
        self.sizes: dict[str, int] = {}
        self.fresh = itertools.count()
        self.dtype = np.float64 if ch.chance(25) else np.float32
        for _ in range(ch.int(1, 4)):
            self.new_dim(draw_size(ch))

    def new_dim(self, size: int) -> str:
        name = f"d{next(self.fresh)}"
        self.sizes[name] = size
        return name

    def elements(self, dims) -> int:
        return int(np.prod([self.sizes[d] for d in dims], dtype=np.int64))

    # terms -------------------------------------------------------------------
    def term(self, depth: int) -> Term:
        if depth == 0 or self.ch.chance(20):
            return self.leaf()
        kind = self.ch.choice(["unary", "binary", "binary", "scalar", "reduce", "reduce", "view"])
        return getattr(self, kind)(depth)

    def leaf(self) -> Term:
        pool = [d for d in self.sizes if not d.startswith("v")]
        dims = tuple(self.ch.permutation(pool)[:self.ch.int(1, min(3, len(pool)))])
        while self.elements(dims) > MAX_ELEMENTS:
            dims = dims[:-1]
        dtype = np.float64 if self.dtype == np.float64 or self.ch.chance(10) else np.float32
        array = self.rng.standard_normal([self.sizes[d] for d in dims]).astype(dtype)
        return made(lt.Tensor(array).to(*lt.symbols(" ".join(dims))), array.astype(np.float64), dims)

    def unary(self, depth: int) -> Term:
        x = self.term(depth - 1)
        op = self.ch.choice(["exp", "log", "sqrt", "abs", "reciprocal", "relu", "neg", "tanh", "erf"])
        t, v = x.tensor, x.value
        if op == "exp":      # bounded, so that float32 cannot overflow where float64 does not
            return made(t.maximum(-4.0).minimum(4.0).exp(), np.exp(np.clip(v, -4.0, 4.0)), x.dims, x)
        if op == "log":
            return made((t.abs() + 1.0).log(), np.log(np.abs(v) + 1.0), x.dims, x)
        if op == "sqrt":
            return made(lt.sqrt(t.abs() + 1.0), np.sqrt(np.abs(v) + 1.0), x.dims, x)
        if op == "reciprocal":
            return made((t.abs() + 1.0).reciprocal(), 1.0 / (np.abs(v) + 1.0), x.dims, x)
        if op == "relu":
            return made(lt.relu(t), np.maximum(v, 0.0), x.dims, x)
        if op == "neg":
            return made(-t, -v, x.dims, x)
        if op == "tanh":
            return made(lt.tanh(t), np.tanh(v), x.dims, x)
        if op == "erf":
            return made(t.erf(), np.vectorize(math.erf)(v), x.dims, x)
        return made(t.abs(), np.abs(v), x.dims, x)

    def binary(self, depth: int) -> Term:
        a, b = self.term(depth - 1), self.term(depth - 1)
        dims = a.dims + tuple(d for d in b.dims if d not in a.dims)
        if self.elements(dims) > MAX_ELEMENTS:
            return a
        x, y = self.spread(a, dims), self.spread(b, dims)
        op = self.ch.choice(["add", "sub", "mul", "div", "maximum", "minimum"])
        if op == "add":
            return made(a.tensor + b.tensor, x + y, dims, a, b)
        if op == "sub":
            return made(a.tensor - b.tensor, x - y, dims, a, b)
        if op == "mul":
            return made(a.tensor * b.tensor, x * y, dims, a, b)
        if op == "div":
            return made(a.tensor / (b.tensor.abs() + 1.0), x / (np.abs(y) + 1.0), dims, a, b)
        if op == "maximum":
            return made(lt.maximum(a.tensor, b.tensor), np.maximum(x, y), dims, a, b)
        return made(a.tensor.minimum(b.tensor), np.minimum(x, y), dims, a, b)

    def spread(self, term: Term, dims: tuple[str, ...]) -> np.ndarray:
        """term.value with axes in `dims` order, size 1 along the dims it lacks (NumPy broadcasting)."""
        present = [d for d in dims if d in term.dims]
        value = term.value.transpose([term.dims.index(d) for d in present])
        return value.reshape([self.sizes[d] if d in term.dims else 1 for d in dims])

    def scalar(self, depth: int) -> Term:
        x = self.term(depth - 1)
        c = self.ch.choice([0.5, 2.0, -1.5, 3.0])
        if self.ch.chance(50):
            return made(c * x.tensor - 1.0, c * x.value - 1.0, x.dims, x)
        return made(c / (x.tensor.abs() + 0.5), c / (np.abs(x.value) + 0.5), x.dims, x)

    def reduce(self, depth: int) -> Term:
        x = self.term(depth - 1)
        if not x.dims:
            return x
        over = tuple(self.ch.permutation(x.dims)[:self.ch.int(1, len(x.dims))])
        axes = tuple(x.dims.index(d) for d in over)
        dims = tuple(d for d in x.dims if d not in over)
        op = self.ch.choice(["sum", "max", "min", "mean"])
        tensor = getattr(x.tensor, op)(*lt.symbols(" ".join(over)))
        partial = getattr(np, op)(np.abs(x.value), axis=axes).max(initial=0.0)   # bounds partial sums
        return made(tensor, getattr(np, op)(x.value, axis=axes), dims, x, float(partial))

    def view(self, depth: int) -> Term:
        x = self.term(depth - 1)
        if not x.dims:
            return x
        dim = self.ch.choice(x.dims)
        axis, n = x.dims.index(dim), self.sizes[dim]
        kind = self.ch.choice(["pad", "window", "concat"])
        if kind == "pad":
            before, after, value = self.ch.int(0, 3), self.ch.int(0, 3), self.ch.choice([0.0, -1.0])
            new = self.new_view_dim(n + before + after)
            widths = [(0, 0)] * len(x.dims)
            widths[axis] = (before, after)
            tensor = x.tensor.pad(*lt.symbols(f"{dim} {new}"), (before, after), value=value)
            return made(tensor, np.pad(x.value, widths, constant_values=value), replace(x.dims, axis, (new,)), x)
        if kind == "window":
            size, stride, dilation, padding = self.ch.int(1, 3), self.ch.int(1, 2), self.ch.int(1, 2), self.ch.int(0, 2)
            count = (n + 2 * padding - dilation * (size - 1) - 1) // stride + 1
            if count < 1:
                return x
            out, kernel = self.new_view_dim(count), self.new_view_dim(size)
            tensor = x.tensor.window(*lt.symbols(f"{dim} {out} {kernel}"), size, stride=stride, dilation=dilation,
                                     padding=padding)
            position = np.arange(count)[:, None] * stride + np.arange(size)[None, :] * dilation - padding
            inside = (position >= 0) & (position < n)
            taken = np.take(x.value, np.clip(position, 0, n - 1), axis=axis)
            mask = inside.reshape((1,) * axis + inside.shape + (1,) * (len(x.dims) - axis - 1))
            return made(tensor, np.where(mask, taken, 0.0), replace(x.dims, axis, (out, kernel)), x)
        other = self.new_view_dim(self.ch.int(1, 5))
        y_dims = tuple(other if d == dim else d for d in self.ch.permutation(x.dims))   # by name, any order
        if self.elements(y_dims) > MAX_ELEMENTS:
            return x
        y_array = self.rng.standard_normal([self.sizes[d] for d in y_dims]).astype(x.value.dtype)
        y = lt.Tensor(y_array.astype(x.tensor.dtype)).to(*lt.symbols(" ".join(y_dims)))
        y_term = made(y, y_array.astype(x.tensor.dtype).astype(np.float64), y_dims)
        joined = self.new_view_dim(n + self.sizes[other])
        tensor = lt.concat([x.tensor, y], lt.symbols(f"{dim} {other}"), lt.symbols(joined)[0])
        value = np.concatenate([x.value, self.spread(y_term, replace(x.dims, axis, (other,)))], axis=axis)
        return made(tensor, value, replace(x.dims, axis, (joined,)), x, y_term)

    def new_view_dim(self, size: int) -> str:
        name = f"v{next(self.fresh)}"
        self.sizes[name] = size
        return name


def replace(dims: tuple[str, ...], axis: int, new: tuple[str, ...]) -> tuple[str, ...]:
    return dims[:axis] + new + dims[axis + 1:]


def check(got: np.ndarray, term: Term, rtol: float):
    """max|got - reference| < rtol * the largest magnitude computed on the way: a difference of
    two large float32 values (x - mean(x), c * x - 1) keeps only the digits float32 has for them."""
    assert got.shape == term.value.shape, (got.shape, term.value.shape)
    assert np.isfinite(got).all(), "non-finite results where the reference is finite"
    err = np.abs(got - term.value).max(initial=0.0) / max(term.magnitude, np.finfo(np.float64).tiny)
    assert err < rtol, f"error {err:.3e} of the largest magnitude {term.magnitude:.3e} >= {rtol:.1e}"


# hypothesis settings of the random program tests
COMMON = dict(deadline=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
