"""Front-end behaviour: symbols, naming, metadata and laziness (nothing is computed or
compiled while an expression is built)."""

import time

import numpy as np
import pytest

import looptool as lt
from tests.helpers import assert_close, check, f64, rand


# ------------------------------------------------------------------ symbols

def test_symbols_attributes_and_unpacking():
    s = lt.symbols("m k n")
    assert [s.m.name, s.k.name, s.n.name] == ["m", "k", "n"]
    for sym in (s.m, s.k, s.n):
        assert isinstance(sym, lt.Symbol)
    m, k, n = s
    assert (m, k, n) == (s.m, s.k, s.n)
    assert m is s.m and k is s.k and n is s.n
    assert len({m.name, k.name, n.name}) == 3


def test_symbols_fresh_per_call_have_given_names():
    a, b = lt.symbols("rows cols")
    assert (a.name, b.name) == ("rows", "cols")
    assert a != b


# ----------------------------------------------------------------- metadata

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_to_sets_dims_shape_dtype(rng, dtype):
    m, k = lt.symbols("m k")
    x = rand(rng, (4, 6), dtype)
    t = lt.Tensor(x).to(m, k)
    assert t.dims == (m, k)
    assert isinstance(t.dims, tuple)
    assert t.shape == (4, 6)
    assert all(type(s) is int for s in t.shape)
    assert isinstance(t.dtype, np.dtype) and t.dtype == np.dtype(dtype)
    check(t, x, dtype)


def test_tensor_accepts_nested_list_as_float64():
    m, k = lt.symbols("m k")
    data = [[1.5, -2.0, 3.25], [0.5, 4.0, -1.0]]
    t = lt.Tensor(data).to(m, k)
    assert t.shape == (2, 3)
    check(t, np.array(data), np.float64)


def test_result_metadata_of_expression_tree():
    a, b, c, d = lt.symbols("a b c d")
    x = lt.Tensor(np.ones((2, 3, 4), np.float32)).to(a, b, c)
    y = lt.Tensor(np.ones((4, 5), np.float64)).to(c, d)
    z = (x * y).exp()
    assert z.dims == (a, b, c, d)
    assert z.shape == (2, 3, 4, 5)
    assert z.dtype == np.float64
    r = z.sum(b, d)
    assert r.dims == (a, c) and r.shape == (2, 4)
    assert z.max(d, a).dims == (b, c)
    s = z.mean(a, b, c, d)
    assert s.dims == () and s.shape == ()


def test_scalar_reduction_numpy_is_0d_array(rng):
    m, k = lt.symbols("m k")
    x = rand(rng, (5, 7), np.float64, 0.0, 1.0)
    t = lt.Tensor(x).to(m, k).sum(k, m)
    got = check(t, np.array(x.sum()), np.float64, dims=())
    assert got.shape == () and got.ndim == 0


# ------------------------------------------------------------------ laziness

def test_building_huge_expression_costs_nothing():
    i, j = lt.symbols("i j")
    n = 200_000  # the outer product would hold 4e10 elements (160 GB)
    x = np.linspace(0.0, 1.0, n, dtype=np.float32)
    before = dict(lt.cache_info())
    t0 = time.perf_counter()
    outer = lt.Tensor(x).to(i) * lt.Tensor(x[::-1]).to(j)
    big = (outer.exp() + 1.0).sum(i)
    elapsed = time.perf_counter() - t0
    assert outer.shape == (n, n) and outer.dims == (i, j)
    assert big.shape == (n,) and big.dims == (j,)
    assert elapsed < 0.5
    assert lt.cache_info() == before


def test_division_by_zero_is_not_evaluated_while_building(rng):
    m, k = lt.symbols("m k")
    t = lt.Tensor(rand(rng, (3, 4), np.float32, 1.0, 2.0)).to(m, k)
    zeros = lt.Tensor(np.zeros((3, 4), np.float32)).to(m, k)
    before = dict(lt.cache_info())
    e1 = t / 0.0          # must not compute 1/0.0 in Python
    e2 = 1.0 / zeros
    e3 = t / zeros
    e4 = (t - t) / (zeros * 0.0)
    assert [e.shape for e in (e1, e2, e3, e4)] == [(3, 4)] * 4
    assert lt.cache_info() == before


def test_nothing_compiles_until_numpy(rng):
    m, k = lt.symbols("m k")
    x = rand(rng, (19, 23), np.float32, 0.1, 1.0)
    y = rand(rng, (23,), np.float32)
    before = dict(lt.cache_info())
    t = (lt.Tensor(x).to(m, k).sqrt() * 1.75 - lt.Tensor(y).to(k)).maximum(0.125).sum(m)
    assert t.shape == (23,)
    assert lt.cache_info() == before
    got = t.numpy()
    after = lt.cache_info()
    assert after["misses"] >= before["misses"] + 1
    assert_close(got, np.maximum(np.sqrt(f64(x)) * 1.75 - f64(y), 0.125).sum(0), 1e-5)
