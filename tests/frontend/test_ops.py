"""Pointwise ops, scalars, reductions, broadcasting by name, dtype promotion
and non-contiguous inputs, all checked against float64 NumPy references."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import looptool as lt
from tests.helpers import check, f64, rand, randn

DTYPES = [np.float32, np.float64]

# name -> (method call, looptool function, numpy reference, needs positive input)
UNARY = {
    "exp": (lambda t: t.exp(), lambda t: lt.exp(t), np.exp, False),
    "log": (lambda t: t.log(), lambda t: lt.log(t), np.log, True),
    "tanh": (lambda t: t.tanh(), lambda t: lt.tanh(t), np.tanh, False),
    "erf": (lambda t: t.erf(), lambda t: lt.erf(t), np.vectorize(math.erf), False),
    "sqrt": (lambda t: t.sqrt(), lambda t: lt.sqrt(t), np.sqrt, True),
    "abs": (lambda t: t.abs(), lambda t: lt.abs(t), np.abs, False),
    "reciprocal": (lambda t: t.reciprocal(), lambda t: lt.reciprocal(t), lambda x: 1.0 / x, True),
    "relu": (lambda t: t.relu(), lambda t: lt.relu(t), lambda x: np.maximum(x, 0.0), False),
    "neg": (lambda t: -t, None, np.negative, False),
}


def _unary_input(rng, name, dtype, shape=(7, 13)):
    if UNARY[name][3]:
        return rand(rng, shape, dtype, 0.25, 4.0)
    return rand(rng, shape, dtype, -2.0, 2.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_method(rng, name, dtype):
    m, k = lt.symbols("m k")
    x = _unary_input(rng, name, dtype)
    method, _, ref, _ = UNARY[name]
    check(method(lt.Tensor(x).to(m, k)), ref(f64(x)), dtype, dims=(m, k))


@pytest.mark.parametrize("name", [n for n in UNARY if UNARY[n][1] is not None])
def test_unary_function_form(rng, name):
    m, k = lt.symbols("m k")
    x = _unary_input(rng, name, np.float32)
    _, func, ref, _ = UNARY[name]
    check(func(lt.Tensor(x).to(m, k)), ref(f64(x)), np.float32, dims=(m, k))


def test_relu_and_abs_of_mixed_signs_hit_both_branches(rng):
    m, k = lt.symbols("m k")
    x = rand(rng, (7, 13), np.float32, -2.0, 2.0)
    assert (x < 0).any() and (x > 0).any()
    t = lt.Tensor(x).to(m, k)
    got = t.relu().numpy()
    assert (got[x < 0] == 0).all() and np.array_equal(got[x > 0], x[x > 0])


BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "div": (lambda a, b: a / b, np.divide),
    "maximum": (lambda a, b: a.maximum(b), np.maximum),
    "minimum": (lambda a, b: a.minimum(b), np.minimum),
}


@pytest.mark.parametrize("name, dtype", [(n, d) for n in BINARY for d in DTYPES
                                         if d == np.float32 or n in ("add", "sub", "mul", "div")])
def test_binary_same_dims(rng, name, dtype):
    m, k = lt.symbols("m k")
    x = rand(rng, (7, 13), dtype, -2.0, 2.0)
    y = rand(rng, (7, 13), dtype, 0.5, 2.0) if name == "div" else rand(rng, (7, 13), dtype, -2.0, 2.0)
    op, ref = BINARY[name]
    check(op(lt.Tensor(x).to(m, k), lt.Tensor(y).to(m, k)), ref(f64(x), f64(y)), dtype, dims=(m, k))


@pytest.mark.parametrize("func, ref", [(lambda a, b: lt.maximum(a, b), np.maximum),
                                       (lambda a, b: lt.minimum(a, b), np.minimum)],
                         ids=["lt.maximum", "lt.minimum"])
def test_binary_function_form(rng, func, ref):
    m, k = lt.symbols("m k")
    x, y = rand(rng, (7, 13), np.float32), rand(rng, (7, 13), np.float32)
    check(func(lt.Tensor(x).to(m, k), lt.Tensor(y).to(m, k)), ref(f64(x), f64(y)), np.float32)


SCALAR = {
    "t+1.5": (lambda t: t + 1.5, lambda x: x + 1.5),
    "1.5+t": (lambda t: 1.5 + t, lambda x: 1.5 + x),
    "t-2": (lambda t: t - 2, lambda x: x - 2.0),
    "2.0-t": (lambda t: 2.0 - t, lambda x: 2.0 - x),
    "t*3": (lambda t: t * 3, lambda x: x * 3.0),
    "0.5*t": (lambda t: 0.5 * t, lambda x: 0.5 * x),
    "t/3": (lambda t: t / 3, lambda x: x / 3.0),
    "3.0/t": (lambda t: 3.0 / t, lambda x: 3.0 / x),
    "t.maximum(0.25)": (lambda t: t.maximum(0.25), lambda x: np.maximum(x, 0.25)),
    "lt.maximum(t,0.25)": (lambda t: lt.maximum(t, 0.25), lambda x: np.maximum(x, 0.25)),
    "t.minimum(1.5)": (lambda t: t.minimum(1.5), lambda x: np.minimum(x, 1.5)),
    "lt.minimum(t,1.5)": (lambda t: lt.minimum(t, 1.5), lambda x: np.minimum(x, 1.5)),
}


@pytest.mark.parametrize("name", list(SCALAR))
def test_python_scalar_operands_keep_dtype(rng, name):
    m, k = lt.symbols("m k")
    x = rand(rng, (5, 9), np.float32, 0.25, 2.0)
    op, ref = SCALAR[name]
    check(op(lt.Tensor(x).to(m, k)), ref(f64(x)), np.float32, dims=(m, k))


def test_python_scalars_keep_float64(rng):
    m, k = lt.symbols("m k")
    x = rand(rng, (5, 9), np.float64, 0.25, 2.0)
    t = lt.Tensor(x).to(m, k)
    check((1 - t) / 3 + t.maximum(0.5) * 2.0, (1 - f64(x)) / 3 + np.maximum(x, 0.5) * 2.0, np.float64)


# --------------------------------------------------------------- reductions

RED = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean}
SYMS3 = "a b c"


def _reduce_case(rng, op, axes_names, dtype):
    a, b, c = syms = lt.symbols(SYMS3)
    by_name = dict(zip("abc", syms))
    # uniform(-1, 2): sums are well away from 0, so relative error is meaningful
    x = rand(rng, (5, 6, 7), dtype, -1.0, 2.0)
    t = lt.Tensor(x).to(a, b, c)
    res = getattr(t, op)(*[by_name[s] for s in axes_names])
    axes = tuple("abc".index(s) for s in axes_names)
    keep = tuple(by_name[s] for s in "abc" if s not in axes_names)
    return res, RED[op](f64(x), axis=axes), keep


@pytest.mark.parametrize("axes", ["a", "c", "ac", "abc"])
@pytest.mark.parametrize("op", list(RED))
def test_reduction_float32(rng, op, axes):
    res, ref, keep = _reduce_case(rng, op, axes, np.float32)
    got = check(res, ref, np.float32, dims=keep)
    assert got.ndim == 3 - len(axes)


@pytest.mark.parametrize("op, axes", [("sum", "cb"), ("max", "cab"), ("min", "cb"), ("mean", "cab")])
def test_reduction_float64_names_in_any_order(rng, op, axes):
    res, ref, keep = _reduce_case(rng, op, axes, np.float64)
    check(res, ref, np.float64, dims=keep)


def test_max_min_of_all_negative_and_all_positive(rng):
    m, k = lt.symbols("m k")
    neg = rand(rng, (4, 9), np.float32, -5.0, -1.0)
    pos = rand(rng, (4, 9), np.float32, 1.0, 5.0)
    # catches accumulators initialised with 0 instead of -inf / +inf
    check(lt.Tensor(neg).to(m, k).max(k), f64(neg).max(1), np.float32)
    check(lt.Tensor(pos).to(m, k).min(k), f64(pos).min(1), np.float32)


def test_reduce_then_broadcast_back(rng):
    m, k = lt.symbols("m k")
    x = rand(rng, (6, 8), np.float64, -1.0, 2.0)
    t = lt.Tensor(x).to(m, k)
    centred = t - t.mean(m, k)   # 0-d operand broadcasts against everything
    check(centred, f64(x) - f64(x).mean(), np.float64, dims=(m, k))
    check(t / t.sum(m), f64(x) / f64(x).sum(0), np.float64, dims=(m, k))


# -------------------------------------------------------------- broadcasting

def _bcast_cases():
    T = lt.Tensor

    def c(desc, build, ref, dims):
        return pytest.param(build, ref, dims, id=desc)
    return [
        c("mk+k", lambda s, x, y, u, v: T(x).to(s.m, s.k) + T(v).to(s.k),
          lambda x, y, u, v: x + v, "mk"),
        c("k+mk", lambda s, x, y, u, v: T(v).to(s.k) + T(x).to(s.m, s.k),
          lambda x, y, u, v: (v + x).T, "km"),
        c("mk*m", lambda s, x, y, u, v: T(x).to(s.m, s.k) * T(u).to(s.m),
          lambda x, y, u, v: x * u[:, None], "mk"),
        c("m-mk", lambda s, x, y, u, v: T(u).to(s.m) - T(x).to(s.m, s.k),
          lambda x, y, u, v: u[:, None] - x, "mk"),
        c("m*k outer", lambda s, x, y, u, v: T(u).to(s.m) * T(v).to(s.k),
          lambda x, y, u, v: np.outer(u, v), "mk"),
        c("k/m outer", lambda s, x, y, u, v: T(v).to(s.k) / (T(u).to(s.m) * T(u).to(s.m) + 1.0),
          lambda x, y, u, v: v[:, None] / (u * u + 1.0)[None, :], "km"),
        c("mk+km by name", lambda s, x, y, u, v: T(x).to(s.m, s.k) + T(y).to(s.k, s.m),
          lambda x, y, u, v: x + y.T, "mk"),
        c("mk*kn", lambda s, x, y, u, v: T(x).to(s.m, s.k) * T(y).to(s.k, s.n),
          lambda x, y, u, v: x[:, :, None] * y[None, :, :], "mkn"),
    ]


@pytest.mark.parametrize("build, ref, dims", _bcast_cases())
def test_broadcasting_by_name(rng, build, ref, dims):
    s = lt.symbols("m k n")
    mm, kk = 5, 7  # non-square, so a wrong axis order cannot pass
    x, y = rand(rng, (mm, kk)), rand(rng, (kk, mm))
    u, v = rand(rng, (mm,)), rand(rng, (kk,))
    t = build(s, x, y, u, v)
    check(t, ref(f64(x), f64(y), f64(u), f64(v)), np.float32, dims=tuple(getattr(s, d) for d in dims))


@settings(max_examples=6, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mm=st.integers(1, 9), kk=st.integers(1, 9), seed=st.integers(0, 2**32 - 1),
       dtype=st.sampled_from(DTYPES))
def test_broadcast_reduce_property(mm, kk, seed, dtype):
    rng = np.random.default_rng(seed)
    m, k = lt.symbols("m k")
    x, v = rand(rng, (mm, kk), dtype, 0.5, 2.0), rand(rng, (kk,), dtype, 0.5, 2.0)
    t = (lt.Tensor(v).to(k) * lt.Tensor(x).to(m, k)).sum(m)
    check(t, (f64(v)[None, :] * f64(x)).sum(0), dtype, dims=(k,))


# --------------------------------------------------------- dtype promotion

@pytest.mark.parametrize("left, right", [(np.float32, np.float64), (np.float64, np.float32)])
def test_mixed_precision_promotes_to_float64(rng, left, right):
    m, k = lt.symbols("m k")
    x, y = rand(rng, (4, 5), left), rand(rng, (4, 5), right)
    X, Y = lt.Tensor(x).to(m, k), lt.Tensor(y).to(m, k)
    assert (X * Y).dtype == np.float64 and (X - Y).dtype == np.float64
    # float32 inputs are exact in float64, so the float64 tolerance applies
    check(X * Y + X.maximum(Y), f64(x) * f64(y) + np.maximum(f64(x), f64(y)), np.float64)


def test_mixed_precision_matmul_is_float64(rng):
    m, k, n = lt.symbols("m k n")
    a, b = randn(rng, (9, 97), np.float32), randn(rng, (97, 5), np.float64)
    check((lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k), f64(a) @ f64(b), np.float64)


def test_float32_stays_float32_through_everything(rng):
    m, k = lt.symbols("m k")
    x = rand(rng, (4, 5), np.float32, 0.5, 1.0)
    t = lt.Tensor(x).to(m, k)
    for e in (t + 1, 2.0 * t, t.exp(), lt.sqrt(t), t.sum(m), t.mean(m, k), t.max(k), t.maximum(0.7)):
        assert e.dtype == np.float32


# ------------------------------------------------------ non-contiguous input

NONCONTIG = {
    "transposed": lambda base: base.T,
    "step-sliced": lambda base: base[1::2, ::3],
    "negative-rows": lambda base: base[::-1],
    "negative-cols-step": lambda base: base[2:, ::-2],
    "fortran": lambda base: np.asfortranarray(base[:7, :9]),
}


def _noncontig(rng, kind):
    x = NONCONTIG[kind](rand(rng, (12, 20), np.float32, 0.5, 2.0))
    assert not x.flags.c_contiguous
    return x


@pytest.mark.parametrize("kind", list(NONCONTIG))
def test_noncontiguous_pointwise(rng, kind):
    m, k = lt.symbols("m k")
    x = _noncontig(rng, kind)
    check(lt.Tensor(x).to(m, k).log() * 2.0 + 1.0, np.log(f64(x)) * 2.0 + 1.0, np.float32, dims=(m, k))


@pytest.mark.parametrize("kind", ["transposed", "negative-cols-step"])
def test_noncontiguous_reduction(rng, kind):
    m, k = lt.symbols("m k")
    x = _noncontig(rng, kind)
    check(lt.Tensor(x).to(m, k).sum(m), f64(x).sum(0), np.float32, dims=(k,))


def test_noncontiguous_matmul_operands(rng):
    m, k, n = lt.symbols("m k n")
    a = randn(rng, (31, 17), np.float64).T          # (17, 31), transposed
    b = randn(rng, (62, 45), np.float64)[::-2, 1::3]  # (31, 15), negative + step strides
    check((lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k), a @ b, np.float64, dims=(m, n))


def test_noncontiguous_input_values_copied_correctly(rng):
    m, k = lt.symbols("m k")
    base = rand(rng, (8, 10), np.float64)
    x = base[::-3, ::2]
    check(lt.Tensor(x).to(m, k), x, np.float64)
