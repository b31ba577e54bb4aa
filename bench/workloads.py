"""The benchmark workloads: how to build each one in looptool, its float64 reference and its NumPy baseline."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

import looptool as lt

Arrays = dict[str, np.ndarray]


@dataclass
class Workload:
    """One benchmark: float32 inputs, the looptool tensor, a float64 reference and a NumPy baseline.

    `build(inputs)` returns the lt.Tensor; `reference(inputs)` the float64 result in the
    same layout as `to_ref(ours)`; `baseline(inputs)` the NumPy computation timed against
    ours.  `flops` (for GFLOP/s) or `bytes` (for GB/s, minimal DRAM traffic) describe the
    work.  `baseline_threads(n)` is the BLAS thread count the baseline gets in the n-thread
    row.  `target` is the ratio the best schedule should reach in the rows for
    `target_threads`. `xla(jax, inputs)` and `torch(torch, inputs)` are the same computation in
    JAX (jitted by bench.peers) and PyTorch, on the inputs as the peer's arrays (None: no such form)."""

    name: str
    title: str
    inputs: Callable[[np.random.Generator], Arrays]
    build: Callable[[Arrays], lt.Tensor]
    reference: Callable[[Arrays], np.ndarray]
    baseline: Callable[[Arrays], object]
    flops: float = 0.0
    bytes: float = 0.0
    threads: tuple[int, ...] = (1, 2)
    baseline_threads: Callable[[int], int] = field(default=lambda n: n)
    target: float | None = None
    target_threads: tuple[int, ...] = (1, 2)
    to_ref: Callable[[np.ndarray], np.ndarray] = field(default=lambda out: out)
    note: str = ""
    xla: Callable | None = None
    torch: Callable | None = None


def _f32(rng, *shape) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def f32_inputs(shapes: dict[str, tuple]) -> Callable[[np.random.Generator], Arrays]:
    """Inputs of standard normal float32 values of the given shapes, in order."""
    return lambda rng: {name: _f32(rng, *shape) for name, shape in shapes.items()}


def _f64(inputs: Arrays) -> Arrays:
    return {k: v.astype(np.float64) for k, v in inputs.items()}


# matmul -------------------------------------------------------------------------------
def matmul(m: int, k: int, n: int, target: float, name: str | None = None) -> Workload:
    """C[m, n] = sum_k A[m, k] B[k, n], as (a * b).sum(k); baseline `a @ b` (OpenBLAS)."""
    def build(x):
        s = lt.symbols("m k n")
        return (lt.Tensor(x["a"]).to(s.m, s.k) * lt.Tensor(x["b"]).to(s.k, s.n)).sum(s.k)

    cube = m == k == n
    return Workload(
        name=name or (f"matmul_{m}" if cube else f"matmul_{m}x{k}x{n}"),
        title=f"matmul {m}³" if cube else f"matmul {m}×{k}×{n}",
        inputs=lambda rng: {"a": _f32(rng, m, k), "b": _f32(rng, k, n)},
        build=build,
        reference=lambda x: x["a"].astype(np.float64) @ x["b"].astype(np.float64),
        baseline=lambda x: x["a"] @ x["b"],
        flops=2.0 * m * k * n, target=target,
        xla=lambda jax, v: v["a"] @ v["b"], torch=lambda torch, v: v["a"] @ v["b"])


# row softmax / layer norm ---------------------------------------------------------------
def _softmax_np(x):
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def softmax(rows: int = 4096, cols: int = 1024) -> Workload:
    """Row softmax exp(x - max) / sum(exp(x - max)) over n."""
    def build(x):
        m, n = lt.symbols("m n")
        t = lt.Tensor(x["x"]).to(m, n)
        e = (t - t.max(n)).exp()
        return e / e.sum(n)

    return Workload(
        name="softmax", title=f"softmax {rows}×{cols}",
        inputs=lambda rng: {"x": _f32(rng, rows, cols)},
        build=build,
        reference=lambda x: _softmax_np(x["x"].astype(np.float64)),
        baseline=lambda x: _softmax_np(x["x"]),
        bytes=2.0 * rows * cols * 4, baseline_threads=lambda n: 1, target=2.0, target_threads=(2,),
        note="NumPy single-threaded",
        xla=lambda jax, v: jax.nn.softmax(v["x"], axis=1), torch=lambda torch, v: torch.softmax(v["x"], 1))


EPS = 1e-5


def _layernorm_np(x, g, b, xp=np):
    """Layer norm over axis 1 with the array module `xp` (NumPy, or jax.numpy for XLA)."""
    mu = x.mean(1, keepdims=True)
    var = x.var(1, keepdims=True)
    return (x - mu) / xp.sqrt(var + EPS) * g + b


def layernorm(rows: int = 4096, cols: int = 1024) -> Workload:
    """Row layer norm (x - mean) / sqrt(var + 1e-5) * gamma + beta over n."""
    def build(x):
        m, n = lt.symbols("m n")
        t = lt.Tensor(x["x"]).to(m, n)
        d = t - t.mean(n)
        inv = ((d * d).mean(n) + EPS).sqrt().reciprocal()
        return d * inv * lt.Tensor(x["g"]).to(n) + lt.Tensor(x["b"]).to(n)

    return Workload(
        name="layernorm", title=f"layernorm {rows}×{cols}",
        inputs=lambda rng: {"x": _f32(rng, rows, cols), "g": _f32(rng, cols), "b": _f32(rng, cols)},
        build=build,
        reference=lambda x: _layernorm_np(*(_f64(x)[k] for k in ("x", "g", "b"))),
        baseline=lambda x: _layernorm_np(x["x"], x["g"], x["b"]),
        bytes=2.0 * rows * cols * 4, baseline_threads=lambda n: 1, target=2.0, target_threads=(2,),
        note="NumPy single-threaded", xla=lambda jax, v: _layernorm_np(v["x"], v["g"], v["b"], jax.numpy),
        torch=lambda torch, v: torch.nn.functional.layer_norm(v["x"], (cols,), v["g"], v["b"], EPS))


# pointwise --------------------------------------------------------------------------------
def relu_fma(size: int = 1 << 24) -> Workload:
    """relu(a * b + c) on 1-D tensors; baseline np.maximum(a * b + c, 0)."""
    def build(x):
        i, = lt.symbols("i")
        a, b, c = (lt.Tensor(x[k]).to(i) for k in "abc")
        return (a * b + c).relu()

    return Workload(
        name="relu", title="relu(a*b+c) 2^24",
        inputs=lambda rng: {k: _f32(rng, size) for k in "abc"},
        build=build,
        reference=lambda x: np.maximum(x["a"].astype(np.float64) * x["b"] + x["c"], 0),
        baseline=lambda x: np.maximum(x["a"] * x["b"] + x["c"], 0),
        bytes=4.0 * size * 4, baseline_threads=lambda n: 1, target=1.5, target_threads=(2,),
        note="NumPy single-threaded", xla=lambda jax, v: jax.numpy.maximum(v["a"] * v["b"] + v["c"], 0),
        torch=lambda torch, v: torch.relu(v["a"] * v["b"] + v["c"]))


# conv2d ------------------------------------------------------------------------------------
def conv_reference(x, w, stride: int = 1, pad: int = 1, depthwise: bool = False):
    """NCHW convolution: sliding windows of the padded input, reshaped to columns, then one matmul
    (depthwise: one filter a channel, w of shape (c, 1, kh, kw), a product summed over the window)."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]   # n, c, oh, ow, kh, kw
    oh, ow = win.shape[2], win.shape[3]
    if depthwise:
        return np.einsum("ncpqij,cij->ncpq", win, w[:, 0])
    cols = win.transpose(0, 1, 4, 5, 2, 3).reshape(n, c * kh * kw, oh * ow)
    return (w.reshape(o, c * kh * kw) @ cols).reshape(n, o, oh, ow)


def conv2d(n: int = 1, c: int = 64, hw: int = 56, o: int = 64, k: int = 3) -> Workload:
    """NCHW conv2d, o filters k×k, padding 1, stride 1, as a windowed product summed over (c, kh, kw)."""
    def build(x):
        sn, sc, h, w, so, oh, ow, kh, kw = lt.symbols("n c h w o oh ow kh kw")
        xt = lt.Tensor(x["x"]).to(sn, sc, h, w)
        xw = xt.window(h, oh, kh, k, padding=1).window(w, ow, kw, k, padding=1)
        return (xw * lt.Tensor(x["w"]).to(so, sc, kh, kw)).sum(sc, kh, kw)      # dims (n, oh, ow, o)

    return Workload(
        name="conv2d", title=f"conv2d {n}×{c}×{hw}² o{o} {k}×{k}",
        inputs=lambda rng: {"x": _f32(rng, n, c, hw, hw), "w": _f32(rng, o, c, k, k)},
        build=build,
        reference=lambda x: conv_reference(x["x"].astype(np.float64), x["w"].astype(np.float64)),
        baseline=lambda x: conv_reference(x["x"], x["w"]),
        flops=2.0 * n * o * hw * hw * c * k * k, baseline_threads=lambda n: 1, target=1.0, target_threads=(2,),
        to_ref=lambda out: out.transpose(0, 3, 1, 2), note="im2col + 1-thread BLAS",
        xla=lambda jax, v: jax.lax.conv_general_dilated(v["x"], v["w"], (1, 1), ((1, 1), (1, 1))),
        torch=lambda torch, v: torch.nn.functional.conv2d(v["x"], v["w"], padding=1))


WORKLOADS: list[Workload] = [
    matmul(1024, 1024, 1024, target=0.8),
    matmul(512, 512, 512, target=0.7),
    matmul(200, 300, 500, target=0.7),
    softmax(),
    layernorm(),
    relu_fma(),
    conv2d(),
    matmul(331, 277, 413, target=0.9),      # odd sizes: issue #27 asks >= 0.9x OpenBLAS
    matmul(997, 1001, 1003, target=0.9),
]


def select(names: str | None, among: list[Workload] | None = None) -> list[Workload]:
    """Workloads of `among` (default WORKLOADS) named in a comma-separated list (a name also selects
    `name_*`, e.g. `matmul`)."""
    among = WORKLOADS if among is None else among
    if not names:
        return list(among)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    chosen = [w for w in among if any(w.name == n or w.name.startswith(n + "_") for n in wanted)]
    unknown = [n for n in wanted if not any(w.name == n or w.name.startswith(n + "_") for w in among)]
    if unknown:
        raise SystemExit(f"unknown workload(s) {unknown}; known: {[w.name for w in among]}")
    return chosen
