"""GPU legality: a reduction whose loop crosses GPU blocks or threads without a combine is illegal."""
import numpy as np

import looptool as lt
from tests.gpu_helpers import matmul


def test_reduction_bound_to_blocks_is_illegal(rng):
    c, _ = matmul(rng)
    tree = c.loop_tree().reorder("m", "n", "k").bind("k", "block.x").bind("n", "thread.x")
    legal, reason = tree.check()
    assert not legal
    assert "crosses GPU threads" in reason and "without a combine" in reason and "buffer t0" in reason


def test_reading_a_reduction_inside_the_thread_loop_that_combines_it_is_illegal(rng):
    x_np = rng.standard_normal((16, 8)).astype(np.float32)
    m, n = lt.symbols("m n")
    x = lt.Tensor(x_np).to(m, n)
    y = x - x.exp().sum(n)
    tree = y.loop_tree().bind("m", "block.x").bind("n", "thread.x").place("t0", "t1", 2)
    legal, reason = tree.check()
    assert not legal and "buffer t0" in reason and "loop 'n'" in reason
