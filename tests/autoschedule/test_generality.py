"""The same rules schedule every kind of program: each one is scheduled automatically, passes the isl
check and matches NumPy in float64 (relative error < 1e-5 in float32), on this machine's target and
on a made-up one with AVX-512 registers, small caches and four cores (so blocks, packing and threads
are exercised at test sizes)."""
import numpy as np
import pytest

import looptool as lt
from looptool.analysis.target import Target, host
from looptool.autoschedule import auto_tree
from looptool.runtime import lower_on_host
from tests.helpers import assert_close, row_softmax

SMALL_AVX512 = Target("x86_64", 512, 32, True, l1=4096, l2=16384, l3=1 << 20, cores=4)


def f32(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def matmul(rng, transpose_a=False, transpose_b=False):
    a, b = f32(rng, 70, 90), f32(rng, 90, 100)
    s = lt.symbols("m k n")
    ta = lt.Tensor(np.ascontiguousarray(a.T)).to(s.k, s.m) if transpose_a else lt.Tensor(a).to(s.m, s.k)
    tb = lt.Tensor(np.ascontiguousarray(b.T)).to(s.n, s.k) if transpose_b else lt.Tensor(b).to(s.k, s.n)
    return (ta * tb).sum(s.k), a.astype(np.float64) @ b.astype(np.float64)


def batched_matmul(rng):
    a, b = f32(rng, 3, 20, 30), f32(rng, 3, 30, 40)
    s = lt.symbols("b m k n")
    c = (lt.Tensor(a).to(s.b, s.m, s.k) * lt.Tensor(b).to(s.b, s.k, s.n)).sum(s.k)
    return c, np.einsum("bmk,bkn->bmn", a.astype(np.float64), b.astype(np.float64))


def conv_reference(x, w):
    """NCHW x, OIHW w, padding 1, stride 1, result as (n, oh, ow, o)."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, h, wd, o))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nhwo", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    return out


def conv2d_nchw(rng):
    x, w = f32(rng, 2, 8, 12, 12), f32(rng, 16, 8, 3, 3)
    sn, sc, h, wd, so, oh, ow, kh, kw = lt.symbols("n c h w o oh ow kh kw")
    xw = lt.Tensor(x).to(sn, sc, h, wd).window(h, oh, kh, 3, padding=1).window(wd, ow, kw, 3, padding=1)
    out = (xw * lt.Tensor(w).to(so, sc, kh, kw)).sum(sc, kh, kw)
    return out, conv_reference(x.astype(np.float64), w.astype(np.float64))


def conv2d_nhwc(rng):
    x, w = f32(rng, 2, 12, 12, 8), f32(rng, 3, 3, 8, 16)
    sn, sc, h, wd, so, oh, ow, kh, kw = lt.symbols("n c h w o oh ow kh kw")
    xw = lt.Tensor(x).to(sn, h, wd, sc).window(h, oh, kh, 3, padding=1).window(wd, ow, kw, 3, padding=1)
    out = (xw * lt.Tensor(w).to(kh, kw, sc, so)).sum(sc, kh, kw)
    ref = conv_reference(x.transpose(0, 3, 1, 2).astype(np.float64), w.transpose(3, 2, 0, 1).astype(np.float64))
    return out, ref


def row_sum(rng):
    x = f32(rng, 64, 200)
    m, n = lt.symbols("m n")
    return lt.Tensor(x).to(m, n).sum(n), x.astype(np.float64).sum(1)


def column_max(rng):
    x = f32(rng, 64, 200)
    m, n = lt.symbols("m n")
    return lt.Tensor(x).to(m, n).max(m), x.astype(np.float64).max(0)


def max_pool(rng):
    x = f32(rng, 2, 4, 16, 16)
    n, c, h, w, oh, ow, i, j = lt.symbols("n c h w oh ow i j")
    pooled = lt.Tensor(x).to(n, c, h, w).window(h, oh, i, 2, stride=2).window(w, ow, j, 2, stride=2).max(i, j)
    return pooled, x.astype(np.float64).reshape(2, 4, 8, 2, 8, 2).max(axis=(3, 5))


def pointwise_chain(rng):
    a, b, c = f32(rng, 33, 70), f32(rng, 33, 70), f32(rng, 70)
    m, n = lt.symbols("m n")
    out = ((lt.Tensor(a).to(m, n) * lt.Tensor(b).to(m, n) + lt.Tensor(c).to(n)).relu() * 2.0).exp()
    ref = np.exp(np.maximum(a.astype(np.float64) * b + c, 0) * 2.0)
    return out, ref


def softmax(rng):
    return row_softmax(f32(rng, 40, 130))


def layernorm(rng):
    x, g, b = f32(rng, 40, 130), f32(rng, 130), f32(rng, 130)
    m, n = lt.symbols("m n")
    t = lt.Tensor(x).to(m, n)
    d = t - t.mean(n)
    out = d * ((d * d).mean(n) + 1e-5).sqrt().reciprocal() * lt.Tensor(g).to(n) + lt.Tensor(b).to(n)
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5) * g + b
    return out, ref


def conv_bias_relu(rng):
    conv, ref = conv2d_nchw(rng)
    bias = f32(rng, 16)
    so, = [d for d in conv.dims if d.name == "o"]
    return (conv + lt.Tensor(bias).to(so)).relu(), np.maximum(ref + bias, 0)


WORKLOADS = {
    "matmul": matmul,
    "matmul_a_transposed": lambda rng: matmul(rng, transpose_a=True),
    "matmul_b_transposed": lambda rng: matmul(rng, transpose_b=True),
    "batched_matmul": batched_matmul,
    "conv2d_nchw": conv2d_nchw,
    "conv2d_nhwc": conv2d_nhwc,
    "conv_bias_relu": conv_bias_relu,
    "row_sum": row_sum,
    "column_max": column_max,
    "max_pool": max_pool,
    "pointwise_chain": pointwise_chain,
    "softmax": softmax,
    "layernorm": layernorm,
}


@pytest.mark.parametrize("target", [None, SMALL_AVX512], ids=["host", "small_avx512"])
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_workload_is_scheduled_legally_and_matches_numpy(name, target, rng):
    tensor, ref = WORKLOADS[name](rng)
    program, _ = lower_on_host(tensor.node)
    tree = auto_tree(program, target or host())
    assert tree.schedule.steps, tree.explain()
    assert tree.check() == (True, "legal"), tree.explain()
    assert "fell back" not in tree.explain()
    assert_close(tensor.numpy(tree), ref, 1e-5)
