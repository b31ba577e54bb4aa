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


def test_a_transcendental_read_by_two_reductions_is_a_stage_of_its_own_on_the_cpu(rng):
    from looptool import ir
    from looptool.runtime import lower_on_host
    out, ref = _attention(rng)
    shared, _ = lower_on_host(out.node)
    inlined, _ = ir.lower(out.node)
    exps = [s for s in shared.stages if isinstance(s.expr, ir.Unary) and s.expr.op == "exp"]
    assert len(exps) == 1 and exps[0].reduce_op is None and exps[0].dims == ("i", "j")
    assert len(shared.stages) == len(inlined.stages) + 1
    readers = [s.name for s in shared.stages if exps[0].name in ir.loaded_buffers(s.expr)]
    assert len(readers) == 2                                     # the row sum and the weighted sum
    assert f"{exps[0].name}: its exp is read by the reductions {', '.join(readers)}: computed once" \
        in out.loop_tree().auto().explain()
    assert_close(out.numpy(), ref, 1e-5)


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
