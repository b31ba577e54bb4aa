"""The NumPy interpreter (`lt.interpret`), the brute-force oracle of the legality tests: it
compiles nothing, agrees with NumPy and with compiled kernels, and runs scheduled trees."""

import numpy as np
import pytest

import looptool as lt
from tests.helpers import (assert_close, conv2d_nchw_ref, f64, maxpool2x2_ref, pad_ref, rand, randn, rtol_for,
                           softmax_ref, window_ref)
from tests.schedule_helpers import (conv2d, matmul, matmul_bias_relu, matmul_chain, pointwise, rowsum_exp, scheduled,
                                    softmax, steps_text)


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


# ------------------------------------------------------------------ the NumPy interpreter runs scheduled trees

INTERPRETED = {
    "split with tail": (lambda rng: pointwise(rng, m=2, n=3), [("split", "n", 2)]),
    "reduction split with tail": (lambda rng: matmul(rng, 3, 9, 4), [("split", "k", 4)]),
    "nested splits": (lambda rng: rowsum_exp(rng, m=3, n=37), [("split", "n", 5), ("split", "n.1", 2)]),
    "tiled matmul": (lambda rng: matmul(rng, 7, 6, 9), [
        ("split", "m", 4), ("split", "n", 4), ("reorder", "m.0", "n.0", "m.1", "n.1")]),
    "placed softmax": (lambda rng: softmax(rng, 5, 7), [("place", "t0", "t2", 1), ("place", "t1", "t2", 1)]),
    "tile placed in split loops": (lambda rng: matmul_bias_relu(rng, 8, 5, 8), [
        ("split", "m", 4), ("split", "n", 4), ("reorder", "m.0", "n.0", "m.1", "n.1"), ("place", "t0", "t1", 2)]),
    "row of a chain placed in a split loop": (lambda rng: matmul_chain(rng, 3, 5, 4, 7), [
        ("split", "n", 2), ("place", "t0", "t1", 2)]),
    "conv2d": (lambda rng: conv2d(rng, 1, 2, 7, 6, 3), [("split", "ow", 2), ("reorder", "c", "oh")]),
}


@pytest.mark.parametrize("name", list(INTERPRETED))
def test_interpreter_runs_scheduled_trees(rng, name):
    """lt.interpret is the brute-force oracle of the legality tests: it must run every
    legal tree (tails, split tile offsets, placed stages) and agree with NumPy."""
    case, t, steps, tree = scheduled(INTERPRETED, name, rng)
    assert tree.check()[0]
    case.check(lt.interpret(t, tree), f"interpreted {steps_text(steps)}\n{tree}")
