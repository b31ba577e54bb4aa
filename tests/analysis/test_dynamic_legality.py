"""The isl check over dynamic sizes (issue 28): a schedule is proved for every size of a dynamic dim at
once (an isl parameter, at least the dim's minimum), and a schedule that breaks for some sizes is
refused naming the smallest size at which it breaks."""
import numpy as np
import pytest

import looptool as lt


def column_sums(minimum: int = 1) -> lt.LoopTree:
    """t0[k] = sum over dynamic b of x[b, k]."""
    b = lt.symbols("b", dynamic=True, min=minimum)[0]
    k = lt.symbols("k")[0]
    x = np.zeros((max(minimum, 3), 8), np.float32)
    return lt.Tensor(x).to(b, k).sum(b).loop_tree()


def test_a_parallel_reduction_over_a_dynamic_dim_breaks_from_two_rows():
    legal, reason = column_sums().parallel("b").check()
    assert not legal
    assert "loop 'b' cannot be parallel" in reason and "when b = 2 (the smallest dynamic size at which it breaks)" \
        in reason


def test_the_size_named_is_the_smallest_that_breaks_the_schedule():
    legal, reason = column_sums().split("b", 8).parallel("b.0").check()     # one block of 8 rows: legal up to 8
    assert not legal and "when b = 9 " in reason
    legal, reason = column_sums(minimum=5).split("b", 4).parallel("b.0").check()
    assert not legal and "when b = 5 " in reason                         # sizes start at the minimum


def test_the_same_schedule_at_a_fixed_size_where_it_holds_is_legal():
    k = lt.symbols("k")[0]
    one = lt.symbols("b")[0]
    fixed = lt.Tensor(np.zeros((8, 8), np.float32)).to(one, k).sum(one).loop_tree()
    assert fixed.split("b", 8).parallel("b.0").check() == (True, "legal")   # one iteration of b.0
    with pytest.raises(lt.IllegalScheduleError, match="when b = 9"):
        column_sums().split("b", 8).parallel("b.0").assert_legal()


def test_schedules_legal_for_every_size_pass():
    tree = column_sums().split("b", 8).split("k", 4).reorder("k.0", "b.0", "b.1", "k.1").parallel("k.0")
    assert tree.check() == (True, "legal")
    assert tree.split("b.0", 3).vectorize("k.1").check() == (True, "legal")


def test_a_placed_buffer_cannot_hold_a_whole_dynamic_dim():
    b = lt.symbols("b", dynamic=True)[0]
    k, n = lt.symbols("k n")
    x, w = np.zeros((4, 8), np.float32), np.zeros((8, 6), np.float32)
    tree = (lt.Tensor(x).to(b, k) * lt.Tensor(w).to(k, n)).sum(k).loop_tree().reorder("k", "b", "n")
    legal, reason = tree.cache("in0").place("in0.t0", "t0", 1).check()
    assert not legal and "holds all of dynamic dim 'b'" in reason
    tiled = tree.split("b", 4).reorder("b.0", "k", "b.1", "n").cache("in0").place("in0.t0", "t0", 1)
    assert tiled.check() == (True, "legal")
    legal, reason = tree.cache("in0", order=("k", "b")).check()
    assert not legal and "must be its first axis" in reason
