"""Lowering to the IR: pointwise work is inlined into the stage that uses it, so a matmul
written as (a * b).sum(k) has no m*k*n temporary."""

import tracemalloc

import numpy as np

from tests.helpers import assert_close, f64, random_matmul


# ------------------------------------------------------ matmul temporaries

def test_matmul_does_not_allocate_mkn_temporary(rng):
    mm = kk = nn = 256  # an m*k*n float64 temporary would be 128 MiB
    t, a, b = random_matmul(rng, mm, kk, nn, np.float64)
    t.compile()  # keep compilation out of the measurement
    tracemalloc.start()
    try:
        got = t.numpy()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < mm * kk * nn * 8 // 8, f"peak traced allocation {peak} bytes during matmul"
    assert_close(got, f64(a) @ f64(b), 1e-12)


def _attention(rng, rows=24, width=8):
    import looptool as lt
    q, k, v = (rng.standard_normal((rows, width)).astype(np.float32) for _ in range(3))
    i, j, d = lt.symbols("i j d")
    scores = (lt.Tensor(q).to(i, d) * lt.Tensor(k).to(j, d)).sum(d) * 0.125
    e = (scores - scores.max(j)).exp()
    out = (e / e.sum(j) * lt.Tensor(v).to(j, d)).sum(j)
    s = f64(q) @ f64(k).T * 0.125
    p = np.exp(s - s.max(1, keepdims=True))
    return out, (p / p.sum(1, keepdims=True)) @ f64(v)


def test_attention_s_exp_and_its_normalized_factor_are_stages_of_their_own_on_the_cpu(rng):
    """exp(s - max) is read by two reductions (the row sum and the weighted sum); exp(s - max) / rowsum,
    a division, is the factor of the weighted sum that it reads again for every column of v: on the CPU
    each is a pure stage, the weighted sum a plain product of two loads. The GPU's lowering inlines both."""
    from looptool import ir
    from looptool.runtime import lower_on_host
    out, ref = _attention(rng)
    separate, _ = lower_on_host(out.node)
    inlined, _ = ir.lower(out.node)
    pure = {s.expr.op: s for s in separate.stages[:-1] if s.reduce_op is None}
    assert set(pure) == {"exp", "div"} and len(separate.stages) == len(inlined.stages) + 2
    exp_readers = [s.name for s in separate.stages if pure["exp"].name in ir.loaded_buffers(s.expr)]
    assert len(exp_readers) == 2                                 # the row sum and the division
    weighted = separate.output
    assert weighted.reduce_op == "sum" and isinstance(weighted.expr, ir.Binary) and weighted.expr.op == "mul"
    assert all(isinstance(x, ir.Load) for x in (weighted.expr.a, weighted.expr.b))
    explained = out.loop_tree().auto().explain()
    assert f"{pure['div'].name}: its div is computed once here, at full vector width, for the reduction " \
           f"{weighted.name}" in explained and f"{pure['exp'].name}: its exp is computed once here" in explained
    assert_close(out.numpy(), ref, 1e-5)


def test_a_cheap_factor_of_a_contraction_stays_inlined(rng):
    import looptool as lt
    from looptool.runtime import lower_on_host
    a, b = rng.standard_normal((12, 8)).astype(np.float32), rng.standard_normal((8, 10)).astype(np.float32)
    m, k, n = lt.symbols("m k n")
    c = ((lt.Tensor(a).to(m, k) * 2.0 + 1.0) * lt.Tensor(b).to(k, n)).sum(k)
    program, _ = lower_on_host(c.node)
    assert len(program.stages) == 1
    assert_close(c.numpy(), (f64(a) * 2 + 1) @ f64(b), 1e-6)


def test_a_transcendental_read_by_one_reduction_stays_inlined(rng):
    import looptool as lt
    from looptool.runtime import lower_on_host
    x = rng.standard_normal((16, 32)).astype(np.float32)
    m, n = lt.symbols("m n")
    t = lt.Tensor(x).to(m, n)
    e = (t - t.max(n)).exp()
    softmax = e / e.sum(n)                   # exp read by one reduction and by the pointwise result
    program, _ = lower_on_host(softmax.node)
    assert [s.reduce_op for s in program.stages] == ["max", "sum", None]
    assert_close(softmax.numpy(), np.exp(f64(x) - f64(x).max(1, keepdims=True)) /
                 np.exp(f64(x) - f64(x).max(1, keepdims=True)).sum(1, keepdims=True), 1e-6)
