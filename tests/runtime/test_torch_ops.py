"""lt.torch_op: a compiled function registered as a PyTorch custom op on CPU (and, marked `gpu`, CUDA)
tensors, eager and under torch.compile with no graph break, with its in-place `_out` variant; skipped,
with the reason, where PyTorch is not installed."""
import itertools

import numpy as np
import pytest

import looptool as lt
from tests.helpers import assert_close

torch = pytest.importorskip("torch", reason="lt.torch_op needs PyTorch (pip install torch)")
m, k, n = lt.symbols("m k n")
NAMES = (f"matmul_{i}" for i in itertools.count())      # an op name is registered once a process


@lt.function
def matmul(a: lt.In[m, k], b: lt.In[k, n]):
    return (a * b).sum(k)


def test_a_function_runs_as_a_torch_op_on_cpu_tensors_without_copies(rng):
    name = next(NAMES)
    op = lt.torch_op(matmul, name=name)
    a, b = torch.from_numpy(rng.standard_normal((33, 20)).astype(np.float32)), torch.randn(20, 17)
    got = op(a, b)
    assert isinstance(got, torch.Tensor) and got.shape == (33, 17)
    assert_close(got.numpy(), a.double().numpy() @ b.double().numpy(), 1e-5)
    out = torch.full((33, 17), float("nan"))
    before = out.data_ptr()
    getattr(torch.ops.looptool, f"{name}_out")(a, b, out)
    assert out.data_ptr() == before and torch.equal(out, got)


def test_a_torch_op_runs_under_torch_compile_with_no_graph_break(rng):
    op = lt.torch_op(matmul, name=next(NAMES))

    def layer(x, w):
        return torch.relu(op(x, w)) * 2.0
    compiled = torch.compile(layer, fullgraph=True, backend="eager")     # fullgraph: a graph break raises
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    expected = np.maximum(x.double().numpy() @ w.double().numpy(), 0) * 2
    assert_close(compiled(x, w).numpy(), expected, 1e-5)


def test_a_torch_op_takes_bfloat16_and_names_bad_names(rng):
    op = lt.torch_op(matmul, name=f"lt_tests::{next(NAMES)}")
    a, b = torch.randn(12, 8, dtype=torch.bfloat16), torch.randn(8, 5, dtype=torch.bfloat16)
    assert_close(op(a, b).numpy(), a.double().numpy() @ b.double().numpy(), 1e-5)
    with pytest.raises(ValueError, match="name 'not a name' must be an identifier"):
        lt.torch_op(matmul, name="not a name")


@pytest.mark.gpu
def test_a_torch_op_runs_on_cuda_tensors(rng):
    from tests.gpu_helpers import cupy_or_skip
    cupy_or_skip()
    op = lt.torch_op(matmul, name=next(NAMES))
    a, b = torch.randn(100, 64, device="cuda"), torch.randn(64, 72, device="cuda")
    got = op(a, b)
    assert got.is_cuda and float(((got.double() - a.double() @ b.double()).norm()) / got.double().norm()) < 1e-5
    compiled = torch.compile(lambda x, y: op(x, y) + 1.0, fullgraph=True, backend="eager")
    assert torch.allclose(compiled(a, b), got + 1.0)
