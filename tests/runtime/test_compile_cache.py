"""The runtime's compile cache: a hit for the same computation on new data, a miss for a
new shape or dtype."""

import numpy as np

import looptool as lt
from tests.helpers import assert_close, f64, misaligned, rand


# ------------------------------------------------------------------- cache

def _cache_expr(x, y):
    a, b = lt.symbols("a b")
    return ((lt.Tensor(x).to(a, b) * 2.5 + lt.Tensor(y).to(b)).relu()).sum(a)


def test_cache_hit_for_same_computation_miss_for_new_shape(rng):
    info = lt.cache_info()
    assert isinstance(info["hits"], int) and isinstance(info["misses"], int)

    x1, y1 = rand(rng, (37, 41)), rand(rng, (41,))
    x2, y2 = rand(rng, (37, 41)), rand(rng, (41,))
    x3, y3 = rand(rng, (38, 43)), rand(rng, (43,))
    ref = lambda x, y: np.maximum(f64(x) * 2.5 + f64(y), 0).sum(0)

    s0 = dict(lt.cache_info())
    assert_close(_cache_expr(x1, y1).numpy(), ref(x1, y1), 1e-5)
    s1 = dict(lt.cache_info())
    assert s1["misses"] > s0["misses"], "first build of a new computation must compile"

    # Same computation, new Tensor objects, new data: a hit, no compilation.
    assert_close(_cache_expr(x2, y2).numpy(), ref(x2, y2), 1e-5)
    s2 = dict(lt.cache_info())
    assert s2["misses"] == s1["misses"]
    assert s2["hits"] > s1["hits"]

    # Different shapes: compiled anew.
    assert_close(_cache_expr(x3, y3).numpy(), ref(x3, y3), 1e-5)
    s3 = dict(lt.cache_info())
    assert s3["misses"] > s2["misses"]


def test_cache_miss_for_different_dtype(rng):
    x, y = rand(rng, (29, 31)), rand(rng, (31,))
    _cache_expr(x, y).numpy()
    s1 = dict(lt.cache_info())
    got = _cache_expr(x.astype(np.float64), y.astype(np.float64)).numpy()
    s2 = dict(lt.cache_info())
    assert got.dtype == np.float64
    assert s2["misses"] > s1["misses"]
    assert_close(got, np.maximum(f64(x) * 2.5 + f64(y), 0).sum(0), 1e-12)


# ------------------------------------------------------------------- compiling to object code

def test_compile_object_leaves_the_cycle_collector_as_it_found_it_and_the_module_freed(rng):
    import gc

    from looptool import runtime
    x, y = rand(rng, (37, 41)), rand(rng, (41,))
    tree = _cache_expr(x, y).loop_tree()
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            compiled = runtime.compile_object(tree, 1)
            assert gc.isenabled() is enabled
            assert gc.get_count()[0] < 200, "the module's objects were left for a later collection"
        finally:
            gc.enable()
        assert "define" in compiled.llvm_ir and compiled.code


# ----------------------------------------------------------- prepared calls

def test_numpy_again_runs_the_prepared_kernel_on_the_arrays_as_they_are_now(rng, monkeypatch):
    """A second `.numpy()` of one expression does not lower, schedule or look up again (64^3 matmul on
    the Xeon: 92 -> 7 us a call, the kernel 6 us), and reads its inputs as they are at that call."""
    from looptool.runtime import cpu
    x, y = rand(rng, (37, 41)), rand(rng, (41,))
    c = _cache_expr(x, y)
    assert_close(c.numpy(), np.maximum(f64(x) * 2.5 + f64(y), 0).sum(0), 1e-5)
    lowered = []
    monkeypatch.setattr(cpu, "lower_on_host", lambda node: lowered.append(node))
    x[:] = rand(rng, (37, 41))                       # in place: the graph holds this very array
    first, second = c.numpy(), c.numpy()
    assert lowered == [] and first is not second
    assert_close(second, np.maximum(f64(x) * 2.5 + f64(y), 0).sum(0), 1e-5)


def test_numpy_prepares_again_for_another_thread_count(rng):
    x, y = rand(rng, (37, 41)), rand(rng, (41,))
    c = _cache_expr(x, y)
    before = lt.get_num_threads()
    try:
        lt.set_num_threads(1)
        one = c.numpy()
        lt.set_num_threads(2)
        assert lt.runtime.cpu._PREPARED[c.node][0][1] == 1
        two = c.numpy()
        assert lt.runtime.cpu._PREPARED[c.node][0][1] == 2
    finally:
        lt.set_num_threads(before)
    assert_close(two, f64(one), 1e-6)


def test_numpy_of_a_copied_input_copies_it_again_at_each_call(rng):
    """A misaligned input is copied by lowering: each call copies it anew, so an in-place change is seen."""
    x = misaligned(rand(rng, (37, 41)))
    y = rand(rng, (41,))
    c = _cache_expr(x, y)
    c.numpy()
    x[:] = rand(rng, (37, 41))
    assert_close(c.numpy(), np.maximum(f64(x) * 2.5 + f64(y), 0).sum(0), 1e-5)
    assert c.node not in lt.runtime.cpu._PREPARED
