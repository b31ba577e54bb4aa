"""Compiled functions as PyTorch operators: `lt.torch_op(fn, name="matmul")` registers an `lt.function`
as the `torch.library` custom op `looptool::matmul` for CPU and CUDA tensors (the tensors' memory is
passed as it is, no copy), with its in-place variant `looptool::matmul_out(..., Tensor(a!) out)` and a
shape function, so it runs in eager code and under `torch.compile` without a graph break.

    m, k, n = lt.symbols("m k n")

    @lt.function
    def matmul(a: lt.In[m, k], b: lt.In[k, n]):
        return (a * b).sum(k)

    op = lt.torch_op(matmul, name="matmul")      # torch.ops.looptool.matmul
    c = op(a, b)                                  # CPU or CUDA tensors, eager or under torch.compile
"""
from __future__ import annotations

import sys

import numpy as np

from ..frontend import dtypes
from .functions import Function

NAMESPACE = "looptool"


def torch_op(fn, name: str):
    """Register `fn` (an `lt.function`, or a function whose parameters carry `lt.In[...]` dims) as the
    PyTorch custom op `looptool::<name>` (or `<namespace>::<name>`) on CPU and CUDA tensors, with the
    in-place `<name>_out`; returns the op (`torch.ops.<namespace>.<name>`)."""
    import torch
    compiled = fn if isinstance(fn, Function) else Function(fn, sys._getframe(1).f_locals)
    namespace, _, op_name = name.rpartition("::")
    namespace = namespace or NAMESPACE
    if not op_name.isidentifier():
        raise ValueError(f"lt.torch_op: name {name!r} must be an identifier, optionally after 'namespace::'")
    params = [param for param, _ in compiled.params]
    qualified = f"{namespace}::{op_name}"
    torch.library.define(qualified, f"({', '.join(f'Tensor {p}' for p in params)}) -> Tensor")
    torch.library.define(f"{qualified}_out",
                         f"({', '.join(f'Tensor {p}' for p in params)}, Tensor(a!) out) -> ()")
    for device in ("CPU", "CUDA"):
        torch.library.impl(qualified, device)(lambda *tensors: _run(compiled, tensors))
        torch.library.impl(f"{qualified}_out", device)(lambda *tensors: _run(compiled, tensors[:-1], tensors[-1]))
    torch.library.register_fake(qualified)(lambda *tensors: _empty_result(compiled, tensors))
    torch.library.register_fake(f"{qualified}_out")(lambda *tensors: None)
    return getattr(getattr(torch.ops, namespace), op_name)


def _run(compiled: Function, tensors, out=None):
    """The function on these tensors: on the GPU as they are; on the CPU through NumPy views of their
    memory (bfloat16 through its bits), the result handed back to PyTorch without a copy."""
    import torch
    if tensors and tensors[0].is_cuda:
        return compiled(*tensors, out=out)
    arrays = [_numpy_view(t) for t in tensors]
    if out is not None:
        compiled(*arrays, out=_numpy_view(out))
        return None
    result = compiled(*arrays)
    if result.dtype == dtypes.bfloat16:
        return torch.from_numpy(result.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(result)


def _numpy_view(tensor) -> np.ndarray:
    import torch
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(dtypes.bfloat16)
    return tensor.numpy()


def _empty_result(compiled: Function, tensors):
    """The shape function: the result's shape and dtype from a trace on arrays of the tensors' shapes and
    dtypes that hold no memory (zero strides)."""
    import torch
    dtype_of = {torch.float16: np.float16, torch.bfloat16: dtypes.bfloat16, torch.float32: np.float32,
                torch.float64: np.float64}
    stand_ins = [np.broadcast_to(np.zeros((), dtype_of[t.dtype]), tuple(t.shape)) for t in tensors]
    result = compiled.tensor(*stand_ins)
    return tensors[0].new_empty(result.shape, dtype=getattr(torch, np.dtype(result.dtype).name))
