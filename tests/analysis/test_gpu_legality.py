"""GPU legality: a reduction whose loop crosses GPU blocks or threads without a combine is illegal."""
import numpy as np

import looptool as lt
from tests.gpu_helpers import matmul


def test_a_sum_bound_to_blocks_whose_zeroing_runs_in_the_same_kernel_is_illegal(rng):
    """k inside m and n: each block zeroes t0 in the kernel that other blocks add into, unordered."""
    c, _ = matmul(rng)
    tree = c.loop_tree().reorder("m", "n", "k").bind("k", "block.x").bind("n", "thread.x")
    legal, reason = tree.check()
    assert not legal
    assert "crosses GPU threads" in reason and "`t0[m, n] = 0`" in reason and "different blocks" in reason


def test_a_float32_or_float64_sum_whose_reduction_loop_is_outermost_on_blocks_is_added_atomically(rng):
    """k's blocks outermost: t0 is zeroed by a kernel of its own, and the blocks' updates are atomic adds."""
    for dtype in (np.float32, np.float64):
        c, _ = matmul(rng, dtype=dtype)
        tree = c.loop_tree().split("k", 8).reorder("k.0", "m", "n", "k.1").bind("k.0", "block.z") \
            .bind("m", "block.x").bind("n", "thread.x")
        assert tree.check() == (True, "legal")


def test_a_max_bound_to_blocks_is_refused_in_words(rng):
    """The GPU combines blocks' terms only by atomic adds, of float32 and float64 sums."""
    x = rng.standard_normal((64, 32)).astype(np.float32)
    m, n = lt.symbols("m n")
    peak = lt.Tensor(x).to(m, n).max(m)
    tree = peak.loop_tree().split("m", 8).reorder("m.0", "n", "m.1").bind("m.0", "block.y").bind("n", "thread.x")
    legal, reason = tree.check()
    assert not legal and "stage t0 (max of float32) has a reduction loop bound to GPU blocks" in reason
    assert "only sums of float32 or float64" in reason


def test_reading_a_reduction_inside_the_thread_loop_that_combines_it_is_illegal(rng):
    x_np = rng.standard_normal((16, 8)).astype(np.float32)
    m, n = lt.symbols("m n")
    x = lt.Tensor(x_np).to(m, n)
    y = x - x.exp().sum(n)
    tree = y.loop_tree().bind("m", "block.x").bind("n", "thread.x").place("t0", "t1", 2)
    legal, reason = tree.check()
    assert not legal and "buffer t0" in reason and "loop 'n'" in reason


def test_a_thread_bound_reduction_around_loops_over_the_result_is_refused(rng):
    """Found by the GPU random-program test: each thread kept one partial for a loop that updates
    several results, so the combine mixed them (relative error 0.39 on an H100)."""
    x = rng.standard_normal((6, 2)).astype(np.float32)
    d0, d1 = lt.symbols("d0 d1")
    total = lt.Tensor(x).to(d0, d1).sum(d0)
    tree = total.loop_tree().split("d0", 4).reorder("d0.1", "d0.0", "d1").bind("d0.1", "thread.x")
    legal, reason = tree.check()
    assert not legal and "around loops over the result's dims" in reason
    fine = total.loop_tree().split("d0", 4).reorder("d1", "d0.1", "d0.0").bind("d0.1", "thread.x")
    assert fine.check() == (True, "legal")


def test_two_nested_loops_bound_to_one_gpu_axis_are_refused(rng):
    """Found by the GPU tuner's 'rows' family on a bfloat16 product with a bfloat16 result: its k and n
    loops both on thread.x ran only the diagonal on an H100 (relative error 0.99)."""
    c, _ = matmul(rng)
    tree = c.loop_tree().reorder("m", "k", "n").bind("m", "block.x").bind("k", "thread.x").bind("n", "thread.x")
    legal, reason = tree.check()
    assert not legal
    assert "inside loops ['k', 'n'], all bound to thread.x" in reason and "stage t0" in reason
    fine = c.loop_tree().reorder("m", "k", "n").bind("m", "block.x").bind("n", "thread.x")
    assert fine.check() == (True, "legal")


def warp_rows(tensor, lanes: int = 32, placed_at: int = 2):
    """`tensor` (x - x.max(n) over rows m) a warp a row: 4 rows a block on thread.y, n's lanes on thread.x, the max
    placed at `placed_at` of the result's loops (2: in the row's thread.y loop) with its lanes bound the same way."""
    tree = tensor.loop_tree().split("m", 4).split("n", lanes).reorder("m.0", "m.1", "n.1", "n.0") \
        .bind("m.0", "block.x").bind("m.1", "thread.y").bind("n.1", "thread.x").place("t0", "t1", placed_at)
    if placed_at < 2:
        tree = tree.bind("m.1", "thread.y", stage="t0")
    return tree.split("n", lanes, stage="t0").reorder("n.1", "n.0", stage="t0").bind("n.1", "thread.x", stage="t0")


def test_a_reduction_a_warp_a_row_is_combined_in_the_warp_only_where_a_warp_holds_whole_rows_of_threads(rng):
    """Lanes along the row inside a thread.y loop over rows: each lane keeps the warp's total in its own copy of
    the max, so it must be placed in the row's loop, and the block's x extent be a warp or a power-of-two part of
    one (each run of that many lanes of a warp then shares a row)."""
    m, n = lt.symbols("m n")
    x = lt.Tensor(rng.standard_normal((40, 48)).astype(np.float32)).to(m, n)
    y = x - x.max(n)
    assert warp_rows(y).check() == (True, "legal")
    assert warp_rows(y, lanes=16).check() == (True, "legal")
    legal, reason = warp_rows(y, lanes=24).check()
    assert not legal and "needs blocks 32, 16, 8, 4, 2 threads wide along x (a warp, or a power-of-two part of " \
                         "one), but this kernel's are 24" in reason
    legal, reason = warp_rows(y, placed_at=1).check()
    assert not legal and "each lane keeps the warp's total in its own copy of t0, so place t0 inside 'm.1'" in reason


def test_a_buffer_each_thread_keeps_cannot_be_read_in_every_lane_after_lanes_wrote_their_own_parts(rng):
    """exp(x - max) written by each lane for its own elements of the row, then summed by every lane alone: each
    lane's copy holds only its elements."""
    m, n = lt.symbols("m n")
    x = lt.Tensor(rng.standard_normal((40, 48)).astype(np.float32)).to(m, n)
    e = (x - x.max(n)).exp()
    tree = (e / e.sum(n)).loop_tree().share("t1").split("m", 4).split("n", 32).reorder("m.0", "m.1", "n.1", "n.0") \
        .bind("m.0", "block.x").bind("m.1", "thread.y").bind("n.1", "thread.x")
    for stage in ("t0", "t1.e", "t1"):
        tree = tree.place(stage, "t2", 2)
    lanes = tree
    for stage in ("t0", "t1.e"):
        lanes = lanes.split("n", 32, stage=stage).reorder("n.1", "n.0", stage=stage).bind("n.1", "thread.x", stage=stage)
    legal, reason = lanes.check()
    assert not legal and "each thread keeps its own copy of buffer t1.e" in reason
    assert "`t1[m] += t1.e[m, n]` reads it in every lane" in reason
    summed = lanes.split("n", 32, stage="t1").reorder("n.1", "n.0", stage="t1").bind("n.1", "thread.x", stage="t1")
    assert summed.check() == (True, "legal")
