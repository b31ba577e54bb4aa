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
