"""Shared machinery for the schedule, legality and fuzz tests.

* Computations ("cases"): matmul, matmul chains, softmax, layer-norm, row sums,
  1-d/2-d convolutions, max-pool and pointwise chains with broadcasting, each
  with a float64 NumPy reference.  A case can build its tensor again from the
  same arrays (fresh `lt.Tensor` objects), for the JSON round-trip tests.
* Schedules as step lists: ``("split", "k", 16)``, ``("reorder", "k", "m")``,
  ``("unroll", "k.1")``, ``("vectorize", "n.1")``, ``("parallel", "m")`` and
  ``("place", "t0", "t2", 1)``; a trailing dict holds keyword arguments
  (``{"stage": "t0"}``).  `apply_steps` replays them on a LoopTree.
* `run_guarded`: compile and run with NaN-poisoned input neighbours and canary
  guard regions around the output, checking that the guards stay untouched.
* `random_steps`: a random transform sequence driven by a `Chooser` (seeded
  `random.Random` or a hypothesis `data` object), used by the oracle and the fuzz.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import looptool as lt
from looptool import ir
from tests.helpers import (assert_close, conv2d_nchw_ref, f64, layernorm_ref, rand, randn, rtol_for, softmax_ref,
                     window_ref)

# ------------------------------------------------------------------ schedules as data


def scheduled(table: dict, name: str, rng):
    """(case, tensor, steps, loop tree) of entry `name` of a {name: (build, steps)} table."""
    build, steps = table[name]
    case = build(rng)
    t = case.make()
    return case, t, steps, apply_steps(t.loop_tree(), steps)


def apply_steps(tree: lt.LoopTree, steps) -> lt.LoopTree:
    """Apply transform steps (see module doc) to a loop tree, returning the new tree."""
    for step in steps:
        step = tuple(step)
        kwargs = {}
        if step and isinstance(step[-1], dict):
            step, kwargs = step[:-1], step[-1]
        op, *args = step
        tree = getattr(tree, op)(*args, **kwargs)
    return tree


def without(steps, op: str) -> list:
    """The steps minus every `op` step (e.g. the serial twin of a parallel schedule)."""
    return [s for s in steps if s[0] != op]


def steps_text(steps) -> str:
    return "[" + ", ".join(repr(tuple(s)) for s in steps) + "]"


# ------------------------------------------------------------------ canary runs

GUARD_F32 = np.array([12345.0, np.uint32(0x7FC12345).view(np.float32)], dtype=np.float32)
GUARD_F64 = np.array([12345.0, np.uint64(0x7FF8000000012345).view(np.float64)], dtype=np.float64)
INT_VIEW = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}


def guard_pattern(dtype, count: int) -> np.ndarray:
    """`count` values alternating 12345.0 and a NaN with a recognisable payload."""
    pattern = GUARD_F32 if np.dtype(dtype) == np.float32 else GUARD_F64
    return np.resize(pattern, count).astype(dtype)


def embed(array: np.ndarray, rng: np.random.Generator | None = None, mode: str | None = None) -> np.ndarray:
    """A view holding `array`'s values inside a larger NaN-filled allocation.

    mode 'flat': contiguous view with NaN before and after;
    'padded': every axis padded by NaN on both sides (strided view);
    'transposed': Fortran-order data (reversed strides) with NaN around it."""
    rng = rng or np.random.default_rng(0)
    mode = mode or ("flat", "padded", "transposed")[int(rng.integers(3))]
    dtype = array.dtype
    if mode == "flat":
        before, after = (int(v) for v in rng.integers(1, 9, size=2))
        big = np.full(array.size + before + after, np.nan, dtype=dtype)
        view = big[before:before + array.size].reshape(array.shape)
    elif mode == "padded":
        pads = [(int(rng.integers(1, 3)), int(rng.integers(1, 3))) for _ in array.shape]
        big = np.full(tuple(n + b + a for n, (b, a) in zip(array.shape, pads)), np.nan, dtype=dtype)
        view = big[tuple(slice(b, b + n) for n, (b, _) in zip(array.shape, pads))]
    elif mode == "transposed":
        big = np.full(array.size + 6, np.nan, dtype=dtype)
        inner = big[3:3 + array.size].reshape(array.shape[::-1])
        view = inner.transpose(tuple(range(array.ndim))[::-1])
    else:
        raise ValueError(mode)
    view[...] = array
    return view


@dataclass
class GuardedResult:
    value: np.ndarray
    kernel: lt.Kernel


def run_guarded(tensor: lt.Tensor, tree: lt.LoopTree, rng: np.random.Generator | None = None,
                guard: int | None = None) -> GuardedResult:
    """Compile `tree` for `tensor` and run it writing into a slice of a canary-filled array.

    The output's own elements start as canaries too, so an element that is never
    written shows up as a wrong (NaN / 12345) value; the guard regions before and
    after must be bit-for-bit unchanged."""
    rng = rng or np.random.default_rng(1)
    kernel = tensor.compile(tree)
    program, arrays = ir.lower(tensor.node)
    assert [b.name for b in program.inputs] == [b.name for b in kernel.loop_tree.program.inputs]
    plan = kernel.loop_tree.buffers[program.output.name]
    size = int(np.prod(plan.shape))
    before = guard if guard is not None else int(rng.integers(1, 18))
    after = guard if guard is not None else int(rng.integers(1, 18))
    big = guard_pattern(plan.dtype, before + size + after)
    pristine = big.copy()
    out = big[before:before + size].reshape(plan.shape)
    snapshot = [a.copy() for a in arrays]
    result = kernel(arrays, out=out)
    assert result is out or np.shares_memory(result, out), "kernel did not write into `out`"
    ints = INT_VIEW[np.dtype(plan.dtype)]
    assert np.array_equal(big[:before].view(ints), pristine[:before].view(ints)), \
        f"kernel wrote before the output (guard {big[:before]})"
    assert np.array_equal(big[before + size:].view(ints), pristine[before + size:].view(ints)), \
        f"kernel wrote past the end of the output (guard {big[before + size:]})"
    for a, s in zip(arrays, snapshot):
        assert np.array_equal(a, s, equal_nan=True), "kernel modified an input"
    return GuardedResult(out.copy(), kernel)


# ------------------------------------------------------------------ computations


@dataclass
class Case:
    """A computation: `make()` builds the lazy tensor (fresh objects every call)."""

    name: str
    make: Callable[[], lt.Tensor]
    ref: np.ndarray
    dtype: np.dtype
    sizes: dict = field(default_factory=dict)

    @property
    def rtol(self) -> float:
        return rtol_for(self.dtype)

    def check(self, got, what=""):
        try:
            assert_close(got, self.ref, self.rtol)
        except AssertionError as err:
            raise AssertionError(f"{self.name}{self.sizes} {what}: {err}") from None


def _identity(a):
    return a


def matmul(rng, m=9, k=11, n=13, dtype=np.float32, inp=_identity):
    sm, sk, sn = lt.symbols("m k n")
    A, B = randn(rng, (m, k), dtype), randn(rng, (k, n), dtype)
    a, b = inp(A), inp(B)
    return Case("matmul", lambda: (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk),
                f64(A) @ f64(B), np.dtype(dtype), dict(m=m, k=k, n=n))


def matmul_bias_relu(rng, m=9, k=11, n=13, dtype=np.float32, inp=_identity):
    """t0 = a @ b (a reduction stage); t1 = relu(t0 + bias)."""
    sm, sk, sn = lt.symbols("m k n")
    A, B, C = randn(rng, (m, k), dtype), randn(rng, (k, n), dtype), randn(rng, (n,), dtype)
    a, b, c = inp(A), inp(B), inp(C)

    def make():
        return ((lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk) + lt.Tensor(c).to(sn)).relu()
    return Case("matmul_bias_relu", make, np.maximum(f64(A) @ f64(B) + f64(C), 0.0), np.dtype(dtype),
                dict(m=m, k=k, n=n))


def matmul_chain(rng, m=6, k=7, n=8, j=5, dtype=np.float32, inp=_identity):
    """relu(a @ b) @ c: t0[m, n] (matmul), t1[m, j] reads a whole row of t0."""
    sm, sk, sn, sj = lt.symbols("m k n j")
    A, B, C = randn(rng, (m, k), dtype), randn(rng, (k, n), dtype), randn(rng, (n, j), dtype)
    a, b, c = inp(A), inp(B), inp(C)

    def make():
        t0 = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
        return (t0.relu() * lt.Tensor(c).to(sn, sj)).sum(sn)
    return Case("matmul_chain", make, np.maximum(f64(A) @ f64(B), 0.0) @ f64(C), np.dtype(dtype),
                dict(m=m, k=k, n=n, j=j))


def softmax(rng, m=7, n=13, dtype=np.float32, inp=_identity):
    """t0 = max over n, t1 = sum of exp, t2 = output."""
    sm, sn = lt.symbols("m n")
    X = (randn(rng, (m, n), np.float64) * 3.0).astype(dtype)
    x = inp(X)

    def make():
        xt = lt.Tensor(x).to(sm, sn)
        e = (xt - xt.max(sn)).exp()
        return e / e.sum(sn)
    return Case("softmax", make, softmax_ref(X, 1), np.dtype(dtype), dict(m=m, n=n))


def layernorm(rng, m=7, n=13, dtype=np.float32, inp=_identity, eps=1e-2):
    """t0 = sum x, t1 = sum (x - mean)^2, t2 = output.  A largish eps keeps the
    float32 result well conditioned for rows of one or two elements."""
    sm, sn = lt.symbols("m n")
    X = (randn(rng, (m, n), np.float64) * 2.0 + 1.0).astype(dtype)
    G, B = rand(rng, (n,), dtype, 0.5, 1.5), rand(rng, (n,), dtype, -0.5, 0.5)
    x, g, b = inp(X), inp(G), inp(B)

    def make():
        xt = lt.Tensor(x).to(sm, sn)
        mu = xt.mean(sn)
        var = ((xt - mu) * (xt - mu)).mean(sn)
        return (xt - mu) / (var + eps).sqrt() * lt.Tensor(g).to(sn) + lt.Tensor(b).to(sn)
    return Case("layernorm", make, layernorm_ref(X, G, B, eps), np.dtype(dtype), dict(m=m, n=n))


def rowsum_exp(rng, m=7, n=13, dtype=np.float32, inp=_identity):
    return _sum_exp("rowsum_exp", 1, rng, m, n, dtype, inp)


def colsum_exp(rng, m=7, n=13, dtype=np.float32, inp=_identity):
    """Reduction over the outer dimension: the reduction loop comes first."""
    return _sum_exp("colsum_exp", 0, rng, m, n, dtype, inp)


def _sum_exp(name, axis, rng, m, n, dtype, inp):
    """exp of an m x n matrix summed over `axis` (0: m, 1: n)."""
    sm, sn = lt.symbols("m n")
    X = rand(rng, (m, n), dtype, -2.0, 2.0)
    x = inp(X)
    return Case(name, lambda: lt.Tensor(x).to(sm, sn).exp().sum((sm, sn)[axis]), np.exp(f64(X)).sum(axis=axis),
                np.dtype(dtype), dict(m=m, n=n))


def conv1d(rng, c=3, h=11, o=4, size=3, stride=1, dilation=1, padding=1, dtype=np.float32, inp=_identity):
    """x[c, h] windowed to (c, oh, r), times w[o, c, r], summed over c, r: dims (oh, o)."""
    sc, sh, so, soh, sr = lt.symbols("c h o oh r")
    X, W = randn(rng, (c, h), dtype), randn(rng, (o, c, size), dtype)
    x, w = inp(X), inp(W)

    def make():
        xw = lt.Tensor(x).to(sc, sh).window(sh, soh, sr, size, stride=stride, dilation=dilation,
                                            padding=padding)
        return (xw * lt.Tensor(w).to(so, sc, sr)).sum(sc, sr)
    ref = np.einsum("cqr,ocr->qo", window_ref(X, 1, size, stride, dilation, padding), f64(W))
    return Case("conv1d", make, ref, np.dtype(dtype),
                dict(c=c, h=h, o=o, size=size, stride=stride, dilation=dilation, padding=padding))


def conv2d(rng, n=2, c=3, h=9, w=8, o=4, stride=2, padding=1, dtype=np.float32, inp=_identity):
    """NCHW conv with 3x3 OIHW filters, written with windows: dims (n, oh, ow, o)."""
    sn, sc, sh, sw, so, soh, sow, skh, skw = lt.symbols("n c h w o oh ow kh kw")
    X, W = randn(rng, (n, c, h, w), dtype), randn(rng, (o, c, 3, 3), dtype)
    x, wt = inp(X), inp(W)

    def make():
        xw = (lt.Tensor(x).to(sn, sc, sh, sw)
              .window(sh, soh, skh, 3, stride=stride, padding=padding)
              .window(sw, sow, skw, 3, stride=stride, padding=padding))
        return (xw * lt.Tensor(wt).to(so, sc, skh, skw)).sum(sc, skh, skw)
    ref = conv2d_nchw_ref(X, W, stride=stride, padding=padding).transpose(0, 2, 3, 1)
    return Case("conv2d", make, ref, np.dtype(dtype), dict(n=n, c=c, h=h, w=w, o=o, stride=stride, padding=padding))


def maxpool1d(rng, m=5, h=12, size=2, stride=2, dtype=np.float32, inp=_identity):
    sm, sh, sq, si = lt.symbols("m h q i")
    X = randn(rng, (m, h), dtype)
    x = inp(X)
    return Case("maxpool1d", lambda: lt.Tensor(x).to(sm, sh).window(sh, sq, si, size, stride=stride).max(si),
                window_ref(X, 1, size, stride).max(axis=2), np.dtype(dtype), dict(m=m, h=h, size=size, stride=stride))


def pointwise(rng, m=7, n=13, dtype=np.float32, inp=_identity):
    """A pointwise chain with broadcasting by name: x[m, n], v[n], u[m]."""
    sm, sn = lt.symbols("m n")
    X, V, U = randn(rng, (m, n), dtype), randn(rng, (n,), dtype), randn(rng, (m,), dtype)
    x, v, u = inp(X), inp(V), inp(U)

    def make():
        xt, vt, ut = lt.Tensor(x).to(sm, sn), lt.Tensor(v).to(sn), lt.Tensor(u).to(sm)
        return ((xt * vt + ut).relu() - (0.5 * xt).exp() / (vt.abs() + 1.0)).maximum(ut * 0.25)
    X64, V64, U64 = f64(X), f64(V), f64(U)
    ref = np.maximum(np.maximum(X64 * V64 + U64[:, None], 0.0) - np.exp(0.5 * X64) / (np.abs(V64) + 1.0),
                     U64[:, None] * 0.25)
    return Case("pointwise", make, ref, np.dtype(dtype), dict(m=m, n=n))


def reduce_broadcast(rng, m=7, n=13, dtype=np.float32, inp=_identity):
    """y[m, n] = x - mean_n(x) + max_m(x): two reductions over different dims feed one output."""
    sm, sn = lt.symbols("m n")
    X = randn(rng, (m, n), dtype)
    x = inp(X)

    def make():
        xt = lt.Tensor(x).to(sm, sn)
        return xt - xt.mean(sn) + xt.max(sm)
    X64 = f64(X)
    return Case("reduce_broadcast", make, X64 - X64.mean(axis=1, keepdims=True) + X64.max(axis=0, keepdims=True),
                np.dtype(dtype), dict(m=m, n=n))


# ------------------------------------------------------------------ random choices


class RandomChooser:
    """Choices from a seeded random.Random."""

    def __init__(self, seed):
        self.r = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self.r.randint(lo, hi)

    def choice(self, seq):
        seq = list(seq)
        return seq[self.r.randrange(len(seq))]

    def permutation(self, seq) -> list:
        out = list(seq)
        self.r.shuffle(out)
        return out

    def chance(self, percent: int) -> bool:
        return self.r.randrange(100) < percent


class HypothesisChooser:
    """The same interface drawing from a hypothesis `data` object (so failures shrink)."""

    def __init__(self, data):
        from hypothesis import strategies as st
        self.data, self.st = data, st

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(self.st.integers(lo, hi))

    def choice(self, seq):
        seq = list(seq)
        return seq[self.int(0, len(seq) - 1)]

    def permutation(self, seq) -> list:
        return list(self.data.draw(self.st.permutations(list(seq))))

    def chance(self, percent: int) -> bool:
        return self.int(0, 99) < percent


ODD_SIZES = (1, 2, 3, 5, 7, 9, 13, 16, 17, 31, 33, 37, 40)


def draw_size(ch, hi: int = 40) -> int:
    if ch.chance(50):
        return ch.choice([s for s in ODD_SIZES if s <= hi])
    return ch.int(1, hi)


def draw_case(ch, rng: np.random.Generator, max_size: int = 40, poison: bool = True) -> Case:
    """A random computation with random (often odd) sizes and, with `poison`, NaN-poisoned input layouts."""
    inp = (lambda a: embed(a, rng)) if poison else _identity
    dtype = np.float64 if ch.chance(15) else np.float32
    kind = ch.choice(["matmul", "matmul_bias_relu", "matmul_chain", "softmax", "layernorm", "rowsum_exp",
                      "colsum_exp", "conv1d", "conv2d", "maxpool1d", "pointwise", "reduce_broadcast",
                      # the multi-stage ones again: placement needs them
                      "matmul_bias_relu", "matmul_chain", "softmax", "layernorm", "reduce_broadcast"])
    s = lambda hi=max_size: draw_size(ch, min(hi, max_size))  # noqa: E731
    if kind == "matmul":
        return matmul(rng, s(), s(), s(), dtype, inp)
    if kind == "matmul_bias_relu":
        return matmul_bias_relu(rng, s(), s(), s(), dtype, inp)
    if kind == "matmul_chain":
        return matmul_chain(rng, s(16), s(16), s(16), s(16), dtype, inp)
    if kind == "softmax":
        return softmax(rng, s(), s(), dtype, inp)
    if kind == "layernorm":
        return layernorm(rng, s(), s(), dtype, inp)
    if kind == "rowsum_exp":
        return rowsum_exp(rng, s(), s(), dtype, inp)
    if kind == "colsum_exp":
        return colsum_exp(rng, s(), s(), dtype, inp)
    if kind == "conv1d":
        size, stride, dilation = ch.int(1, 3), ch.int(1, 2), ch.int(1, 2)
        padding = ch.int(0, 2)
        h = max(s(), dilation * (size - 1) + 1 - 2 * padding, 1)
        return conv1d(rng, s(4), h, s(5), size, stride, dilation, padding, dtype, inp)
    if kind == "conv2d":
        stride, padding = ch.int(1, 2), ch.int(0, 1)
        lo = 3 - 2 * padding
        return conv2d(rng, s(2), s(3), max(s(10), lo), max(s(10), lo), s(4), stride, padding, dtype, inp)
    if kind == "maxpool1d":
        size, stride = ch.int(1, 3), ch.int(1, 3)
        return maxpool1d(rng, s(), max(s(), size), size, stride, dtype, inp)
    if kind == "pointwise":
        return pointwise(rng, s(), s(), dtype, inp)
    return reduce_broadcast(rng, s(), s(), dtype, inp)


# ------------------------------------------------------------------ random schedules


class Rejected(Exception):
    """A transform refused to build (ValueError from the schedule)."""


def _split_factor(ch, extent: int) -> int:
    return ch.choice([1, 2, 3, 4, 5, 7, 8, 16, extent, extent + 1, ch.int(1, max(1, extent))])


def random_steps(tree: lt.LoopTree, ch, max_steps: int = 6, wild: bool = False):
    """Draw and apply a random transform sequence; returns (tree, steps).

    Normal mode draws what a user would plausibly write: splits with any factor,
    permutations of a stage's own loops, unroll of small loops, vectorize of the
    innermost loop, parallel of one of the two outermost loops, placement of a
    producer into one of its readers at any depth.  `wild` mode also vectorizes
    and parallelizes any loop and places stages inside any other stage, so that
    many schedules are illegal (for the oracle).  Raises Rejected (with the steps
    so far) when a transform refuses to build."""
    steps: list = []
    unrolls = 0
    n_steps = ch.int(0, max_steps)
    for _ in range(n_steps):
        program, sched = tree.program, tree.schedule
        stages = [st.name for st in program.stages]
        ops = ["split", "split", "reorder", "unroll", "vectorize", "parallel"]
        if len(stages) > 1:
            ops += ["place"] * 4
        op = ch.choice(ops)
        if op == "place":
            producer = ch.choice(stages[:-1])
            readers = [r.name for r in program.readers(producer)]
            candidates = [s for s in stages if s != producer] if wild else readers
            consumer = ch.choice(candidates)
            depth = ch.int(0, len(sched.effective_loops(consumer)))
            new = [("place", producer, consumer, depth)]
        else:
            stage = ch.choice(stages)
            own = sched.of(stage).loops
            if not own:
                continue
            # positions a placed stage shares cannot be split or reordered
            shared = max([sched.of(o).at for o in sched.placed_in(stage)] + [0])
            free = list(own[shared:]) if not wild else list(own)
            kw = {"stage": stage}
            if op == "split":
                if not free:
                    continue
                lp = ch.choice(free)
                step = ("split", lp.name, _split_factor(ch, lp.extent), kw)
            elif op == "reorder":
                if len(free) < 2:
                    continue
                step = ("reorder", *[lp.name for lp in ch.permutation(free)], kw)
            elif op == "unroll":
                small = [lp for lp in own if lp.extent <= 8]
                if not small or unrolls >= 2:
                    continue
                unrolls += 1
                step = ("unroll", ch.choice(small).name, kw)
            elif op == "vectorize":
                lp = ch.choice(own) if wild and ch.chance(50) else own[-1]
                step = ("vectorize", lp.name, kw)
            else:
                lp = ch.choice(own) if wild else ch.choice(own[:2])
                step = ("parallel", lp.name, kw)
            new = [step]
        try:
            tree = apply_steps(tree, new)
        except lt.IllegalScheduleError:
            raise
        except ValueError as err:
            raise Rejected(f"{steps_text(steps + new)}: {err}") from None
        except Exception as err:  # an implementation bug: say which steps built it
            err.add_note(f"while applying the steps {steps_text(steps + new)}")
            raise
        steps.extend(new)
    return tree, steps
