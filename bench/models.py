"""The model workloads of `python -m bench.peers` (issue #27's suite), beyond `bench.workloads.WORKLOADS`:
matmuls of every layout and odd sizes, batched matmul, MLP layers, softmax and log-softmax over inner
and outer dims, layer and RMS norm, reductions, attention heads, convolutions and pooling, GELU and a
transpose. Each is written with named dims as a user would, with a float64 NumPy reference and its XLA
(`jax`) and PyTorch forms. Most come in two sizes: one that fits in L2 and one that does not."""
from __future__ import annotations

import math

import numpy as np

import looptool as lt

from .workloads import WORKLOADS, Workload, conv_reference, f32_inputs, matmul

EPS = 1e-5
GELU_TANH = math.sqrt(2.0 / math.pi)


def _named(array: np.ndarray, dims: str) -> lt.Tensor:
    return lt.Tensor(array).to(*lt.symbols(dims))


def _sym(name: str) -> lt.Symbol:
    return lt.Symbol(name)


def _model(name: str, title: str, shapes: dict, build, reference, xla, torch, **extra) -> Workload:
    """A workload of float32 inputs of `shapes` whose NumPy baseline is its reference on float32."""
    return Workload(name=name, title=title, inputs=f32_inputs(shapes), build=build,
                    reference=lambda x: reference({k: v.astype(np.float64) for k, v in x.items()}),
                    baseline=reference, xla=xla, torch=torch, baseline_threads=lambda n: 1, **extra)


# matmuls ------------------------------------------------------------------------------------
def matmul_layout(size: int, stored: str) -> Workload:
    """A size³ matmul with A stored k-major (`stored="kmajor"`, A is (k, m)) or B stored n-major (B is (n, k))."""
    a_dims, b_dims = ("k m", "k n") if stored == "kmajor" else ("m k", "n k")

    def build(x):
        return (_named(x["a"], a_dims) * _named(x["b"], b_dims)).sum(_sym("k"))

    def operands(v):
        return (v["a"].T if stored == "kmajor" else v["a"]), (v["b"].T if stored == "nmajor" else v["b"])

    def reference(v):
        a, b = operands(v)
        return a @ b
    return _model(f"matmul_{stored}_{size}", f"matmul {size}³, {'A k-major' if stored == 'kmajor' else 'B n-major'}",
                  {"a": (size, size), "b": (size, size)}, build, reference,
                  xla=lambda jax, v: operands(v)[0] @ operands(v)[1],
                  torch=lambda torch, v: operands(v)[0] @ operands(v)[1], flops=2.0 * size ** 3)


def batched_matmul(heads: int, positions: int, width: int) -> Workload:
    """Attention scores of `heads` heads, q·kᵀ: (h, s, d) by (h, t, d) summed over d."""
    def build(x):
        return (_named(x["q"], "h s d") * _named(x["k"], "h t d")).sum(_sym("d"))
    return _model(f"bmm_{heads}x{positions}x{width}", f"batched matmul {heads}×{positions}²×{width} (q·kᵀ)",
                  {"q": (heads, positions, width), "k": (heads, positions, width)}, build,
                  lambda v: np.einsum("hsd,htd->hst", v["q"], v["k"]),
                  xla=lambda jax, v: jax.numpy.einsum("hsd,htd->hst", v["q"], v["k"]),
                  torch=lambda torch, v: v["q"] @ v["k"].transpose(1, 2), flops=2.0 * heads * positions ** 2 * width)


def mlp(rows: int, inner: int, outer: int) -> Workload:
    """One MLP layer relu(x·W + b)."""
    def build(x):
        return ((_named(x["x"], "b i") * _named(x["w"], "i o")).sum(_sym("i")) + _named(x["bias"], "o")).relu()
    return _model(f"mlp_{rows}x{inner}x{outer}", f"MLP relu(x·W+b) {rows}×{inner}→{outer}",
                  {"x": (rows, inner), "w": (inner, outer), "bias": (outer,)}, build,
                  lambda v: np.maximum(v["x"] @ v["w"] + v["bias"], 0),
                  xla=lambda jax, v: jax.numpy.maximum(v["x"] @ v["w"] + v["bias"], 0),
                  torch=lambda torch, v: torch.relu(torch.addmm(v["bias"], v["x"], v["w"])),
                  flops=2.0 * rows * inner * outer)


# rows: softmax, log-softmax, norms --------------------------------------------------------------
def softmax(rows: int, cols: int, axis: int, log: bool = False) -> Workload:
    """softmax (or log-softmax) of a (rows, cols) matrix over its inner (axis 1) or outer (axis 0) dim."""
    over = _sym("n" if axis == 1 else "m")

    def build(x):
        t = _named(x["x"], "m n")
        shifted = t - t.max(over)
        e = shifted.exp()
        return shifted - e.sum(over).log() if log else e / e.sum(over)

    def reference(v):
        shifted = v["x"] - v["x"].max(axis, keepdims=True)
        total = np.exp(shifted).sum(axis, keepdims=True)
        return shifted - np.log(total) if log else np.exp(shifted) / total
    kind = "log_softmax" if log else "softmax"
    where = "inner" if axis == 1 else "outer"
    return _model(f"{kind}_{where}_{rows}x{cols}", f"{kind.replace('_', '-')} over the {where} dim {rows}×{cols}",
                  {"x": (rows, cols)}, build, reference,
                  xla=lambda jax, v: (jax.nn.log_softmax if log else jax.nn.softmax)(v["x"], axis=axis),
                  torch=lambda torch, v: (torch.log_softmax if log else torch.softmax)(v["x"], axis),
                  bytes=2.0 * rows * cols * 4)


def layernorm(rows: int, cols: int) -> Workload:
    """Row layer norm (x - mean) / sqrt(var + 1e-5) * gamma + beta."""
    def build(x):
        n = _sym("n")
        t = _named(x["x"], "m n")
        d = t - t.mean(n)
        return d * ((d * d).mean(n) + EPS).sqrt().reciprocal() * _named(x["g"], "n") + _named(x["b"], "n")

    def reference(v, xp=np):
        d = v["x"] - v["x"].mean(1, keepdims=True)
        return d / xp.sqrt((d * d).mean(1, keepdims=True) + EPS) * v["g"] + v["b"]
    return _model(f"layernorm_{rows}x{cols}", f"layer norm {rows}×{cols}", {"x": (rows, cols), "g": (cols,), "b": (cols,)},
                  build, reference, xla=lambda jax, v: reference(v, jax.numpy),
                  torch=lambda torch, v: torch.nn.functional.layer_norm(v["x"], (cols,), v["g"], v["b"], EPS),
                  bytes=2.0 * rows * cols * 4)


def rmsnorm(rows: int, cols: int) -> Workload:
    """Row RMS norm x / sqrt(mean(x²) + 1e-5) * gamma."""
    def build(x):
        t = _named(x["x"], "m n")
        return t * ((t * t).mean(_sym("n")) + EPS).sqrt().reciprocal() * _named(x["g"], "n")

    def reference(v, xp=np):
        return v["x"] / xp.sqrt((v["x"] * v["x"]).mean(1, keepdims=True) + EPS) * v["g"]

    def torch_rms(torch, v):
        return v["x"] * torch.rsqrt((v["x"] * v["x"]).mean(1, keepdim=True) + EPS) * v["g"]
    return _model(f"rmsnorm_{rows}x{cols}", f"RMS norm {rows}×{cols}", {"x": (rows, cols), "g": (cols,)}, build,
                  reference, xla=lambda jax, v: reference(v, jax.numpy), torch=torch_rms, bytes=2.0 * rows * cols * 4)


# reductions ------------------------------------------------------------------------------------
def reduction(op: str, shape: tuple, dims: str, over: str) -> Workload:
    """`op` (sum, max, mean) of an array with dims `dims` over the dims named in `over`."""
    names = dims.split()
    axes = tuple(names.index(d) for d in over.split())

    def build(x):
        return getattr(_named(x["x"], dims), op)(*(_sym(d) for d in over.split()))
    where = {(0,): "outer", (len(names) - 1,): "inner"}.get(axes, "dims " + ",".join(over.split()))
    size = "x".join(map(str, shape))
    return _model(f"reduce_{op}_{where.replace(' ', '_').replace(',', '')}_{size}",
                  f"{op} over the {where} of {'×'.join(map(str, shape))}", {"x": shape}, build,
                  lambda v: getattr(v["x"], op)(axis=axes),
                  xla=lambda jax, v: getattr(jax.numpy, op)(v["x"], axis=axes),
                  torch=lambda torch, v: torch_reduce(torch, op, v["x"], axes), bytes=4.0 * math.prod(shape))


def torch_reduce(torch, op: str, x, axes: tuple):
    """PyTorch's sum, max or mean over `axes` (its max takes one dim at a time: amax takes several)."""
    return {"sum": torch.sum, "mean": torch.mean, "max": torch.amax}[op](x, dim=axes)


# attention -------------------------------------------------------------------------------------
def attention(heads: int, positions: int, width: int) -> Workload:
    """softmax(q·kᵀ/sqrt(width))·v over `heads` heads (1: one head, no head dim)."""
    head = "h " if heads > 1 else ""
    scale = 1.0 / math.sqrt(width)

    def build(x):
        j = _sym("j")
        scores = (_named(x["q"], head + "i d") * _named(x["k"], head + "j d")).sum(_sym("d")) * scale
        e = (scores - scores.max(j)).exp()
        return ((e / e.sum(j)) * _named(x["v"], head + "j e")).sum(j)

    def reference(v):
        s = np.einsum("...id,...jd->...ij", v["q"], v["k"]) * scale
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v["v"]

    def torch_attention(torch, v):
        return torch.softmax(v["q"] @ v["k"].transpose(-1, -2) * scale, -1) @ v["v"]
    shape = ((heads,) if heads > 1 else ()) + (positions, width)
    return _model(f"attention_{heads}x{positions}x{width}",
                  f"attention softmax(q·kᵀ/{math.sqrt(width):g})·v, {heads} head{'s' if heads > 1 else ''}, "
                  f"{positions}×{width}", {"q": shape, "k": shape, "v": shape}, build, reference,
                  xla=lambda jax, v: jax.nn.softmax(jax.numpy.einsum("...id,...jd->...ij", v["q"], v["k"]) * scale,
                                                    axis=-1) @ v["v"],
                  torch=torch_attention, flops=4.0 * heads * positions ** 2 * width)


# convolutions and pooling --------------------------------------------------------------------------
def conv(channels: int, size: int, filters: int, kernel: int, stride: int = 1, depthwise: bool = False) -> Workload:
    """NCHW convolution, `kernel`² with padding kernel//2 and `stride`: full (filters × channels) or
    depthwise (one filter a channel). Our output is (n, oh, ow, o) (depthwise: (n, c, oh, ow))."""
    pad = kernel // 2
    w_shape = (channels, 1, kernel, kernel) if depthwise else (filters, channels, kernel, kernel)

    def build(x):
        n, c, h, w, oh, ow, kh, kw = lt.symbols("n c h w oh ow kh kw")
        xw = lt.Tensor(x["x"]).to(n, c, h, w).window(h, oh, kh, kernel, stride=stride, padding=pad) \
            .window(w, ow, kw, kernel, stride=stride, padding=pad)
        if depthwise:
            return (xw * lt.Tensor(x["w"][:, 0]).to(c, kh, kw)).sum(kh, kw)
        return (xw * _named(x["w"], "o c kh kw")).sum(c, kh, kw)

    def peer_args(v):
        return dict(window_strides=(stride, stride), padding=((pad, pad), (pad, pad)),
                    feature_group_count=channels if depthwise else 1)
    kind = "depthwise" if depthwise else f"conv{kernel}x{kernel}"
    out = (size + 2 * pad - kernel) // stride + 1
    return _model(f"{kind}{'_s' + str(stride) if stride > 1 else ''}_{channels}to{filters}_{size}",
                  f"{'depthwise ' if depthwise else ''}conv {kernel}×{kernel}{f' stride {stride}' if stride > 1 else ''}, "
                  f"{channels}→{filters} channels, {size}²", {"x": (1, channels, size, size), "w": w_shape}, build,
                  lambda v: conv_reference(v["x"], v["w"], stride, pad, depthwise),
                  xla=lambda jax, v: jax.lax.conv_general_dilated(v["x"], v["w"], **peer_args(v)),
                  torch=lambda torch, v: torch.nn.functional.conv2d(v["x"], v["w"], stride=stride, padding=pad,
                                                                    groups=channels if depthwise else 1),
                  flops=2.0 * filters * out * out * kernel * kernel * (1 if depthwise else channels),
                  to_ref=(lambda o: o) if depthwise else (lambda o: o.transpose(0, 3, 1, 2)))


def max_pool(channels: int, size: int) -> Workload:
    """2×2 max pooling, stride 2, of an NCHW image."""
    def build(x):
        n, c, h, w, oh, ow, kh, kw = lt.symbols("n c h w oh ow kh kw")
        xw = lt.Tensor(x["x"]).to(n, c, h, w).window(h, oh, kh, 2, stride=2).window(w, ow, kw, 2, stride=2)
        return xw.max(kh, kw)

    def reference(v):
        x = v["x"]
        return x.reshape(x.shape[0], channels, size // 2, 2, size // 2, 2).max(axis=(3, 5))
    return _model(f"maxpool_{channels}x{size}", f"max pool 2×2 stride 2, {channels} channels, {size}²",
                  {"x": (1, channels, size, size)}, build, reference,
                  xla=lambda jax, v: jax.lax.reduce_window(v["x"], -np.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2),
                                                           "VALID"),
                  torch=lambda torch, v: torch.nn.functional.max_pool2d(v["x"], 2),
                  bytes=1.25 * channels * size * size * 4)


# pointwise ---------------------------------------------------------------------------------------
def gelu(rows: int, cols: int, approximate: bool) -> Workload:
    """GELU, with tanh (approximate) or erf: 0.5x(1 + tanh(√(2/π)(x + 0.044715x³))) or 0.5x(1 + erf(x/√2))."""
    def build(x):
        t = _named(x["x"], "m n")
        inner = ((t + t * t * t * 0.044715) * GELU_TANH).tanh() if approximate else (t * math.sqrt(0.5)).erf()
        return t * 0.5 * (inner + 1.0)

    def reference(v):
        x = v["x"]
        inner = np.tanh(GELU_TANH * (x + 0.044715 * x ** 3)) if approximate else \
            np.vectorize(math.erf, otypes=[x.dtype])(x * math.sqrt(0.5))
        return 0.5 * x * (1.0 + inner)
    kind = "tanh" if approximate else "erf"
    return _model(f"gelu_{kind}_{rows}x{cols}", f"GELU ({kind}) {rows}×{cols}", {"x": (rows, cols)}, build, reference,
                  xla=lambda jax, v: jax.nn.gelu(v["x"], approximate=approximate),
                  torch=lambda torch, v: torch.nn.functional.gelu(v["x"], approximate="tanh" if approximate else "none"),
                  bytes=2.0 * rows * cols * 4)


def transpose(rows: int, cols: int) -> Workload:
    """y[n, m] = x[m, n], written as renamed dims: a zero vector over n, plus x, has dims (n, m). The
    zeros are made from x (`x[0] * 0`), so they live where x does (on the GPU in `bench.gpu_suite`)."""
    def build(x):
        return _named(x["x"][0] * 0, "n") + _named(x["x"], "m n")
    return _model(f"transpose_{rows}x{cols}", f"transpose {rows}×{cols}", {"x": (rows, cols)}, build,
                  lambda v: np.ascontiguousarray(v["x"].T),
                  xla=lambda jax, v: jax.numpy.transpose(v["x"]),
                  torch=lambda torch, v: v["x"].t().contiguous(), bytes=2.0 * rows * cols * 4)


SUITE: list[Workload] = WORKLOADS + [
    matmul(64, 64, 64, target=None),
    matmul_layout(512, "kmajor"), matmul_layout(512, "nmajor"),
    batched_matmul(8, 256, 64), batched_matmul(8, 512, 64),
    mlp(128, 512, 512), mlp(512, 1024, 1024),
    softmax(128, 1024, 1), softmax(128, 1024, 0), softmax(4096, 1024, 0),
    softmax(128, 1024, 1, log=True), softmax(4096, 1024, 1, log=True), softmax(4096, 1024, 0, log=True),
    layernorm(128, 1024), rmsnorm(128, 1024), rmsnorm(4096, 1024),
    reduction("sum", (4096, 1024), "m n", "n"), reduction("sum", (4096, 1024), "m n", "m"),
    reduction("sum", (256, 1024), "m n", "m"), reduction("max", (4096, 1024), "m n", "n"),
    reduction("max", (4096, 1024), "m n", "m"), reduction("mean", (16, 1024, 256), "b m n", "b n"),
    attention(1, 512, 64), attention(8, 256, 64),
    conv(32, 28, 64, 3), conv(64, 28, 128, 1), conv(64, 56, 128, 3, stride=2), conv(64, 56, 64, 3, depthwise=True),
    max_pool(64, 56),
    gelu(256, 1024, True), gelu(4096, 1024, True), gelu(256, 1024, False), gelu(4096, 1024, False),
    transpose(512, 512), transpose(4096, 1024),
]
