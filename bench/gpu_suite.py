"""The untuned GPU suite, through the public API: `python -m bench.gpu_suite --out DIR` on the GPU machine.

Each row is a workload written with named dims on PyTorch CUDA inputs (`lt.Tensor(torch_tensor)`),
run as a new user would: `c.cuda()` with no schedule and no tuning database. Per row:
- the first call's seconds (scheduling, legality check, code generation, module load);
- the error of the kernels on a NaN-poisoned output against a float64 reference computed by torch;
- the median time of `c.cuda()` calls (CUDA events around each call, so the call's host work counts
  where it outlasts the kernels), of the compiled kernels alone (launched by a prepared call, into
  one output), and of the torch baseline (the same result dtype: half-precision products summed in
  float32 against `torch.mm(..., out_dtype=torch.float32)`; before session 29 against torch writing
  half precision, half our bytes), timed in
  turn in the same process, reported as ratios (torch / looptool: above 1 is faster than torch);
- for memory-bound rows, the fraction of copy bandwidth (bytes moved over a device-to-device copy
  of the same bytes).
It also measures the host cost of a `.cuda()` call (perf_counter over many calls of a small
workload, no synchronization). Prints a table; writes `gpu_suite.json` and `gpu_suite.md` to DIR.
`--shapes other` runs 13 shapes no rule was tuned on instead (for re-measuring the rules), `--shapes even`
the suite without its odd sizes, `--shapes sweep` 29 skewed, odd and off-tile shapes of every family (for
finding outliers), `--shapes transformer` 29 shapes of GPT-2 and LLaMA layers no rule was tuned on,
`--shapes probe` and `--shapes probe2` shapes and program forms picked before any run on them (sessions 33
and 34: the independent re-measurement's kind of test), `--shapes few_rows` products of 1-63 rows in float32 and
bfloat16, `--shapes audit` plans `bench.gpu_plan_audit` flagged, `--shapes models` the CPU suite's workloads (`bench.models`) at its sizes.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

import looptool as lt
from looptool.runtime import gpu as runtime_gpu
from bench.gpu import kernel_times, median_ms
from bench.report import geometric_mean, write_results


def interleaved_ms(fns: dict, rounds: int = 3) -> dict:
    """Each fn's best median over `rounds` rounds taken in turn (drift on the card hits all alike)."""
    best = {name: math.inf for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], median_ms(fn))
    return best


def workloads(torch, shapes: str = "suite"):
    """(name, builder) pairs of the `shapes` set ('suite', its 'even' rows, or 'other'); a builder returns (looptool tensor, torch baseline fn, float64 reference fn,
    bytes moved or None)."""
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, device=dev, generator=gen, dtype=torch.float32).to(dtype)

    def named(t, names):
        return lt.Tensor(t).to(*lt.symbols(names))

    def same_result(product, a, b, rounded):
        """torch's `product` of a and b with our result's dtype: half-precision inputs give a float32 sum
        (written float32: `out_dtype`) unless the row casts it back (`rounded`)."""
        if a.dtype == torch.float32 or rounded:
            return lambda: product(a, b)
        return lambda: product(a, b, out_dtype=torch.float32)

    def matmul(m, k, n, dtype, rounded=False):              # rounded: the result cast to bfloat16, as torch's
        def build():
            a, b = rand(m, k, dtype=dtype), rand(k, n, dtype=dtype)
            sm, sk, sn = lt.symbols("m k n")
            c = (named(a, "m k") * named(b, "k n")).sum(sk)
            return (c.astype(lt.bfloat16) if rounded else c), same_result(torch.mm, a, b, rounded), \
                lambda: a.double() @ b.double(), None
        return build

    def batched(bsz, m, k, n, dtype, rounded=False):
        def build():
            a, b = rand(bsz, m, k, dtype=dtype), rand(bsz, k, n, dtype=dtype)
            c = (named(a, "b m k") * named(b, "b k n")).sum(lt.symbols("k")[0])
            return (c.astype(lt.bfloat16) if rounded else c), same_result(torch.bmm, a, b, rounded), \
                lambda: torch.bmm(a.double(), b.double()), None
        return build

    def transposed_a(m, k, n, dtype):
        """A stored k-major (its transpose in memory), as `a.T @ b` in torch."""
        def build():
            at, b = rand(k, m, dtype=dtype), rand(k, n, dtype=dtype)
            c = (named(at, "k m") * named(b, "k n")).sum(lt.symbols("k")[0])
            return c, same_result(lambda x, y, **kw: torch.mm(x.T, y, **kw), at, b, False), \
                lambda: at.double().T @ b.double(), None
        return build

    def linear(m, k, n, dtype):
        """B stored n-major (a weight of shape (n, k), as torch's `linear`): `x @ w.T`."""
        def build():
            x, w = rand(m, k, dtype=dtype), rand(n, k, dtype=dtype)
            c = (named(x, "m k") * named(w, "n k")).sum(lt.symbols("k")[0])
            return c, same_result(lambda a, b, **kw: torch.mm(a, b.T, **kw), x, w, False), \
                lambda: x.double() @ w.double().T, None
        return build

    def matmul_rounded(m, k, n):
        return matmul(m, k, n, torch.bfloat16, rounded=True)

    def softmax(rows, cols, dtype):
        def build():
            x = rand(rows, cols, dtype=dtype)
            xt = named(x, "m n")
            n = lt.symbols("n")[0]
            e = (xt - xt.max(n)).exp()
            s = e / e.sum(n)
            return s, lambda: torch.softmax(x, dim=1), lambda: torch.softmax(x.double(), dim=1), 2 * x.numel() * 4
        return build

    def column_softmax(rows, cols):
        """softmax over the outer dim of a (rows, cols) matrix: torch.softmax(x, dim=0)."""
        def build():
            x = rand(rows, cols)
            xt = named(x, "m n")
            m = lt.symbols("m")[0]
            e = (xt - xt.max(m)).exp()
            return e / e.sum(m), lambda: torch.softmax(x, dim=0), lambda: torch.softmax(x.double(), dim=0), 2 * x.numel() * 4
        return build

    def layer_norm(rows, cols):
        def build():
            x, g, bias = rand(rows, cols), rand(cols), rand(cols)
            xt, gt, bt = named(x, "m n"), named(g, "n"), named(bias, "n")
            n = lt.symbols("n")[0]
            mean = xt.mean(n)
            centred = xt - mean
            var = (centred * centred).mean(n)
            y = centred / lt.sqrt(var + 1e-5) * gt + bt
            ln = torch.nn.functional.layer_norm
            return (y, lambda: ln(x, (cols,), g, bias, 1e-5),
                    lambda: ln(x.double(), (cols,), g.double(), bias.double(), 1e-5), 2 * x.numel() * 4)
        return build

    def axis_sum(rows, cols, axis):            # axis 1: the sum of each row, 0: of each column
        def build():
            x = rand(rows, cols)
            return (named(x, "m n").sum(lt.symbols("m n")[axis]), lambda: x.sum(axis),
                    lambda: x.double().sum(axis), x.numel() * 4)
        return build

    def row_max(rows, cols):
        def build():
            x = rand(rows, cols)
            return (named(x, "m n").max(lt.symbols("n")[0]), lambda: x.amax(1), lambda: x.double().amax(1),
                    x.numel() * 4)
        return build

    def middle_sum(outer, middle, inner):
        def build():
            x = rand(outer, middle, inner)
            return (named(x, "a m b").sum(lt.symbols("m")[0]), lambda: x.sum(1), lambda: x.double().sum(1),
                    x.numel() * 4)
        return build

    def pooled(shape, axes):
        """The mean of an NCHW array over `axes` (2, 3: a global pool; 0, 2, 3: a batch norm's statistics)."""
        def build():
            x = rand(*shape)
            names = "b c h w".split()
            return (named(x, "b c h w").mean(*lt.symbols(" ".join(names[a] for a in axes))), lambda: x.mean(axes),
                    lambda: x.double().mean(axes), x.numel() * 4)
        return build

    def instance_norm(shape):
        """An NCHW array normalized over (h, w), as torch's instance_norm (no affine)."""
        def build():
            x = rand(*shape)
            xt = named(x, "b c h w")
            h, w = lt.symbols("h w")
            centred = xt - xt.mean(h, w)
            y = centred / lt.sqrt((centred * centred).mean(h, w) + 1e-5)
            norm = torch.nn.functional.instance_norm
            return y, lambda: norm(x, eps=1e-5), lambda: norm(x.double(), eps=1e-5), 2 * x.numel() * 4
        return build

    def bias_relu(rows, cols):
        def build():
            x, bias = rand(rows, cols), rand(cols)
            y = lt.relu(named(x, "m n") + named(bias, "n"))
            return (y, lambda: torch.relu(x + bias), lambda: torch.relu(x.double() + bias.double()),
                    2 * x.numel() * 4)
        return build

    def dot(n):
        def build():
            x, y = rand(n), rand(n)
            c = lt.symbols("c")[0]
            return ((named(x, "c") * named(y, "c")).sum(c), lambda: torch.dot(x, y),
                    lambda: torch.dot(x.double(), y.double()), 2 * n * 4)
        return build

    def gelu(rows, cols):
        def build():
            x = rand(rows, cols)
            xt = named(x, "m n")
            inner = (xt + xt * xt * xt * 0.044715) * 0.7978845608028654
            # tanh(u) = 1 - 2 / (exp(2u) + 1)
            y = xt * 0.5 * (2.0 - 2.0 / ((inner * 2.0).minimum(40.0).exp() + 1.0))
            gelu_t = torch.nn.functional.gelu
            return (y, lambda: gelu_t(x, approximate="tanh"), lambda: gelu_t(x.double(), approximate="tanh"),
                    2 * x.numel() * 4)
        return build

    def mlp(m, k, n):
        def build():
            x, w, bias = rand(m, k, dtype=torch.bfloat16), rand(k, n, dtype=torch.bfloat16), rand(n)
            sk = lt.symbols("k")[0]
            y = lt.relu((named(x, "m k") * named(w, "k n")).sum(sk) + named(bias, "n"))
            return (y, lambda: torch.relu(x @ w + bias), lambda: torch.relu(x.double() @ w.double() + bias.double()),
                    None)
        return build

    def conv(batch, channels, size, dtype):
        def build():
            x = rand(batch, channels, size, size, dtype=dtype)
            w = rand(channels, channels, 3, 3, dtype=dtype)
            sh, soh, skh, sw, sow, skw = lt.symbols("h oh kh w ow kw")
            windows = named(x, "n c h w").window(sh, soh, skh, 3, padding=1).window(sw, sow, skw, 3, padding=1)
            c = lt.symbols("c")[0]
            y = (windows * named(w, "o c kh kw")).sum(c, skh, skw)          # dims (n, oh, ow, o)
            conv2d = torch.nn.functional.conv2d
            return (y, lambda: conv2d(x, w, padding=1),
                    lambda: conv2d(x.double(), w.double(), padding=1).permute(0, 2, 3, 1), None)
        return build

    def transpose(rows, cols, dtype, batch=None):
        """y[..., n, m] = x[..., m, n], written as renamed dims (a zero row over n, plus x)."""
        def build():
            shape = (batch, rows, cols) if batch else (rows, cols)
            x, zero = rand(*shape, dtype=dtype), torch.zeros(*shape[:-2], cols, device=dev, dtype=dtype)
            y = named(zero, "b n" if batch else "n") + named(x, "b m n" if batch else "m n")
            return (y, lambda: x.transpose(-1, -2).contiguous(), lambda: x.double().transpose(-1, -2),
                    2 * x.numel() * x.element_size())
        return build

    def attention(length, width):
        def build():
            q, k, v = rand(length, width), rand(length, width), rand(length, width)
            si, sj, sd = lt.symbols("i j d")
            scores = (named(q, "i d") * named(k, "j d")).sum(sd) * (1.0 / math.sqrt(width))
            e = (scores - scores.max(sj)).exp()
            p = e / e.sum(sj)
            out = (p * named(v, "j d")).sum(sj)

            def eager(q=q, k=k, v=v):
                return torch.softmax(q @ k.T / math.sqrt(width), dim=1) @ v
            return out, eager, lambda: eager(q.double(), k.double(), v.double()), None
        return build

    bf16 = torch.bfloat16
    rows = [
        ("matmul f32 4096^3", matmul(4096, 4096, 4096, torch.float32)),
        ("matmul f32 1024^3", matmul(1024, 1024, 1024, torch.float32)),
        ("matmul bf16 4096^3", matmul(4096, 4096, 4096, bf16)),
        ("batched matmul bf16 16x1024x64x1024", batched(16, 1024, 64, 1024, bf16)),
        ("matmul bf16 4096^3, bf16 result", matmul_rounded(4096, 4096, 4096)),
        ("batched matmul bf16 16x1024x64x1024, bf16 result", batched(16, 1024, 64, 1024, bf16, rounded=True)),
        ("softmax f32 8192x8192", softmax(8192, 8192, torch.float32)),
        ("layer norm f32 8192x8192", layer_norm(8192, 8192)),
        ("row sum f32 8192x8192", axis_sum(8192, 8192, 1)),
        ("column sum f32 8192x8192", axis_sum(8192, 8192, 0)),
        ("dot f32 2^24", dot(1 << 24)),
        ("gelu(tanh) f32 8192x8192", gelu(8192, 8192)),
        ("mlp relu(xW+b) bf16 4096x4096x4096", mlp(4096, 4096, 4096)),
        ("attention head f32 1024x64", attention(1024, 64)),
        ("conv 3x3 f32 8x64x56x56", conv(8, 64, 56, torch.float32)),
        ("conv 3x3 bf16 8x64x56x56", conv(8, 64, 56, bf16)),
    ]
    odd_rows = [
        ("matmul f32 1000x1500x777", matmul(1000, 1500, 777, torch.float32)),
        ("matmul bf16 1000x1000x1000", matmul(1000, 1000, 1000, bf16)),
        ("softmax f32 1000x3001", softmax(1000, 3001, torch.float32)),
        ("layer norm f32 1000x3001", layer_norm(1000, 3001)),
        ("row sum f32 1000x3001", axis_sum(1000, 3001, 1)),
        ("column sum f32 3001x1000", axis_sum(3001, 1000, 0)),
        ("dot f32 10^7+1", dot(10 ** 7 + 1)),
        ("gelu(tanh) f32 1000x3001", gelu(1000, 3001)),
        ("attention head f32 1000x64", attention(1000, 64)),
        ("conv 3x3 f32 6x40x33x33", conv(6, 40, 33, torch.float32)),
        ("conv 3x3 bf16 6x40x33x33", conv(6, 40, 33, bf16)),
    ]
    other_rows = [       # `--shapes other`: shapes no rule was tuned on, for re-measuring the rules
        ("matmul f32 768x3072x768", matmul(768, 3072, 768, torch.float32)),
        ("matmul bf16 3000x2000x1000", matmul(3000, 2000, 1000, bf16)),
        ("matmul bf16 2048x512x8192", matmul(2048, 512, 8192, bf16)),
        ("matmul bf16 512x8192x1024", matmul(512, 8192, 1024, bf16)),
        ("matmul bf16 512x8192x1024, bf16 result", matmul_rounded(512, 8192, 1024)),
        ("batched matmul bf16 12x512x128x512", batched(12, 512, 128, 512, bf16)),
        ("softmax f32 2048x50257", softmax(2048, 50257, torch.float32)),
        ("layer norm f32 512x768", layer_norm(512, 768)),
        ("row sum f32 100000x77", axis_sum(100000, 77, 1)),
        ("column sum f32 77x100000", axis_sum(77, 100000, 0)),
        ("gelu(tanh) f32 3x1000003", gelu(3, 1000003)),
        ("attention head f32 2048x128", attention(2048, 128)),
        ("attention head f32 4096x64", attention(4096, 64)),
        ("conv 3x3 f32 16x128x28x28", conv(16, 128, 28, torch.float32)),
        ("conv 3x3 bf16 4x96x17x17", conv(4, 96, 17, bf16)),
        ("mlp relu(xW+b) bf16 1000x768x3072", mlp(1000, 768, 3072)),
    ]
    sweep_rows = [       # `--shapes sweep`: skewed, odd and off-tile shapes of every family, for finding outliers
        ("matmul bf16 6000^3", matmul(6000, 6000, 6000, bf16)),
        ("matmul bf16 4096x4000x4096", matmul(4096, 4000, 4096, bf16)),
        ("matmul bf16 3072x2048x1024", matmul(3072, 2048, 1024, bf16)),
        ("matmul bf16 128x4096x8192", matmul(128, 4096, 8192, bf16)),
        ("matmul bf16 100x100x100", matmul(100, 100, 100, bf16)),
        ("matmul f32 333x444x555", matmul(333, 444, 555, torch.float32)),
        ("matmul f32 64x8192x64", matmul(64, 8192, 64, torch.float32)),
        ("matmul f32 1024x4096x1024", matmul(1024, 4096, 1024, torch.float32)),
        ("batched matmul bf16 8x333x64x333", batched(8, 333, 64, 333, bf16)),
        ("mlp relu(xW+b) bf16 4000x1000x3000", mlp(4000, 1000, 3000)),
        ("softmax f32 7x777777", softmax(7, 777777, torch.float32)),
        ("softmax f32 100000x10", softmax(100000, 10, torch.float32)),
        ("softmax f32 100000x31", softmax(100000, 31, torch.float32)),
        ("softmax f32 65536x48", softmax(65536, 48, torch.float32)),
        ("softmax f32 3000x3000", softmax(3000, 3000, torch.float32)),
        ("layer norm f32 333x12345", layer_norm(333, 12345)),
        ("layer norm f32 65536x64", layer_norm(65536, 64)),
        ("layer norm f32 100000x16", layer_norm(100000, 16)),
        ("row sum f32 3x10000000", axis_sum(3, 10000000, 1)),
        ("column sum f32 10000000x3", axis_sum(10000000, 3, 0)),
        ("gelu(tanh) f32 777x7777", gelu(777, 7777)),
        ("conv 3x3 f32 2x3x224x224", conv(2, 3, 224, torch.float32)),
        ("conv 3x3 bf16 32x16x32x32", conv(32, 16, 32, bf16)),
        ("attention head f32 333x64", attention(333, 64)),
        ("attention head f32 2048x32", attention(2048, 32)),
        ("transpose f32 8192x8192", transpose(8192, 8192, torch.float32)),
        ("transpose f32 1000x3001", transpose(1000, 3001, torch.float32)),
        ("transpose bf16 4096x4096", transpose(4096, 4096, bf16)),
        ("transpose f32 16x512x768", transpose(512, 768, torch.float32, batch=16)),
    ]
    transformer_rows = [  # `--shapes transformer`: GPT-2 and LLaMA widths (768, 3072, 4096, 11008), none tuned on
        ("matmul bf16 2048x4096x4096", matmul(2048, 4096, 4096, bf16)),
        ("matmul bf16 2048x4096x11008", matmul(2048, 4096, 11008, bf16)),
        ("matmul bf16 2048x11008x4096", matmul(2048, 11008, 4096, bf16)),
        ("matmul bf16 512x768x3072", matmul(512, 768, 3072, bf16)),
        ("matmul bf16 8192x768x768", matmul(8192, 768, 768, bf16)),
        ("matmul bf16 2048x768x50257", matmul(2048, 768, 50257, bf16)),
        ("matmul bf16 2048^3, bf16 result", matmul_rounded(2048, 2048, 2048)),
        ("matmul f32 2048^3", matmul(2048, 2048, 2048, torch.float32)),
        ("matmul f32 512^3", matmul(512, 512, 512, torch.float32)),
        ("matmul f32 4096x768x768", matmul(4096, 768, 768, torch.float32)),
        ("batched matmul bf16 48x512x64x512", batched(48, 512, 64, 512, bf16)),
        ("batched matmul bf16 32x2048x128x2048, bf16 result", batched(32, 2048, 128, 2048, bf16, rounded=True)),
        ("batched matmul bf16 32x128x2048x128", batched(32, 128, 2048, 128, bf16)),
        ("mlp relu(xW+b) bf16 2048x4096x11008", mlp(2048, 4096, 11008)),
        ("mlp relu(xW+b) bf16 512x768x3072", mlp(512, 768, 3072)),
        ("softmax f32 4096x4096", softmax(4096, 4096, torch.float32)),
        ("softmax f32 32768x512", softmax(32768, 512, torch.float32)),
        ("softmax f32 512x32000", softmax(512, 32000, torch.float32)),
        ("layer norm f32 4096x768", layer_norm(4096, 768)),
        ("layer norm f32 2048x4096", layer_norm(2048, 4096)),
        ("row sum f32 4096x4096", axis_sum(4096, 4096, 1)),
        ("column sum f32 4096x768", axis_sum(4096, 768, 0)),
        ("gelu(tanh) f32 2048x3072", gelu(2048, 3072)),
        ("gelu(tanh) f32 4096x11008", gelu(4096, 11008)),
        ("attention head f32 512x64", attention(512, 64)),
        ("attention head f32 2048x64", attention(2048, 64)),
        ("conv 3x3 bf16 16x128x28x28", conv(16, 128, 28, bf16)),
        ("conv 3x3 f32 32x64x28x28", conv(32, 64, 28, torch.float32)),
        ("transpose f32 4096x1024", transpose(4096, 1024, torch.float32)),
    ]
    probe_rows = [       # `--shapes probe`: session 33's shapes, picked before any run on them, and other program forms
        ("matmul bf16 1536^3", matmul(1536, 1536, 1536, bf16)),
        ("matmul bf16 777x555x333", matmul(777, 555, 333, bf16)),
        ("matmul bf16 2500x100x2500", matmul(2500, 100, 2500, bf16)),
        ("matmul bf16 1024x1024x333", matmul(1024, 1024, 333, bf16)),      # (these two added after the first run:
        ("matmul bf16 3000x777x555", matmul(3000, 777, 555, bf16)),        # B's rows not on 16-byte boundaries)
        ("matmul f32 2000x300x1000", matmul(2000, 300, 1000, torch.float32)),
        ("matmul f32 100x10000x100", matmul(100, 10000, 100, torch.float32)),
        ("matmul f32 3000x3000x64", matmul(3000, 3000, 64, torch.float32)),
        ("matmul f32 k-major A 1024x2048x512", transposed_a(1024, 2048, 512, torch.float32)),
        ("matmul bf16 k-major A 2048x1024x2048", transposed_a(2048, 1024, 2048, bf16)),
        ("batched matmul bf16 4x1000x100x1000", batched(4, 1000, 100, 1000, bf16)),
        ("batched matmul f32 64x64x64x64", batched(64, 64, 64, 64, torch.float32)),
        ("mlp relu(xW+b) bf16 300x1000x500", mlp(300, 1000, 500)),
        ("softmax f32 4096x200", softmax(4096, 200, torch.float32)),
        ("softmax f32 16384x96", softmax(16384, 96, torch.float32)),
        ("softmax f32 50000x40", softmax(50000, 40, torch.float32)),
        ("softmax f32 20000x64", softmax(20000, 64, torch.float32)),
        ("softmax f32 1000x10000", softmax(1000, 10000, torch.float32)),
        ("softmax f32 256x100000", softmax(256, 100000, torch.float32)),
        ("softmax over dim 0 f32 8192x8192", column_softmax(8192, 8192)),    # (these two added at the session's end,
        ("softmax over dim 0 f32 1000x30000", column_softmax(1000, 30000)),  # not yet run)
        ("layer norm f32 10000x96", layer_norm(10000, 96)),
        ("layer norm f32 2000x5000", layer_norm(2000, 5000)),
        ("layer norm f32 50000x40", layer_norm(50000, 40)),
        ("layer norm f32 16384x1000", layer_norm(16384, 1000)),
        ("row sum f32 2000x50", axis_sum(2000, 50, 1)),
        ("row sum f32 50x200000", axis_sum(50, 200000, 1)),
        ("column sum f32 200000x50", axis_sum(200000, 50, 0)),
        ("column sum f32 100x100000", axis_sum(100, 100000, 0)),
        ("middle sum f32 64x1000x64", middle_sum(64, 1000, 64)),
        ("dot f32 3x10^6", dot(3 * 10 ** 6)),
        ("global pool f32 32x256x56x56", pooled((32, 256, 56, 56), (2, 3))),            # (these two added at the
        ("batch norm means f32 32x256x56x56", pooled((32, 256, 56, 56), (0, 2, 3))),   # session's end, not yet run)
        ("instance norm f32 32x64x56x56", instance_norm((32, 64, 56, 56))),             # (likewise)
        ("gelu(tanh) f32 5000x5000", gelu(5000, 5000)),
        ("gelu(tanh) f32 123x4567", gelu(123, 4567)),
        ("bias relu f32 4096x3000", bias_relu(4096, 3000)),
        ("conv 3x3 f32 4x32x64x64", conv(4, 32, 64, torch.float32)),
        ("conv 3x3 bf16 8x32x64x64", conv(8, 32, 64, bf16)),
        ("conv 3x3 bf16 1x64x100x100", conv(1, 64, 100, bf16)),
        ("attention head f32 777x64", attention(777, 64)),
        ("attention head f32 1536x96", attention(1536, 96)),
        ("transpose f32 2000x3000", transpose(2000, 3000, torch.float32)),
        ("transpose bf16 1234x5678", transpose(1234, 5678, bf16)),
    ]
    probe2_rows = [      # `--shapes probe2`: session 34's shapes, picked before any run on them
        ("matmul bf16 linear 4096x2048x1024", linear(4096, 2048, 1024, bf16)),
        ("matmul f32 linear 1000x512x2000", linear(1000, 512, 2000, torch.float32)),
        ("matmul bf16 1234x4321x567", matmul(1234, 4321, 567, bf16)),
        ("matmul bf16 8192x1024x8192", matmul(8192, 1024, 8192, bf16)),
        ("matmul bf16 256x65536x256", matmul(256, 65536, 256, bf16)),
        ("matmul f16 2000^3", matmul(2000, 2000, 2000, torch.float16)),
        ("matmul f32 555x777x999", matmul(555, 777, 999, torch.float32)),
        ("matmul f32 4096x1024x4096", matmul(4096, 1024, 4096, torch.float32)),
        ("matmul f32 32x4096x4096", matmul(32, 4096, 4096, torch.float32)),
        ("batched matmul bf16 32x128x64x128", batched(32, 128, 64, 128, bf16)),
        ("batched matmul f32 10x300x200x100", batched(10, 300, 200, 100, torch.float32)),
        ("mlp relu(xW+b) bf16 1024x3072x768", mlp(1024, 3072, 768)),
        ("softmax f32 1024x1024", softmax(1024, 1024, torch.float32)),
        ("softmax f32 8192x1000", softmax(8192, 1000, torch.float32)),
        ("softmax f32 333x7777", softmax(333, 7777, torch.float32)),
        ("softmax f32 100000x17", softmax(100000, 17, torch.float32)),
        ("softmax f32 64x65536", softmax(64, 65536, torch.float32)),
        ("softmax f32 12x250000", softmax(12, 250000, torch.float32)),
        ("softmax over dim 0 f32 3000x500", column_softmax(3000, 500)),
        ("layer norm f32 4096x1024", layer_norm(4096, 1024)),
        ("layer norm f32 7777x333", layer_norm(7777, 333)),
        ("layer norm f32 128x50000", layer_norm(128, 50000)),
        ("layer norm f32 100000x100", layer_norm(100000, 100)),
        ("row sum f32 10000x10000", axis_sum(10000, 10000, 1)),
        ("row max f32 3000x3000", row_max(3000, 3000)),
        ("column sum f32 5000x300", axis_sum(5000, 300, 0)),
        ("column sum f32 64x500000", axis_sum(64, 500000, 0)),
        ("middle sum f32 16x512x512", middle_sum(16, 512, 512)),
        ("channel sum f32 32x64x3136", middle_sum(32, 64, 3136)),
        ("global pool f32 8x2048x7x7", pooled((8, 2048, 7, 7), (2, 3))),
        ("batch norm means f32 64x64x32x32", pooled((64, 64, 32, 32), (0, 2, 3))),
        ("instance norm f32 8x128x32x32", instance_norm((8, 128, 32, 32))),
        ("gelu(tanh) f32 1000x1000", gelu(1000, 1000)),
        ("bias relu f32 100x100", bias_relu(100, 100)),
        ("bias relu f32 16384x4096", bias_relu(16384, 4096)),
        ("dot f32 1000", dot(1000)),
        ("dot f32 2^26", dot(1 << 26)),
        ("conv 3x3 f32 16x64x32x32", conv(16, 64, 32, torch.float32)),
        ("conv 3x3 bf16 32x64x56x56", conv(32, 64, 56, bf16)),
        ("conv 3x3 f32 1x16x128x128", conv(1, 16, 128, torch.float32)),
        ("conv 3x3 bf16 64x32x16x16", conv(64, 32, 16, bf16)),
        ("attention head f32 512x128", attention(512, 128)),
        ("attention head f32 3000x64", attention(3000, 64)),
        ("transpose f32 3333x4444", transpose(3333, 4444, torch.float32)),
        ("transpose bf16 8x1024x1024", transpose(1024, 1024, bf16, batch=8)),
    ]
    few_rows = [         # `--shapes few_rows`: products of 1-63 rows (a linear layer on a few tokens), session 34's rules
        ("matmul f32 1x4096x4096", matmul(1, 4096, 4096, torch.float32)),
        ("matmul f32 2x4096x4096", matmul(2, 4096, 4096, torch.float32)),
        ("matmul f32 4x4096x4096", matmul(4, 4096, 4096, torch.float32)),
        ("matmul f32 7x4096x4096", matmul(7, 4096, 4096, torch.float32)),
        ("matmul f32 8x4096x11008", matmul(8, 4096, 11008, torch.float32)),
        ("matmul f32 16x11008x4096", matmul(16, 11008, 4096, torch.float32)),
        ("matmul f32 48x1000x3000", matmul(48, 1000, 3000, torch.float32)),
        ("matmul f32 linear 8x4096x4096", linear(8, 4096, 4096, torch.float32)),
        ("matmul bf16 1x4096x4096", matmul(1, 4096, 4096, bf16)),
        ("matmul bf16 1x8192x8192", matmul(1, 8192, 8192, bf16)),
        ("matmul bf16 2x4096x4096", matmul(2, 4096, 4096, bf16)),
        ("matmul bf16 4x4096x4096", matmul(4, 4096, 4096, bf16)),
        ("matmul bf16 7x4096x4096", matmul(7, 4096, 4096, bf16)),
        ("matmul bf16 8x4096x11008", matmul(8, 4096, 11008, bf16)),
        ("matmul bf16 16x4096x4096", matmul(16, 4096, 4096, bf16)),
        ("matmul bf16 32x11008x4096", matmul(32, 11008, 4096, bf16)),
        ("matmul bf16 63x2048x8192", matmul(63, 2048, 8192, bf16)),
        ("matmul bf16 linear 16x4096x4096", linear(16, 4096, 4096, bf16)),
    ]
    audit_rows = [       # `--shapes audit`: plans `bench.gpu_plan_audit` flagged (session 34), some changed after, untimed
        ("matmul bf16 200x4096x200", matmul(200, 4096, 200, bf16)),
        ("matmul bf16 1000x4096x200", matmul(1000, 4096, 200, bf16)),
        ("matmul bf16 1000x1000x200", matmul(1000, 1000, 200, bf16)),
        ("matmul f32 5x4096x4096", matmul(5, 4096, 4096, torch.float32)),
        ("batch norm means f32 128x16x32x32", pooled((128, 16, 32, 32), (0, 2, 3))),
        ("batch norm means f32 64x512x7x7", pooled((64, 512, 7, 7), (0, 2, 3))),
        ("column sum f32 333x100000", axis_sum(333, 100000, 0)),
        ("softmax f32 64x100000", softmax(64, 100000, torch.float32)),
    ]
    if shapes == "models":
        return model_rows(torch)
    return {"suite": rows + odd_rows, "even": rows, "other": other_rows, "sweep": sweep_rows,
            "transformer": transformer_rows, "probe": probe_rows,
            "probe2": probe2_rows, "few_rows": few_rows, "audit": audit_rows}[shapes]


def model_rows(torch) -> list:
    """`--shapes models`: the CPU suite's workloads (`bench.models.SUITE`, issue 27's families at its
    sizes) on the GPU, their float32 inputs as torch CUDA tensors, against their own torch form; those
    whose result is laid out otherwise than their reference (the convolutions: `to_ref`) are left out."""
    from bench import models
    rng = np.random.default_rng(0)
    out = []
    for workload in models.SUITE:
        def build(w=workload):
            arrays = w.inputs(rng)
            tensors = {name: torch.from_numpy(a).cuda() for name, a in arrays.items()}
            return (w.build(tensors), lambda: w.torch(torch, tensors),
                    lambda: torch.from_numpy(np.asarray(w.reference(arrays))), None)
        if workload.torch is not None and _same_layout(workload):
            out.append((workload.name, build))
    return out


def _same_layout(workload) -> bool:
    probe = np.arange(24.0).reshape(1, 2, 3, 4)
    return np.array_equal(workload.to_ref(probe), probe)


def run_row(torch, name: str, build, copy_ms_for, profile: bool = False) -> dict:
    cp = runtime_gpu.cupy()
    row = {"name": name}
    try:
        tensor, baseline, reference, moved = build()
        start = time.perf_counter()
        first = tensor.cuda()
        cp.cuda.Stream.null.synchronize()
        row["first_call_s"] = time.perf_counter() - start
        trees = runtime_gpu.planned_trees(tensor.node)              # what .cuda() runs: tuned, else automatic
        row["kernels"] = sum(len(runtime_gpu.kernel_for(tree).module.launches) for tree in trees)
        row["explain"] = "\n".join(tree.explain() for tree in trees)
        out = runtime_gpu.poisoned_empty(tuple(first.shape), trees[-1].program.output.dtype)
        launch = runtime_gpu.prepared_call(tensor.node)       # the kernels alone: inputs checked once
        got = runtime_gpu.to_host(launch(out)).astype(np.float64)
        ref = reference().double().cpu().numpy()
        diff = np.nan_to_num(got - ref, nan=1e30)
        row["rel_error"] = float(np.linalg.norm(diff) / max(np.linalg.norm(ref), 1e-30))
        # "call": the prepared call making its output, without `.cuda()`'s lookup (where .cuda()'s extra time goes)
        timed = {"looptool": lambda: tensor.cuda(), "call": launch, "kernels": lambda: launch(out), "torch": baseline}
        if moved:
            timed["copy"] = copy_ms_for(moved)
        ms = interleaved_ms(timed)
        row.update({f"{k}_ms": v for k, v in ms.items()})
        row["x_torch"] = ms["torch"] / ms["looptool"]
        row["kernels_x_torch"] = ms["torch"] / ms["kernels"]
        if moved:
            row["copy_fraction"] = ms["copy"] / ms["kernels"]
        if profile:
            row["kernel_us"] = kernel_times(torch, tensor.cuda)
    except Exception as err:      # a row that fails is reported, not the end of the suite
        row["error"] = f"{type(err).__name__}: {err}"[:600]
    return row


def call_cost_us(torch) -> dict:
    """Host microseconds a `.cuda()` call costs (a 64x64 softmax, its kernel far shorter than the call)."""
    x = torch.randn(64, 64, device="cuda")
    xt = lt.Tensor(x).to(*lt.symbols("m n"))
    n = lt.symbols("n")[0]
    e = (xt - xt.max(n)).exp()
    s = e / e.sum(n)
    s.cuda()
    runtime_gpu.cupy().cuda.Stream.null.synchronize()
    calls = 2000
    start = time.perf_counter()
    for _ in range(calls):
        s.cuda()
    host = (time.perf_counter() - start) / calls * 1e6
    runtime_gpu.cupy().cuda.Stream.null.synchronize()
    return {"cuda_call_host_us": host}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", default="", help="run rows whose name contains this")
    parser.add_argument("--skip", default="", help="comma-separated: leave out rows whose name contains any")
    parser.add_argument("--shapes", choices=("suite", "even", "other", "sweep", "transformer", "probe", "probe2",
                                                 "few_rows", "audit", "models"), default="suite",
                        help="the suite's rows, its rows without the odd sizes, or other shapes for re-measuring")
    parser.add_argument("--profile", action="store_true", help="each row's kernels' device times (torch.profiler)")
    args = parser.parse_args(argv)
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    buffers = {}

    def copy_ms_for(moved: int):
        count = moved // 8                      # read count floats and write count floats
        if count not in buffers:
            buffers[count] = (torch.randn(count, device="cuda"), torch.empty(count, device="cuda"))
        src, dst = buffers[count]
        return lambda: dst.copy_(src)

    device = torch.cuda.get_device_name()
    rows = []
    for name, build in workloads(torch, args.shapes):
        if args.only and args.only not in name or any(part and part in name for part in args.skip.split(",")):
            continue
        row = run_row(torch, name, build, copy_ms_for, args.profile)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "explain"}), flush=True)
    summary = {"device": device, "rows": rows, **call_cost_us(torch)}
    ratios = [r["x_torch"] for r in rows if "x_torch" in r]
    summary["geomean_x_torch"] = geometric_mean(ratios) if ratios else None
    table = ["| workload | first call s | kernels | x torch (c.cuda()) | kernels alone x torch | copy bw | rel err |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "error" in r:
            table.append(f"| {r['name']} | error: {r['error'][:120]} | | | | | |")
            continue
        bw = f"{r['copy_fraction']:.2f}" if "copy_fraction" in r else ""
        table.append(f"| {r['name']} | {r['first_call_s']:.2f} | {r['kernels']} | {r['x_torch']:.2f} | "
                     f"{r['kernels_x_torch']:.2f} | {bw} | {r['rel_error']:.1e} |")
    text = "\n".join([f"{device}; geometric mean x torch {summary['geomean_x_torch']}; "
                      f".cuda() host cost {summary['cuda_call_host_us']:.0f} us", *table])
    write_results(args.out, "gpu_suite", summary, text)


if __name__ == "__main__":
    main()
