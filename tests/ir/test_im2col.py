"""`ir.im2col`: a convolution split into a gather of its windows and a matrix product, checked by
running both programs in the reference interpreter against a float64 convolution."""
import ml_dtypes
import numpy as np
import pytest

import looptool as lt
from looptool import ir
from looptool.runtime.interpreter import interpret
from looptool.schedule import LoopTree
from tests.helpers import assert_close


def conv(rng, x_shape, out_channels, stride=1, padding=1, dtype=np.float32, filters_first=True):
    """A 3x3 convolution of an NCHW input written with `window`, and its float64 reference (n, oh, ow, o)."""
    sn, sc, sh, sw, so, soh, sow, skh, skw = lt.symbols("n c h w o oh ow kh kw")
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal((out_channels, x_shape[1], 3, 3)).astype(dtype)
    windows = lt.Tensor(x).to(sn, sc, sh, sw).window(sh, soh, skh, 3, stride=stride, padding=padding) \
        .window(sw, sow, skw, 3, stride=stride, padding=padding)
    filters = lt.Tensor(w).to(so, sc, skh, skw)
    y = ((windows * filters) if filters_first else (filters * windows)).sum(sc, skh, skw)
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh = (x_shape[2] + 2 * padding - 3) // stride + 1
    ow = (x_shape[3] + 2 * padding - 3) // stride + 1
    ref = np.zeros((x_shape[0], oh, ow, out_channels))
    for kh in range(3):
        for kw in range(3):
            taps = padded[:, :, kh:kh + stride * oh:stride, kw:kw + stride * ow:stride]
            ref += np.einsum("nchw,oc->nhwo", taps, w[:, :, kh, kw].astype(np.float64))
    return y, (ref if filters_first else ref.transpose(3, 0, 1, 2))


def run_parts(y):
    program, arrays = ir.lower(y.node)
    parts = ir.im2col(program)
    assert parts is not None
    gathered = interpret(LoopTree(parts.gather), [arrays[parts.windowed]])
    matrix, other = parts.product.inputs
    product = interpret(LoopTree(parts.product), [gathered.reshape(matrix.shape), arrays[parts.other].reshape(other.shape)])
    return parts, product.reshape(y.shape)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("stride, filters_first", [(1, True), (2, False)])
def test_a_convolution_is_a_gather_then_a_matrix_product(rng, dtype, stride, filters_first):
    y, ref = conv(rng, (2, 5, 9, 11), 7, stride, dtype=dtype, filters_first=filters_first)
    parts, got = run_parts(y)
    k, m = parts.product.inputs[0].shape
    assert (k, m) == (5 * 9, ref.size // 7)
    assert parts.product.inputs[1].shape == (7, k) and parts.product.output.reduce_dims == ("k",)
    assert parts.gather.output.dims == ("c", "kh", "kw", "n", "oh", "ow")
    assert_close(got, ref, 1e-5 if dtype == np.float32 else 1e-2)


def test_programs_that_are_not_a_windowed_product_stay_whole(rng):
    sm, sk, sn, sc = lt.symbols("m k n c")
    a, b = rng.standard_normal((6, 5)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    matmul = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
    assert ir.im2col(ir.lower(matmul.node)[0]) is None              # no windows: already a matrix product
    sh, sw, soh, sow, skh, skw = lt.symbols("h w oh ow kh kw")
    x, w = rng.standard_normal((3, 8, 8)).astype(np.float32), rng.standard_normal((3, 3, 3)).astype(np.float32)
    windows = lt.Tensor(x).to(sc, sh, sw).window(sh, soh, skh, 3).window(sw, sow, skw, 3)
    depthwise = (windows * lt.Tensor(w).to(sc, skh, skw)).sum(skh, skw)
    assert ir.im2col(ir.lower(depthwise.node)[0]) is None           # c kept by both operands: a batch


def test_filters_whose_reduced_dims_are_not_back_to_back_stay_whole(rng):
    sn, sc, sh, sw, so, soh, sow, skh, skw = lt.symbols("n c h w o oh ow kh kw")
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    w = rng.standard_normal((3, 3, 5, 4)).astype(np.float32).transpose(2, 3, 0, 1)      # o, c, kh, kw: c innermost
    windows = lt.Tensor(x).to(sn, sc, sh, sw).window(sh, soh, skh, 3).window(sw, sow, skw, 3)
    y = (windows * lt.Tensor(w).to(so, sc, skh, skw)).sum(sc, skh, skw)
    assert ir.im2col(ir.lower(y.node)[0]) is None
