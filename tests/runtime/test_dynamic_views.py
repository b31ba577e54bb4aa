"""Dynamic dims (issue 28) with `mean`, the views and `rfactor`, and in the reference interpreter: a
mean over a dynamic dim counts its rows at run time; the interpreter runs a dynamic program at the
sizes of its arrays; pad, window, concat and rfactor over a dynamic dim are refused naming the tensor,
the dim and why. Results against float64 at sizes 1, below and off every tile."""
import numpy as np
import pytest

import looptool as lt
from tests.helpers import assert_close

b = lt.symbols("b", dynamic=True)[0]
k, m, n = lt.symbols("k m n")
SIZES = (1, 2, 3, 7, 17, 64, 100, 257)


@lt.function
def column_mean(x: lt.In[b, n]):
    return x.mean(b)


@lt.function
def whole_mean(x: lt.In[b, m, n]):
    return x.mean(b, m)                    # a dynamic and a fixed dim together


@lt.function
def centred(x: lt.In[b, n]):
    return x - x.mean(b)                   # the mean read back over every row


@pytest.mark.parametrize("size", SIZES)
def test_mean_over_a_dynamic_dim(size, rng):
    x = rng.standard_normal((size, 40)).astype(np.float32) + 3.0
    x64 = x.astype(np.float64)
    assert_close(column_mean(x), x64.mean(0), 1e-5)
    assert_close(centred(x), x64 - x64.mean(0), 1e-5)
    cube = rng.standard_normal((size, 5, 12)).astype(np.float32)
    assert_close(whole_mean(cube), cube.astype(np.float64).mean((0, 1)), 1e-5)


def test_mean_over_a_dynamic_dim_is_one_kernel_in_its_dtypes(rng):
    x = rng.standard_normal((9, 16)).astype(np.float32)
    mean = lt.Tensor(x).to(b, n).mean(b)
    assert mean.dtype == np.float32 and mean.loop_tree().program.dynamic == (("b", 1),)
    kernel = mean.compile()
    for size in (1, 5, 300):
        rows = rng.standard_normal((size, 16)).astype(np.float32)
        assert_close(kernel([rows]), rows.astype(np.float64).mean(0), 1e-5)
    accurate = lt.Tensor(x).to(b, n).mean(b, dtype=lt.float64)
    assert accurate.dtype == np.float64
    assert_close(accurate.numpy(), x.astype(np.float64).mean(0), 1e-12)
    half = lt.Tensor(x.astype(np.float16)).to(b, n).mean(b)
    assert half.dtype == np.float32
    assert_close(half.numpy(), x.astype(np.float16).astype(np.float64).mean(0), 1e-5)


def test_mean_over_a_dynamic_dim_under_schedules(rng):
    """The default schedule, the automatic one, and the count's loop split by 8 with its tail."""
    x = rng.standard_normal((11, 24)).astype(np.float32)
    mean = lt.Tensor(x).to(b, n).mean(b)
    tree = mean.loop_tree()
    count = next(st.name for st in tree.program.stages if st.dims == () and st.reduce_dims == ("b",))
    split = tree.split("b", 8, stage=count).unroll("b.1", stage=count)
    for schedule in (tree, lt.auto_schedule(mean), split):
        assert schedule.check()[0]
        kernel = mean.compile(schedule)
        for size in (1, 7, 8, 9, 61):
            rows = rng.standard_normal((size, 24)).astype(np.float32)
            assert_close(kernel([rows]), rows.astype(np.float64).mean(0), 1e-5)


def test_an_exported_mean_over_a_dynamic_dim_takes_any_size(tmp_path, rng):
    x = rng.standard_normal((10, 24)).astype(np.float32)
    loaded = lt.load(lt.export(centred, tmp_path / "centred", example=(x,)))
    for size in (1, 5, 33):
        rows = rng.standard_normal((size, 24)).astype(np.float32)
        x64 = rows.astype(np.float64)
        assert_close(loaded(rows), x64 - x64.mean(0), 1e-5)


def layer_tensor(x, w):
    return lt.relu((lt.Tensor(x).to(b, k) * lt.Tensor(w).to(k, n)).sum(k))


@pytest.mark.parametrize("size", (1, 3, 8, 13))
def test_the_interpreter_runs_a_dynamic_program_at_the_arrays_sizes(size, rng):
    """Under the default schedule and under a split of the rows by 4 with its tail (run one iteration
    at a time in Python, so a wrong order or bound would show), as the compiled kernel does."""
    w = rng.standard_normal((6, 10)).astype(np.float32)
    x = rng.standard_normal((size, 6)).astype(np.float32)
    tensor = layer_tensor(x, w)
    split = tensor.loop_tree().split("b", 4, stage="t0").reorder("b.0", "k", "b.1", "n", stage="t0")
    expected = np.maximum(x.astype(np.float64) @ w, 0)
    for schedule in (None, split):
        assert_close(lt.interpret(tensor, schedule), expected, 1e-5)
    interpreted = lt.runtime.interpreter.interpret(split, [x, w])
    assert_close(interpreted, tensor.compile(split)([x, w]), 1e-5)
    assert_close(lt.interpret(lt.Tensor(x).to(b, k).mean(b)), x.astype(np.float64).mean(0), 1e-5)


def test_the_interpreter_refuses_disagreeing_sizes(rng):
    x = rng.standard_normal((5, 4)).astype(np.float32)
    tensor = lt.Tensor(x).to(b, k) + lt.Tensor(x).to(b, k).exp()
    tree = tensor.loop_tree()
    with pytest.raises(ValueError, match=r"dim 'b' has size 5 in input in0 \(shape \(5, 4\)\) but 3 in input in1"):
        lt.runtime.interpreter.interpret(tree, [x, x[:3]])
    with pytest.raises(ValueError, match=r"input in1 has dims \('b', 'k'\); got an array of shape \(4,\)"):
        lt.runtime.interpreter.interpret(tree, [x, x[0]])


def test_views_over_a_dynamic_dim_are_refused_naming_tensor_dim_and_why(rng):
    x = rng.standard_normal((5, 3)).astype(np.float32)
    tensor = lt.Tensor(x).to(b, k)
    p, o, r, j, c = lt.symbols("p o r j c")
    why = "a kernel takes at run time only the sizes of the dynamic dims themselves, read from its inputs"
    with pytest.raises(NotImplementedError, match=rf"pad over dynamic dim 'b' of Tensor\(dims=\(b, k\), "
                                                  rf"shape=\(5, 3\)\): it would make 'p' of size B \+ 3, but {why}"):
        tensor.pad(b, p, (1, 2))
    with pytest.raises(NotImplementedError, match=rf"window over dynamic dim 'b' of Tensor\(dims=\(b, k\), "
                                                  rf"shape=\(5, 3\)\): it would make 'o' of a size computed from B"):
        tensor.window(b, o, r, 2)
    other = lt.Tensor(x[:2]).to(j, k)
    with pytest.raises(NotImplementedError, match=r"concat over dynamic dim 'b' of Tensor\(dims=\(b, k\), "
                                                  r"shape=\(5, 3\)\): it would make 'c' of size B \+ 2"):
        lt.concat([tensor, other], [b, j], c)
    assert_close(tensor.pad(k, p, 1).numpy(), np.pad(x.astype(np.float64), ((0, 0), (1, 1))), 1e-5)  # fixed dims pad
    total = tensor.sum(b)
    with pytest.raises(ValueError, match=r"rfactor of stage t0: 'b' is a dynamic dim; its last block of 4 would be "
                                         r"cut at B, and the guards of the IR .* take fixed bounds only"):
        total.loop_tree().rfactor("b", 4)
