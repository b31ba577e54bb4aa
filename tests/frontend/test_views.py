"""Index views: pad, window and concat."""

import numpy as np
import pytest

import looptool as lt
from tests.helpers import check, f64, norm_pad, pad_ref, rand, window_ref

# --------------------------------------------------------------------- pad


@pytest.mark.parametrize("axis, amount, value", [
    (1, 2, 0.0),             # int amount: both sides, last dim
    (0, (1, 3), 0.0),        # asymmetric, first dim
    (1, (0, 2), 2.5),        # only after, custom value
    (0, (3, 0), -np.inf),    # only before, -inf shows up in the output
], ids=["last-int", "first-asym", "after-value", "before-neginf"])
def test_pad_2d(rng, axis, amount, value):
    m, w, p = lt.symbols("m w p")
    x = rand(rng, (5, 7), np.float32)
    t = lt.Tensor(x).to(m, w)
    padded = t.pad(w if axis == 1 else m, p, amount, value=value)
    before, after = norm_pad(amount)
    dims = (m, p) if axis == 1 else (p, w)
    shape = list(x.shape)
    shape[axis] += before + after
    assert padded.shape == tuple(shape)
    check(padded, pad_ref(x, axis, amount, value), np.float32, dims=dims)


def test_pad_default_value_is_zero_and_middle_dim_position(rng):
    a, b, c, bp = lt.symbols("a b c bp")
    x = rand(rng, (2, 3, 4), np.float64)
    t = lt.Tensor(x).to(a, b, c).pad(b, bp, (2, 1))
    assert t.dims == (a, bp, c) and t.shape == (2, 6, 4)
    got = check(t, pad_ref(x, 1, (2, 1), 0.0), np.float64)
    assert (got[:, :2] == 0).all() and (got[:, -1:] == 0).all()


def test_pad_applies_before_following_pointwise_op(rng):
    m, w, p = lt.symbols("m w p")
    x = rand(rng, (4, 6), np.float32, 0.5, 1.0)
    t = (lt.Tensor(x).to(m, w).pad(w, p, 1) + 1.0).exp()
    # padded zeros become exp(0 + 1) = e
    check(t, np.exp(pad_ref(x, 1, 1) + 1.0), np.float32, dims=(m, p))


def test_pad_of_expression_with_neg_inf_then_max(rng):
    m, w, p = lt.symbols("m w p")
    x = rand(rng, (6, 5), np.float32, -4.0, -1.0)  # all negative: a 0 pad would win
    t = (lt.Tensor(x).to(m, w) * 2.0).pad(w, p, (2, 3), value=-np.inf).max(p)
    check(t, (f64(x) * 2.0).max(1), np.float32, dims=(m,))


def test_maxpool_3x3_stride2_with_neg_inf_padding(rng):
    n, c, h, w, hp, wp, oh, ow, i, j = lt.symbols("n c h w hp wp oh ow i j")
    x = rand(rng, (2, 3, 9, 8), np.float32, -3.0, -0.5)
    t = (lt.Tensor(x).to(n, c, h, w)
         .pad(h, hp, 1, value=-np.inf).pad(w, wp, 1, value=-np.inf)
         .window(hp, oh, i, 3, stride=2).window(wp, ow, j, 3, stride=2)
         .max(i, j))
    xp = np.pad(f64(x), ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    ref = window_ref(window_ref(xp, 2, 3, 2), 4, 3, 2).max(axis=(3, 5))
    assert ref.shape == (2, 3, 5, 4)
    check(t, ref, np.float32, dims=(n, c, oh, ow))


# ------------------------------------------------------------------ window

@pytest.mark.parametrize("size, stride, dilation, padding", [
    (3, 1, 1, 0),
    (3, 2, 1, 1),
    (2, 2, 1, 0),
    (3, 1, 2, 0),
    (3, 3, 2, (2, 1)),
    (4, 2, 1, (0, 3)),
    (11, 1, 1, 0),       # window as large as the dim: one output position
])
def test_window_last_dim(rng, size, stride, dilation, padding):
    m, w, ow, kw = lt.symbols("m w ow kw")
    x = rand(rng, (4, 11), np.float32)
    t = lt.Tensor(x).to(m, w).window(w, ow, kw, size, stride=stride, dilation=dilation,
                                     padding=padding)
    before, after = norm_pad(padding)
    n_out = (11 + before + after - dilation * (size - 1) - 1) // stride + 1
    assert t.dims == (m, ow, kw)
    assert t.shape == (4, n_out, size)
    check(t, window_ref(x, 1, size, stride, dilation, padding), np.float32)


def test_window_first_dim_of_3d_keeps_position(rng):
    a, b, c, o, r = lt.symbols("a b c o r")
    x = rand(rng, (9, 3, 2), np.float64)
    t = lt.Tensor(x).to(a, b, c).window(a, o, r, 4, stride=2, padding=(1, 2))
    assert t.dims == (o, r, b, c) and t.shape == (5, 4, 3, 2)
    check(t, window_ref(x, 0, 4, 2, 1, (1, 2)), np.float64)


def test_window_then_sum_is_1d_convolution(rng):
    n, t_, o, r = lt.symbols("n t o r")
    sig = rand(rng, (3, 50), np.float32)
    ker = rand(rng, (5,), np.float32)
    y = (lt.Tensor(sig).to(n, t_).window(t_, o, r, 5, padding=2) * lt.Tensor(ker).to(r)).sum(r)
    ref = np.stack([np.correlate(np.pad(f64(s), 2), f64(ker), mode="valid") for s in sig])
    check(y, ref, np.float32, dims=(n, o))


# ------------------------------------------------------------------ concat

def test_concat_two_along_first_dim(rng):
    i, j, n, k = lt.symbols("i j n k")
    a, b = rand(rng, (3, 5)), rand(rng, (4, 5))
    t = lt.concat([lt.Tensor(a).to(i, n), lt.Tensor(b).to(j, n)], [i, j], k)
    assert t.shape == (7, 5)
    check(t, np.concatenate([a, b], axis=0), np.float32, dims=(k, n))


def test_concat_three_along_last_dim(rng):
    m, i, j, l, k = lt.symbols("m i j l k")
    a, b, c = rand(rng, (4, 2)), rand(rng, (4, 3)), rand(rng, (4, 1))
    t = lt.concat([lt.Tensor(a).to(m, i), lt.Tensor(b).to(m, j), lt.Tensor(c).to(m, l)], [i, j, l], k)
    assert t.shape == (4, 6)
    check(t, np.concatenate([a, b, c], axis=1), np.float32, dims=(m, k))


def test_concat_three_along_first_dim_float64(rng):
    i, j, l, k, n = lt.symbols("i j l k n")
    a, b, c = rand(rng, (1, 3), np.float64), rand(rng, (5, 3), np.float64), rand(rng, (2, 3), np.float64)
    t = lt.concat([lt.Tensor(a).to(i, n), lt.Tensor(b).to(j, n), lt.Tensor(c).to(l, n)], [i, j, l], k)
    check(t, np.concatenate([a, b, c], axis=0), np.float64, dims=(k, n))


def test_concat_two_along_last_dim_of_3d(rng):
    p, q, i, j, k = lt.symbols("p q i j k")
    a, b = rand(rng, (2, 3, 4)), rand(rng, (2, 3, 2))
    t = lt.concat([lt.Tensor(a).to(p, q, i), lt.Tensor(b).to(p, q, j)], [i, j], k)
    check(t, np.concatenate([a, b], axis=2), np.float32, dims=(p, q, k))


def test_concat_matches_other_dims_by_name(rng):
    i, j, n, k = lt.symbols("i j n k")
    a, b = rand(rng, (3, 5)), rand(rng, (5, 2))   # b is laid out (n, j)
    t = lt.concat([lt.Tensor(a).to(i, n), lt.Tensor(b).to(n, j)], [i, j], k)
    check(t, np.concatenate([a, b.T], axis=0), np.float32, dims=(k, n))


def test_concat_matches_several_other_dims_by_name_in_any_order(rng):
    """Found by the random-program fuzz (tests/frontend/test_random_programs.py): with two other
    dims in another order concat refused ("has other dimensions ('d2', 'd1') than ... ('d1', 'd2')")."""
    p, q, i, j, k = lt.symbols("p q i j k")
    a, b = rand(rng, (2, 3, 4)), rand(rng, (3, 5, 2))   # b is laid out (q, j, p)
    t = lt.concat([lt.Tensor(a).to(p, q, i), lt.Tensor(b).to(q, j, p)], [i, j], k)
    check(t, np.concatenate([a, b.transpose(2, 0, 1)], axis=2), np.float32, dims=(p, q, k))


def test_concat_of_expressions_then_reduce(rng):
    i, j, n, k = lt.symbols("i j n k")
    a, b = rand(rng, (3, 6)), rand(rng, (2, 6))
    A, B = lt.Tensor(a).to(i, n), lt.Tensor(b).to(j, n)
    t = lt.concat([A.exp(), B * 2.0 + 1.0], [i, j], k).sum(k)
    ref = np.concatenate([np.exp(f64(a)), f64(b) * 2.0 + 1.0], axis=0).sum(0)
    check(t, ref, np.float32, dims=(n,))
