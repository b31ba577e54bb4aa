"""Dynamic dims (issue 28): one kernel for every size of a dim declared with `dynamic=True`; its loop
tree printed symbolically, tails kept for every size, no element read or written outside its array,
results against float64, and bad sizes refused in words."""
import numpy as np
import pytest

import looptool as lt
from tests.helpers import assert_close

b = lt.symbols("b", dynamic=True)[0]
k, n = lt.symbols("k n")


def traced_layer():
    traces = []

    @lt.function
    def layer(x: lt.In[b, k], w: lt.In[k, n]):
        traces.append(x.shape)
        return lt.relu((x * w).sum(k))
    return layer, traces


def test_one_trace_and_one_kernel_serve_every_size(rng):
    layer, traces = traced_layer()
    w = rng.standard_normal((24, 40)).astype(np.float32)
    for size in [*range(1, 40), 63, 64, 65, 255, 256, 257, 1000]:
        x = rng.standard_normal((size, 24)).astype(np.float32)
        assert_close(layer(x, w), np.maximum(x.astype(np.float64) @ w, 0), 1e-5)
    assert len(traces) == 1
    other_k = rng.standard_normal((9, 40)).astype(np.float32)        # a static dim's size: a new signature
    assert_close(layer(x[:, :9], other_k), np.maximum(x[:, :9].astype(np.float64) @ other_k, 0), 1e-5)
    assert len(traces) == 2
    assert layer.kernel(x, w) is layer.kernel(x[:5], w)          # the kernel cache ignores the size too


def test_out_takes_the_call_size(rng):
    layer, _ = traced_layer()
    w = rng.standard_normal((24, 40)).astype(np.float32)
    for size in (3, 11):
        x = rng.standard_normal((size, 24)).astype(np.float32)
        out = np.full((size, 40), np.nan, np.float32)
        assert layer(x, w, out=out) is out
        assert_close(out, np.maximum(x.astype(np.float64) @ w, 0), 1e-5)
    with pytest.raises(ValueError, match=r"out must be an aligned, C-contiguous float32 array of shape \(11, 40\)"):
        layer(x, w, out=np.empty((10, 40), np.float32))


def test_steady_calls_at_every_size_skip_the_python_checks_and_still_refuse_bad_sizes(rng, monkeypatch):
    """The checked entry reads the dynamic size (and compares it where arguments share the dim), so calls
    at new sizes skip the checks in Python; a size mismatch or one below the minimum is still refused
    in words."""
    from looptool.runtime.functions import Function
    c = lt.symbols("c", dynamic=True, min=2)[0]

    @lt.function
    def blend(x: lt.In[c, k], y: lt.In[c, k], w: lt.In[k, n]):
        return ((x + y) * w).sum(k)
    w = rng.standard_normal((6, 5)).astype(np.float32)
    blend(*rng.standard_normal((2, 3, 6)).astype(np.float32), w)
    checked = []
    real = Function._checked_call
    monkeypatch.setattr(Function, "_checked_call",
                        lambda self, arrays, out: checked.append(1) or real(self, arrays, out))
    for size in (2, 7, 64, 3):
        x, y = rng.standard_normal((2, size, 6)).astype(np.float32)
        assert_close(blend(x, y, w), (x.astype(np.float64) + y) @ w, 1e-5)
        out = np.full((size, 5), np.nan, np.float32)
        assert blend(x, y, w, out=out) is out
        assert_close(out, (x.astype(np.float64) + y) @ w, 1e-5)
    assert checked == []
    with pytest.raises(ValueError, match=r"dim 'c' has size 3 in argument x \(shape \(3, 6\)\) but 2 in argument y"):
        blend(x, y[:2], w)
    with pytest.raises(ValueError, match=r"dynamic dim 'c' has size 1 in argument x .* from 2 up"):
        blend(x[:1], y[:1], w)
    assert_close(blend(x.tolist(), y, w), (x.astype(np.float64) + y) @ w, 1e-5)
    with pytest.raises(ValueError, match=r"out must be an aligned, C-contiguous float32 array of shape \(3, 5\)"):
        blend(x, y, w, out=np.empty((4, 5), np.float32))


def test_buffers_made_per_call_take_the_call_size_in_steady_calls(rng):
    """Softmax stages its row maxima and sums in buffers of B elements, made per call at its size."""
    @lt.function
    def softmax(x: lt.In[b, k]):
        e = (x - x.max(k)).exp()
        return e / e.sum(k)
    for size in (5, 17, 300, 2):
        x = rng.standard_normal((size, 33)).astype(np.float32)
        for _ in range(2):
            e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
            assert_close(softmax(x), e / e.sum(1, keepdims=True), 1e-5)


def test_the_loop_tree_prints_the_size_symbolically(rng):
    layer, _ = traced_layer()
    x, w = rng.standard_normal((10, 24)).astype(np.float32), rng.standard_normal((24, 40)).astype(np.float32)
    text = str(layer.loop_tree(x, w))
    assert "in0: f32[B, 24] input" in text and "t1: f32[B, 40] output" in text and "< B" in text
    plain = str(lt.Tensor(x).to(b, k).loop_tree().split("b", 4))
    assert "for b.0 in 0..ceil(B/4)" in plain and "for b.1 in 0..4 while b.1 + 4*b.0 < B" in plain


def guarded_run(tensor_of, schedule, size: int, rng, columns: int = 24) -> tuple[np.ndarray, np.ndarray]:
    """Run `tensor_of(x)` under `schedule` on an x of `size` rows whose neighbours in memory are NaN, into
    an `out` whose neighbours are a sentinel: a read outside x makes NaN, a write outside out shows."""
    memory = np.full((size + 2, columns), np.nan, np.float32)
    x = memory[1:size + 1]
    x[...] = rng.standard_normal((size, columns))
    tensor = tensor_of(x)
    padded = np.full((size + 2,) + tensor.shape[1:], 7.0, tensor.dtype)
    arrays = lt.runtime.lower_on_host(tensor.node)[1]
    result = tensor.compile(schedule)(arrays, out=padded[1:size + 1])
    assert np.all(padded[0] == 7.0) and np.all(padded[size + 1] == 7.0), "a write outside out"
    return result, x


def split_schedules(tree: lt.LoopTree) -> list[lt.LoopTree]:
    """Schedules of a (b, k) x (k, n) contraction with tails on b: a parallel register tile of 8 rows,
    and a tile of 2 x 4 rows whose inner row loop's count moves with the outer one."""
    parallel = tree.split("b", 8).split("b.0", 3).split("n", 16).reorder("b.0.0", "b.0.1", "n.0", "k", "b.1", "n.1")
    nested = tree.split("b", 8).split("b.1", 4).split("n", 16).reorder("b.0", "n.0", "k", "b.1.0", "b.1.1", "n.1")
    return [parallel.unroll("b.1").vectorize("n.1").parallel("b.0.0"),
            nested.unroll("b.1.0").unroll("b.1.1").vectorize("n.1")]


@pytest.mark.parametrize("which", [0, 1])
def test_split_tails_hold_for_every_size_with_nothing_touched_outside(which, rng):
    w = rng.standard_normal((24, 40)).astype(np.float32)

    def tensor_of(x):
        return (lt.Tensor(x).to(b, k) * lt.Tensor(w).to(k, n)).sum(k)
    tree = split_schedules(tensor_of(np.zeros((3, 24), np.float32)).loop_tree())[which]
    assert tree.check() == (True, "legal")
    for size in range(1, 60):
        result, x = guarded_run(tensor_of, tree, size, rng)
        assert_close(result, x.astype(np.float64) @ w, 1e-5)


def test_the_automatic_schedule_takes_every_size(rng):
    w = rng.standard_normal((24, 40)).astype(np.float32)

    def tensor_of(x):
        return (lt.Tensor(x).to(b, k) * lt.Tensor(w).to(k, n)).sum(k)
    tree = lt.auto_schedule(tensor_of(np.zeros((3, 24), np.float32)))
    assert tree.check() == (True, "legal") and "B" in str(tree)
    for node, _ in tree.walk():
        if hasattr(node, "loop") and isinstance(node.loop.extent, lt.ir.Size):
            assert node.loop.annotation in ("", "parallel"), "a loop of dynamic extent unrolled or vectorized"
    for size in [1, 2, 5, 8, 9, 17, 100, 300]:
        result, x = guarded_run(tensor_of, None, size, rng)
        assert_close(result, x.astype(np.float64) @ w, 1e-5)


def test_reductions_over_a_dynamic_dim_and_a_compiled_kernel_called_at_other_sizes(rng):
    x = rng.standard_normal((37, 24)).astype(np.float32)
    total = lt.Tensor(x).to(b, k).sum(b)
    kernel = total.compile()
    for size in (1, 2, 36, 37, 200):
        data = rng.standard_normal((size, 24)).astype(np.float32)
        assert_close(kernel([data]), data.astype(np.float64).sum(0), 1e-5)
    assert_close(total.numpy(), x.astype(np.float64).sum(0), 1e-5)


def test_bad_sizes_are_refused_in_words(rng):
    @lt.function
    def add(x: lt.In[b, k], y: lt.In[b, k]):
        return x + y
    x, y = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((6, 4)).astype(np.float32)
    assert_close(add(x, y), x.astype(np.float64) + y, 1e-5)
    with pytest.raises(ValueError, match=r"dim 'b' has size 6 in argument x \(shape \(6, 4\)\) but 5 in argument y"):
        add(x, y[:5])                                  # the signature matches: the call's check
    with pytest.raises(ValueError, match="symbol 'b' has two sizes: 3 .* and 5"):
        add(x[:3, :2], y[:5, :2])                      # a new signature: refused while tracing
    with pytest.raises(ValueError, match=r"dynamic dim 'b' has size 0 in argument x .* from 1 up"):
        add(x[:0], y[:0])
    with pytest.raises(ValueError, match=r"argument x \(lt.In\[b, k\]\)"):
        add(x[0], y[0])                                # wrong rank
    with pytest.raises(TypeError, match="dtype int64 is not supported"):
        add(x.astype(np.int64), y)


def test_a_minimum_size_is_refused_below_and_proved_from(rng):
    big = lt.symbols("c", dynamic=True, min=4)[0]

    @lt.function
    def double(x: lt.In[big, k]):
        return x * 2.0
    x = rng.standard_normal((9, 3)).astype(np.float32)
    assert_close(double(x), 2.0 * x.astype(np.float64), 1e-5)
    assert_close(double(x[:4]), 2.0 * x[:4].astype(np.float64), 1e-5)
    with pytest.raises(ValueError, match=r"dynamic dim 'c' has size 3 in argument x .* from 4 up"):
        double(x[:3])
    with pytest.raises(ValueError, match="dynamic dim 'c' has size 3, below its minimum 4"):
        lt.Tensor(x[:3]).to(big, k)


def test_what_dynamic_dims_do_not_support_is_refused_in_words(rng):
    x = rng.standard_normal((5, 3)).astype(np.float32)
    with pytest.raises(NotImplementedError, match="dynamic dim 'b' is axis 1"):
        lt.Tensor(x).to(k, b)
    with pytest.raises(NotImplementedError, match="dynamic dim 'b' is not the first axis of the result"):
        (lt.Tensor(x[0]).to(k) * lt.Tensor(x[:, 0]).to(b)).numpy()       # dims (k, b)
    tensor = lt.Tensor(x).to(b, k)
    with pytest.raises(NotImplementedError, match="pad over dynamic dim 'b'"):
        tensor.pad(b, lt.symbols("p")[0], 1)
    with pytest.raises(ValueError, match="runs B iterations, a number known only at run time"):
        tensor.loop_tree().unroll("b")
    captured = x

    @lt.function
    def shifted(y: lt.In[k]):
        return lt.Tensor(captured).to(b, k) + y
    with pytest.raises(ValueError, match="captures an array of dims \\('b', 'k'\\).*pass it as an argument"):
        shifted(x[0])


def batched_matmul(x, rng):
    w = rng.standard_normal((x.shape[2], 20)).astype(np.float32)
    m = lt.symbols("m")[0]
    return (lt.Tensor(x).to(b, m, k) * lt.Tensor(w).to(k, n)).sum(k), x.astype(np.float64) @ w


def conv_over_a_batch(x, rng):
    c, h, w, o, oh, ow, kh, kw = lt.symbols("c h w o oh ow kh kw")
    filters = rng.standard_normal((4, x.shape[1], 3, 3)).astype(np.float32)
    windows = lt.Tensor(x).to(b, c, h, w).window(h, oh, kh, 3, padding=1).window(w, ow, kw, 3, padding=1)
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    patches = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    return (windows * lt.Tensor(filters).to(o, c, kh, kw)).sum(c, kh, kw), \
        np.einsum("bchwij,ocij->bhwo", patches, filters.astype(np.float64))


def softmax_rows(x, rng):
    t = lt.Tensor(x).to(b, k)
    e = (t - t.max(k)).exp()
    ref = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    return e / e.sum(k), ref / ref.sum(1, keepdims=True)


def max_over_the_batch(x, rng):
    return lt.Tensor(x).to(b, k).max(b), x.astype(np.float64).max(0)


@pytest.mark.parametrize("workload, shape", [(batched_matmul, (7, 24)), (conv_over_a_batch, (3, 9, 9)),
                                             (softmax_rows, (33,)), (max_over_the_batch, (21,))])
def test_workloads_over_a_dynamic_batch_compile_once(workload, shape, rng):
    lt.clear_cache()
    for size in (1, 2, 9, 40):
        tensor, reference = workload(rng.standard_normal((size, *shape)).astype(np.float32), rng)
        assert "B" in str(tensor.loop_tree())
        assert_close(tensor.numpy(), reference, 1e-5)
    assert lt.cache_info()["misses"] == 1


@pytest.fixture
def two_threads():
    before = lt.get_num_threads()
    lt.set_num_threads(2)
    yield
    lt.set_num_threads(before)


def test_a_parallel_loop_of_dynamic_extent_runs_threaded_or_serial_by_the_call_size(rng, two_threads):
    def tensor_of(x):
        return (lt.Tensor(x).to(b, k) * 2.0).exp()
    tree = tensor_of(np.zeros((3, 300), np.float32)).loop_tree().split("k", 16).vectorize("k.1").parallel("b")
    assert "for b in 0..B  [parallel]" in str(tree)
    for size in (1, 2, 5, 431, 432, 2000):      # from 432 rows (304 iterations each) 2 threads get enough work
        result, x = guarded_run(tensor_of, tree, size, rng, columns=300)
        assert_close(result, np.exp(2.0 * x.astype(np.float64)), 1e-5)
    explained = lt.auto_schedule(tensor_of(np.zeros((3, 300), np.float32))).explain()
    assert "when a call's size gives each enough work" in explained
