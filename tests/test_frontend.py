"""Front-end behaviour: symbols, naming, metadata, laziness, inspection
(loop tree, LLVM IR, assembly), the compile cache and the interpreter."""

import re
import time
import tracemalloc

import numpy as np
import pytest

import looptool as lt
from helpers import (assert_close, check, conv2d_nchw_ref, f64, maxpool2x2_ref, pad_ref,
                     rand, randn, rtol_for, softmax_ref, window_ref)


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


# ------------------------------------------------------------------- cache

def _cache_expr(x, y):
    a, b = lt.symbols("a b")
    return ((lt.Tensor(x).to(a, b) * 2.5 + lt.Tensor(y).to(b)).relu()).sum(a)


def test_cache_hit_for_same_computation_miss_for_new_shape(rng):
    info = lt.cache_info()
    assert isinstance(info["hits"], int) and isinstance(info["misses"], int)

    x1, y1 = rand(rng, (37, 41)), rand(rng, (41,))
    x2, y2 = rand(rng, (37, 41)), rand(rng, (41,))
    x3, y3 = rand(rng, (38, 43)), rand(rng, (43,))
    ref = lambda x, y: np.maximum(f64(x) * 2.5 + f64(y), 0).sum(0)

    s0 = dict(lt.cache_info())
    assert_close(_cache_expr(x1, y1).numpy(), ref(x1, y1), 1e-5)
    s1 = dict(lt.cache_info())
    assert s1["misses"] > s0["misses"], "first build of a new computation must compile"

    # Same computation, new Tensor objects, new data: a hit, no compilation.
    assert_close(_cache_expr(x2, y2).numpy(), ref(x2, y2), 1e-5)
    s2 = dict(lt.cache_info())
    assert s2["misses"] == s1["misses"]
    assert s2["hits"] > s1["hits"]

    # Different shapes: compiled anew.
    assert_close(_cache_expr(x3, y3).numpy(), ref(x3, y3), 1e-5)
    s3 = dict(lt.cache_info())
    assert s3["misses"] > s2["misses"]


def test_cache_miss_for_different_dtype(rng):
    x, y = rand(rng, (29, 31)), rand(rng, (31,))
    _cache_expr(x, y).numpy()
    s1 = dict(lt.cache_info())
    got = _cache_expr(x.astype(np.float64), y.astype(np.float64)).numpy()
    s2 = dict(lt.cache_info())
    assert got.dtype == np.float64
    assert s2["misses"] > s1["misses"]
    assert_close(got, np.maximum(f64(x) * 2.5 + f64(y), 0).sum(0), 1e-12)


# -------------------------------------------------------------- inspection

def _matmul(rng, mm, kk, nn, dtype=np.float32):
    m, k, n = lt.symbols("m k n")
    a, b = randn(rng, (mm, kk), dtype), randn(rng, (kk, nn), dtype)
    return (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k), a, b


def _loop_lines(text):
    return [ln for ln in text.splitlines() if re.match(r"\s*for\b", ln)]


def _indent(line):
    return len(line) - len(line.lstrip())


def _assert_loop_tree_text(text, sizes):
    loops = _loop_lines(text)
    assert loops, f"no 'for' lines in loop tree:\n{text}"
    for name, size in sizes.items():
        pat = rf"^\s*for\b.*(?<!\w){name}(?!\w).*(?<!\d){size}(?!\d)"
        assert re.search(pat, text, re.M), f"no loop line for {name} with size {size}:\n{text}"
    # Nested loops are indented deeper; statements sit inside loops.
    assert len({_indent(ln) for ln in loops}) >= 2, f"loops not nested/indented:\n{text}"
    body = [ln for ln in text.splitlines() if ln.strip() and not re.match(r"\s*for\b", ln)]
    assert any(_indent(ln) > min(_indent(lp) for lp in loops) for ln in body), (
        f"no statement inside a loop:\n{text}")


def test_loop_tree_text_for_matmul(rng):
    t, _, _ = _matmul(rng, 23, 29, 31)
    before = dict(lt.cache_info())
    text = str(t.loop_tree())
    _assert_loop_tree_text(text, {"m": 23, "k": 29, "n": 31})
    assert lt.cache_info()["hits"] == before["hits"]  # inspection does not execute


def test_loop_tree_text_for_window_and_reduction(rng):
    h, oh, kh, c = lt.symbols("h oh kh c")
    x = lt.Tensor(rand(rng, (17, 5))).to(h, c)
    t = x.window(h, oh, kh, 3, stride=2).max(kh).sum(c)
    assert t.dims == (oh,) and t.shape == (8,)
    _assert_loop_tree_text(str(t.loop_tree()), {"oh": 8, "kh": 3, "c": 5})


@pytest.mark.parametrize("dtype, ir_type", [(np.float32, "float"), (np.float64, "double")])
def test_compile_exposes_llvm_ir_and_assembly(rng, dtype, ir_type):
    t, a, b = _matmul(rng, 13, 11, 9, dtype)
    kernel = t.compile()
    ir = kernel.llvm_ir
    asm = kernel.assembly
    assert isinstance(ir, str) and "define" in ir
    assert re.search(rf"(?<!\w){ir_type}(?!\w)", ir), f"no {ir_type} type in IR"
    assert isinstance(asm, str) and len(asm) > 0
    assert re.search(r"(?<!\w)ret\w*", asm), "assembly has no return instruction"
    assert "define" not in asm  # native assembly, not LLVM IR
    _assert_loop_tree_text(str(kernel.loop_tree), {"m": 13, "k": 11, "n": 9})
    check(t, f64(a) @ f64(b), dtype)


# ------------------------------------------------------ matmul temporaries

def test_matmul_does_not_allocate_mkn_temporary(rng):
    mm = kk = nn = 256  # an m*k*n float64 temporary would be 128 MiB
    t, a, b = _matmul(rng, mm, kk, nn, np.float64)
    t.compile()  # keep compilation out of the measurement
    tracemalloc.start()
    try:
        got = t.numpy()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < mm * kk * nn * 8 // 8, f"peak traced allocation {peak} bytes during matmul"
    assert_close(got, f64(a) @ f64(b), 1e-12)


# -------------------------------------------------------------- interpreter

def _case_matmul(rng):
    m, k, n = lt.symbols("m k n")
    a, b = randn(rng, (5, 7)), randn(rng, (7, 3))
    return (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k), f64(a) @ f64(b)


def _case_softmax(rng):
    m, n = lt.symbols("m n")
    x = randn(rng, (4, 9), np.float64)
    xt = lt.Tensor(x).to(m, n)
    e = (xt - xt.max(n)).exp()
    return e / e.sum(n), softmax_ref(x, 1)


def _case_conv2d(rng):
    p, c, h, w, o, oh, ow, kh, kw = lt.symbols("p c h w o oh ow kh kw")
    img, wt = randn(rng, (2, 3, 7, 6)), randn(rng, (4, 3, 3, 3))
    xw = (lt.Tensor(img).to(p, c, h, w)
          .window(h, oh, kh, 3, stride=2, padding=1).window(w, ow, kw, 3, stride=2, padding=1))
    conv = (xw * lt.Tensor(wt).to(o, c, kh, kw)).sum(c, kh, kw)
    return conv, np.transpose(conv2d_nchw_ref(img, wt, 2, 1), (0, 2, 3, 1))


def _case_maxpool(rng):
    p, c, h, w, oh, ow, kh, kw = lt.symbols("p c h w oh ow kh kw")
    img = randn(rng, (2, 3, 7, 6))
    pool = (lt.Tensor(img).to(p, c, h, w).window(h, oh, kh, 2, stride=2)
            .window(w, ow, kw, 2, stride=2).max(kh, kw))
    return pool, maxpool2x2_ref(img)


def _case_pad(rng):
    m, k, q = lt.symbols("m k q")
    v = randn(rng, (6, 5))
    return lt.Tensor(v).to(m, k).pad(k, q, (2, 1), value=-1.5), pad_ref(v, 1, (2, 1), -1.5)


def _case_window(rng):
    m, k, oh, kh = lt.symbols("m k oh kh")
    v = randn(rng, (6, 5))
    t = lt.Tensor(v).to(m, k).window(m, oh, kh, 2, stride=2, dilation=2, padding=(1, 0))
    return t, window_ref(v, 0, 2, 2, 2, (1, 0))


def _case_concat(rng):
    i, j, n, cat = lt.symbols("i j n cat")
    u1, u2 = randn(rng, (2, 3)), randn(rng, (4, 3))
    t = lt.concat([lt.Tensor(u1).to(i, n), lt.Tensor(u2).to(j, n)], [i, j], cat)
    return t, np.concatenate([f64(u1), f64(u2)], 0)


def _case_scalar(rng):
    m, k = lt.symbols("m k")
    v = rand(rng, (6, 5), np.float32, -1.0, 2.0)
    return lt.Tensor(v).to(m, k).mean(m, k), np.array(f64(v).mean())


INTERP_CASES = {f.__name__[len("_case_"):]: f for f in
                (_case_matmul, _case_softmax, _case_conv2d, _case_maxpool, _case_pad, _case_window,
                 _case_concat, _case_scalar)}


@pytest.mark.parametrize("case", list(INTERP_CASES))
def test_interpreter_oracle(rng, case):
    t, ref = INTERP_CASES[case](rng)
    before = dict(lt.cache_info())
    got = np.asarray(lt.interpret(t))
    assert lt.cache_info()["misses"] == before["misses"], "interpret compiled a kernel"
    assert got.shape == tuple(t.shape)
    assert_close(got, ref, rtol_for(t.dtype))


@pytest.mark.parametrize("case", ["conv2d", "scalar"])
def test_interpreter_and_compiled_agree(rng, case):
    t, ref = INTERP_CASES[case](rng)
    interp = np.asarray(lt.interpret(t))
    compiled = t.numpy()
    assert_close(compiled, ref, rtol_for(t.dtype))
    assert_close(interp, ref, rtol_for(t.dtype))
    assert_close(compiled, f64(interp), 10 * rtol_for(t.dtype))
