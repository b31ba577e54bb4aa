"""Model-level computations written from primitives: matmul, softmax,
layer-norm, conv2d, max-pool, an MLP and attention."""

import math

import numpy as np
import pytest

import looptool as lt
from tests.helpers import (check, conv2d_nchw_ref, f64, layernorm_ref, maxpool2x2_ref, rand, randn,
                     softmax_ref)

DTYPES = [np.float32, np.float64]


def matmul(a, b):
    m, k, n = lt.symbols("m k n")
    return (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k), (m, n)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mm, kk, nn", [
    (1, 1, 1), (97, 97, 97), (257, 257, 257),          # square
    (1, 97, 257), (257, 1, 97), (97, 257, 1), (31, 64, 17),  # non-square
])
def test_matmul(rng, mm, kk, nn, dtype):
    a, b = randn(rng, (mm, kk), dtype), randn(rng, (kk, nn), dtype)
    t, dims = matmul(a, b)
    assert t.shape == (mm, nn)
    check(t, f64(a) @ f64(b), dtype, dims=dims)


def test_matmul_result_feeds_further_ops(rng):
    m, k, n = lt.symbols("m k n")
    a, b, bias = randn(rng, (20, 30)), randn(rng, (30, 10)), randn(rng, (10,))
    t = ((lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k) + lt.Tensor(bias).to(n)).relu()
    check(t, np.maximum(f64(a) @ f64(b) + f64(bias), 0.0), np.float32, dims=(m, n))


def softmax(xt, dim):
    e = (xt - xt.max(dim)).exp()
    return e / e.sum(dim)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_rows(rng, dtype):
    m, n = lt.symbols("m n")
    x = (randn(rng, (33, 65), np.float64) * 4.0).astype(dtype)
    t = softmax(lt.Tensor(x).to(m, n), n)
    got = check(t, softmax_ref(x, 1), dtype, dims=(m, n))
    assert np.allclose(got.sum(axis=1), 1.0, rtol=0, atol=1e-5)


def test_softmax_over_first_dim_and_large_values(rng):
    m, n = lt.symbols("m n")
    # values near 1000: exp overflows unless the max is subtracted
    x = (1000.0 + randn(rng, (17, 9), np.float64)).astype(np.float32)
    check(softmax(lt.Tensor(x).to(m, n), m), softmax_ref(x, 0), np.float32, dims=(m, n))


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm(rng, dtype):
    m, n = lt.symbols("m n")
    x = (randn(rng, (24, 48), np.float64) * 3.0 + 2.0).astype(dtype)
    gamma = rand(rng, (48,), dtype, 0.5, 1.5)
    beta = rand(rng, (48,), dtype, -0.5, 0.5)
    xt = lt.Tensor(x).to(m, n)
    mu = xt.mean(n)
    var = ((xt - mu) * (xt - mu)).mean(n)
    y = (xt - mu) / (var + 1e-5).sqrt() * lt.Tensor(gamma).to(n) + lt.Tensor(beta).to(n)
    check(y, layernorm_ref(x, gamma, beta), dtype, dims=(m, n))


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv2d_nchw_pad1_stride2(rng, dtype):
    n, c, h, w, o, oh, ow, kh, kw = lt.symbols("n c h w o oh ow kh kw")
    x = randn(rng, (2, 3, 11, 10), dtype)
    wt = randn(rng, (5, 3, 3, 3), dtype)
    xw = (lt.Tensor(x).to(n, c, h, w)
          .window(h, oh, kh, 3, stride=2, padding=1)
          .window(w, ow, kw, 3, stride=2, padding=1))
    assert xw.dims == (n, c, oh, kh, ow, kw)
    y = (xw * lt.Tensor(wt).to(o, c, kh, kw)).sum(c, kh, kw)
    assert y.dims == (n, oh, ow, o)
    assert y.shape == (2, 6, 5, 5)
    ref = conv2d_nchw_ref(x, wt, stride=2, padding=1)          # (n, o, oh, ow)
    got = check(y, np.transpose(ref, (0, 2, 3, 1)), dtype)
    assert np.transpose(got, (0, 3, 1, 2)).shape == ref.shape


def test_conv2d_bias_relu_stride1(rng):
    n, c, h, w, o, oh, ow, kh, kw = lt.symbols("n c h w o oh ow kh kw")
    x, wt, bias = randn(rng, (1, 4, 8, 8)), randn(rng, (6, 4, 3, 3)), randn(rng, (6,))
    xw = lt.Tensor(x).to(n, c, h, w).window(h, oh, kh, 3, padding=1).window(w, ow, kw, 3, padding=1)
    y = ((xw * lt.Tensor(wt).to(o, c, kh, kw)).sum(c, kh, kw) + lt.Tensor(bias).to(o)).relu()
    ref = np.maximum(conv2d_nchw_ref(x, wt, 1, 1) + f64(bias)[None, :, None, None], 0.0)
    check(y, np.transpose(ref, (0, 2, 3, 1)), np.float32, dims=(n, oh, ow, o))


@pytest.mark.parametrize("dtype, hw", [(np.float32, (8, 10)), (np.float64, (9, 7))],
                         ids=["even-f32", "odd-f64"])
def test_maxpool_2x2(rng, dtype, hw):
    n, c, h, w, ph, pw, i, j = lt.symbols("n c h w ph pw i j")
    x = randn(rng, (2, 3) + hw, dtype)
    t = lt.Tensor(x).to(n, c, h, w).window(h, ph, i, 2, stride=2).window(w, pw, j, 2, stride=2).max(i, j)
    assert t.shape == (2, 3, hw[0] // 2, hw[1] // 2)
    check(t, maxpool2x2_ref(x), dtype, dims=(n, c, ph, pw))


def test_two_layer_mlp(rng):
    b, i, j, o = lt.symbols("b i j o")
    x, w1, b1 = randn(rng, (8, 16)), randn(rng, (16, 32)) * 0.25, randn(rng, (32,))
    w2, b2 = randn(rng, (32, 4)) * 0.25, randn(rng, (4,))
    hid = ((lt.Tensor(x).to(b, i) * lt.Tensor(w1).to(i, j)).sum(i) + lt.Tensor(b1).to(j)).relu()
    out = (hid * lt.Tensor(w2).to(j, o)).sum(j) + lt.Tensor(b2).to(o)
    ref = np.maximum(f64(x) @ f64(w1) + f64(b1), 0.0) @ f64(w2) + f64(b2)
    check(out, ref, np.float32, dims=(b, o))


def test_attention_head(rng):
    s, t, d, e = lt.symbols("s t d e")
    q, k, v = randn(rng, (6, 8), np.float64), randn(rng, (10, 8), np.float64), randn(rng, (10, 5), np.float64)
    scores = (lt.Tensor(q).to(s, d) * lt.Tensor(k).to(t, d)).sum(d) * (1.0 / math.sqrt(8.0))
    assert scores.dims == (s, t)
    out = (softmax(scores, t) * lt.Tensor(v).to(t, e)).sum(t)
    ref = softmax_ref(q @ k.T / np.sqrt(8.0), 1) @ v
    check(out, ref, np.float64, dims=(s, e))
