"""Dimensions of size 0 behave as in NumPy: an empty result, a sum over nothing is 0, a mean
over nothing is NaN with a RuntimeWarning, and max/min over nothing is an error naming the
dimension.  Kernels over empty loops touch no memory: the output sits between canaries."""
import warnings

import numpy as np
import pytest

import looptool as lt
from tests.helpers import assert_close, mentions
from tests.schedule_helpers import apply_steps, run_guarded


def named(shape, *names, dtype=np.float32, rng=None):
    """(array, tensor named `names`) of random values of `shape`."""
    rng = rng or np.random.default_rng(0)
    array = rng.standard_normal(shape).astype(dtype)
    return array, lt.Tensor(array).to(*lt.symbols(" ".join(names)))


def compare(t, ref, steps=()):
    """Compiled (writing between canaries) and interpreted results of `t` under `steps` equal `ref`."""
    tree = apply_steps(t.loop_tree(), steps)
    assert tree.check() == (True, "legal")
    got = run_guarded(t, tree).value
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert_close(got, ref, 1e-5)
    assert_close(lt.interpret(t, tree), ref, 1e-5)


@pytest.mark.parametrize("m, k, n", [(3, 0, 4), (0, 5, 4), (3, 5, 0), (0, 0, 0)])
@pytest.mark.parametrize("steps", [[], [("split", "k", 4), ("split", "n", 8), ("vectorize", "n.1"),
                                        ("parallel", "m")]])
def test_matmul_with_an_empty_dimension(m, k, n, steps):
    a, ta = named((m, k), "m", "k")
    b, tb = named((k, n), "k", "n")
    compare((ta * tb).sum(lt.symbols("k")[0]), a.astype(np.float64) @ b, steps)


def test_pointwise_and_reductions_of_an_empty_tensor():
    x, t = named((0, 4), "m", "n")
    m, n = lt.symbols("m n")
    compare((t.exp() + 1.0).relu(), np.maximum(np.exp(x.astype(np.float64)) + 1.0, 0.0))
    compare(t.sum(m), x.sum(axis=0, dtype=np.float64))          # over nothing: zeros
    compare(t.sum(n), x.sum(axis=1, dtype=np.float64))          # of nothing: empty
    compare(t.max(n), x.max(axis=1).astype(np.float64))         # max of empty rows: empty
    softmax = (t - t.max(n)).exp()
    compare(softmax / softmax.sum(n), np.zeros((0, 4)), [("place", "t0", "t1", 1)])


def test_mean_over_nothing_is_nan_with_a_warning_as_in_numpy():
    x, t = named((0, 4), "m", "n")
    with pytest.warns(RuntimeWarning, match="Mean of empty slice"):
        mean = t.mean(lt.symbols("m")[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ref = x.astype(np.float64).mean(axis=0)
    got = mean.numpy()
    assert got.shape == ref.shape == (4,) and np.isnan(got).all() and np.isnan(ref).all()


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_over_nothing_name_the_dimension(op):
    x, t = named((3, 0), "rows", "empty")
    with pytest.raises(ValueError, match=mentions(op, "empty", "size 0")):
        getattr(t, op)(lt.symbols("empty")[0])
    with pytest.raises(ValueError):  # NumPy refuses too
        getattr(x, op)(axis=1)
