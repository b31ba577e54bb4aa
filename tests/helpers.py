"""Shared helpers for the looptool test-suite: comparison, reference
implementations (NumPy, float64) and error-message matching."""

import re

import numpy as np

TINY = np.finfo(np.float64).tiny

RTOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}


def rtol_for(dtype):
    """Tolerance for a result of the given dtype (float32: 1e-5, float64: 1e-12)."""
    return RTOL[np.dtype(dtype)]


def assert_close(got, ref, rtol):
    """max|got - ref| / max(max|ref|, tiny) < rtol, with ``ref`` in float64.

    Non-finite entries of the reference (e.g. -inf padding) must be matched
    exactly by ``got``; the relative error is measured on the finite ones.
    """
    got = np.asarray(got)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"shape {got.shape} != reference shape {ref.shape}"
    g = got.astype(np.float64)
    finite = np.isfinite(ref)
    if not finite.all():
        assert np.array_equal(g[~finite], ref[~finite], equal_nan=True), (
            f"non-finite entries differ: got {g[~finite]}, expected {ref[~finite]}")
    assert np.isfinite(g[finite]).all(), "result has non-finite entries where the reference is finite"
    if g.size == 0 or not finite.any():
        return
    scale = max(float(np.max(np.abs(ref[finite]))), TINY)
    err = float(np.max(np.abs(g[finite] - ref[finite]))) / scale
    assert err < rtol, f"relative error {err:.3e} >= {rtol:.1e}"


def check(t, ref, dtype, dims=None):
    """Evaluate lazy tensor ``t`` and check metadata and values against ``ref``.

    ``ref`` is the float64 reference laid out in ``t.dims`` order.
    """
    dtype = np.dtype(dtype)
    ref = np.asarray(ref, dtype=np.float64)
    if dims is not None:
        assert tuple(t.dims) == tuple(dims)
    assert np.dtype(t.dtype) == dtype, f"dtype {t.dtype} != {dtype}"
    assert tuple(t.shape) == ref.shape, f".shape {t.shape} != {ref.shape}"
    got = t.numpy()
    assert isinstance(got, np.ndarray), f".numpy() returned {type(got)}"
    assert got.dtype == dtype, f".numpy() dtype {got.dtype} != {dtype}"
    assert_close(got, ref, rtol_for(dtype))
    return got


def rand(rng, shape, dtype=np.float32, low=-1.0, high=1.0):
    return rng.uniform(low, high, size=shape).astype(dtype)


def randn(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def misaligned(array: np.ndarray) -> np.ndarray:
    """A copy of `array` whose data starts one byte past an element boundary."""
    raw = np.zeros(array.nbytes + 1, np.uint8)
    view = np.frombuffer(raw.data, dtype=array.dtype, count=array.size, offset=1).reshape(array.shape)
    view[...] = array
    assert not view.flags.aligned
    return view


def f64(x):
    return np.asarray(x, dtype=np.float64)


# ---------------------------------------------------------------- messages

def _tok(text):
    return rf"(?<![A-Za-z0-9_]){re.escape(str(text))}(?![A-Za-z0-9_])"


def mentions(*parts):
    """Regex (for pytest.raises(match=...)) requiring every part to appear as
    a whole token (so "k" does not match inside "mask", "30" not in "300")."""
    return "(?s)^" + "".join(f"(?=.*{_tok(p)})" for p in parts)


# --------------------------------------------------------------- references

def norm_pad(p):
    return (p, p) if isinstance(p, int) else tuple(p)


def pad_ref(x, axis, amount, value=0.0):
    before, after = norm_pad(amount)
    widths = [(0, 0)] * x.ndim
    widths[axis] = (before, after)
    return np.pad(f64(x), widths, mode="constant", constant_values=value)


def window_ref(x, axis, size, stride=1, dilation=1, padding=0):
    """Axis ``axis`` replaced by (out, size); element [o, r] reads
    x[o*stride + r*dilation - before], 0 outside."""
    before, after = norm_pad(padding)
    n = x.shape[axis]
    out = (n + before + after - dilation * (size - 1) - 1) // stride + 1
    o = np.arange(out)[:, None]
    r = np.arange(size)[None, :]
    idx = o * stride + r * dilation - before
    xp = np.concatenate([f64(x), np.zeros_like(f64(np.take(x, [0], axis=axis)))], axis=axis)
    idx = np.where((idx >= 0) & (idx < n), idx, n)  # index n reads the appended zero
    return np.take(xp, idx, axis=axis)


def conv2d_nchw_ref(x, w, stride=1, padding=0):
    x = f64(x)
    w = f64(w)
    n, c, h, wd = x.shape
    o, c2, kh, kw = w.shape
    assert c == c2
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh = (h + 2 * padding - kh) // stride + 1
    ow = (wd + 2 * padding - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out


def maxpool2x2_ref(x):
    x = f64(x)
    n, c, h, w = x.shape
    x = x[:, :, : h // 2 * 2, : w // 2 * 2]
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def softmax_ref(x, axis):
    x = f64(x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def row_softmax(x_np):
    """Softmax over the last dim of a 2-D array, exp(x - max) / sum, as a tensor over (m, n), and its
    float64 reference."""
    import looptool as lt
    m, n = lt.symbols("m n")
    x = lt.Tensor(x_np).to(m, n)
    e = (x - x.max(n)).exp()
    return e / e.sum(n), softmax_ref(x_np, 1)


def scaled_layer_norm(rng, rows: int, cols: int):
    """A layer norm of rows x cols values scaled by a vector of cols, and its float64 reference."""
    import looptool as lt
    x, g = rng.standard_normal((rows, cols)).astype(np.float32), rng.standard_normal(cols).astype(np.float32)
    m, n = lt.symbols("m n")
    xt = lt.Tensor(x).to(m, n)
    centred = xt - xt.mean(n)
    y = centred / lt.sqrt((centred * centred).mean(n) + 1e-5) * lt.Tensor(g).to(n)
    x64 = x.astype(np.float64) - x.astype(np.float64).mean(1, keepdims=True)
    return y, x64 / np.sqrt((x64 * x64).mean(1, keepdims=True) + 1e-5) * g


def layernorm_ref(x, gamma, beta, eps=1e-5):
    x = f64(x)
    mu = x.mean(axis=1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * f64(gamma) + f64(beta)


# --------------------------------------------------------------- loop trees

def random_matmul(rng, mm, kk, nn, dtype=np.float32):
    """(a * b).sum(k) over random (mm, kk) and (kk, nn) inputs; returns (tensor, a, b)."""
    import looptool as lt
    m, k, n = lt.symbols("m k n")
    a, b = randn(rng, (mm, kk), dtype), randn(rng, (kk, nn), dtype)
    return (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k), a, b


def _loop_lines(text):
    return [ln for ln in text.splitlines() if re.match(r"\s*for\b", ln)]


def _indent(line):
    return len(line) - len(line.lstrip())


def assert_loop_tree_text(text, sizes):
    """The loop tree text has a nested `for` line of each given size and statements inside loops."""
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


def viewed(array: np.ndarray, buffer) -> np.ndarray:
    """`array` as an `ir.Buffer` lays it out (split-k's parts: [parts, m, k_i]), a view of the same elements."""
    return np.lib.stride_tricks.as_strided(array, buffer.shape, [s * array.itemsize for s in buffer.strides])
