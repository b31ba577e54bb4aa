"""Named workloads for the command line and benchmarks: a tensor plus its NumPy baseline."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

import looptool as lt


@dataclass
class Workload:
    """A computation to tune or benchmark, with the NumPy expression it replaces."""

    name: str
    tensor: lt.Tensor
    baseline: Callable[[], np.ndarray] | None = None


def matmul(m: int = 512, k: int = 512, n: int = 512, seed: int = 0) -> Workload:
    """float32 (m×k) @ (k×n) written as (a * b).sum(k)."""
    rng = np.random.default_rng(seed)
    a_np = rng.standard_normal((m, k), dtype=np.float32)
    b_np = rng.standard_normal((k, n), dtype=np.float32)
    s = lt.symbols("m k n")
    c = (lt.Tensor(a_np).to(s.m, s.k) * lt.Tensor(b_np).to(s.k, s.n)).sum(s.k)
    return Workload(f"matmul:{m}x{k}x{n}", c, lambda: a_np @ b_np)


def softmax(rows: int = 4096, cols: int = 1024, seed: int = 0) -> Workload:
    """Row softmax of a float32 matrix."""
    x_np = np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32)
    m, n = lt.symbols("m n")
    x = lt.Tensor(x_np).to(m, n)
    e = (x - x.max(n)).exp()

    def baseline():
        ex = np.exp(x_np - x_np.max(1, keepdims=True))
        return ex / ex.sum(1, keepdims=True)
    return Workload(f"softmax:{rows}x{cols}", e / e.sum(n), baseline)


def layernorm(rows: int = 4096, cols: int = 1024, seed: int = 0) -> Workload:
    """Row layer-norm with gain and bias, eps 1e-5."""
    rng = np.random.default_rng(seed)
    x_np = rng.standard_normal((rows, cols), dtype=np.float32)
    g_np, b_np = rng.standard_normal(cols, dtype=np.float32), rng.standard_normal(cols, dtype=np.float32)
    m, n = lt.symbols("m n")
    x = lt.Tensor(x_np).to(m, n)
    centered = x - x.mean(n)
    y = centered / ((centered * centered).mean(n) + 1e-5).sqrt() * lt.Tensor(g_np).to(n) + lt.Tensor(b_np).to(n)

    def baseline():
        mu = x_np.mean(1, keepdims=True)
        return (x_np - mu) / np.sqrt(x_np.var(1, keepdims=True) + 1e-5) * g_np + b_np
    return Workload(f"layernorm:{rows}x{cols}", y, baseline)


BUILTIN = {"matmul": matmul, "softmax": softmax, "layernorm": layernorm}


def resolve(spec: str) -> Workload:
    """'matmul:512x512x512', 'softmax:4096x1024', 'layernorm', or 'package.module:function'.

    A function must return a Workload or an lt.Tensor."""
    name, _, args = spec.partition(":")
    if name in BUILTIN:
        sizes = [int(v) for v in args.split("x")] if args else []
        return BUILTIN[name](*sizes)
    if not args:
        raise ValueError(f"unknown workload {spec!r}: use one of {sorted(BUILTIN)} (e.g. matmul:512x512x512) "
                         f"or module:function")
    made = getattr(importlib.import_module(name), args)()
    return made if isinstance(made, Workload) else Workload(spec, made)
