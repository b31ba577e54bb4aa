"""Temps kept in blocks (`LoopTree.block`): a temp laid out (k, b) over a dynamic b stores b in blocks of a
fixed size, (ceil(B / size), k, size), so its strides stay fixed. Each access must keep its place within
one block in loops that stay inside a block (the legality check refuses one that does not, in words); a
copy of such a temp placed inside its reader's blocks takes the last block's rows past B (inside the
temp's memory) without a guard. Run on this CPU against float64 at sizes on and off the block."""
import json

import numpy as np
import pytest

import looptool as lt
from looptool.runtime import gpu as runtime_gpu
from looptool.runtime.cpu import lower_on_host
from looptool.schedule import LoopTree, Schedule
from tests.helpers import assert_close

b = lt.symbols("b", dynamic=True)[0]
k, n = lt.symbols("k n")


def transposed_layer(rows, rng):
    """relu(x @ w) over dynamic rows, x copied ahead as (k, b): the program and its float64 result."""
    x = rng.standard_normal((rows, 24)).astype(np.float32)
    w = rng.standard_normal((24, 40)).astype(np.float32)
    c = lt.relu((lt.Tensor(x).to(b, k) * lt.Tensor(w).to(k, n)).sum(k))
    program, arrays = lower_on_host(c.node)
    tree = LoopTree(program).cache("in0", stage="t0", order=("k", "b"))
    return tree, arrays, np.maximum(x.astype(np.float64) @ w, 0)


def test_a_dynamic_dim_kept_in_blocks_gives_the_temp_fixed_strides(rng):
    tree, _, _ = transposed_layer(5, rng)
    with pytest.raises(lt.IllegalScheduleError, match=r"dynamic dim 'b' must be its first axis"):
        tree.assert_legal()
    blocked = tree.block("b", 16, stage="in0.t0")
    plan = blocked.buffers["in0.t0"]
    assert (plan.strides, plan.block) == ((16, 1), ("b", 16, 24 * 16))
    assert str(plan.storage_shape[0]) == "ceil(B/16)" and plan.storage_shape[1:] == (24, 16)
    assert "in0.t0: f32[24, B] temp, b in blocks of 16" in str(blocked)


@pytest.mark.parametrize("rows", [1, 15, 16, 17, 100])
def test_a_blocked_temp_read_and_written_within_blocks_gives_numpys_result(rng, rows):
    tree, arrays, ref = transposed_layer(rows, rng)
    tree = tree.block("b", 16, stage="in0.t0").split("b", 16, stage="in0.t0").split("b", 16, stage="t0")
    assert tree.check() == (True, "legal")
    assert_close(lt.Kernel(tree, 1)(arrays), ref, 1e-5)


def test_an_access_that_leaves_its_block_within_its_loops_is_refused_in_words(rng):
    tree, _, _ = transposed_layer(5, rng)
    tree = tree.block("b", 16, stage="in0.t0").split("b", 8, stage="in0.t0").split("b", 16, stage="t0")
    legal, reason = tree.check()
    assert not legal
    assert "buffer in0.t0 keeps dim 'b' in blocks of 16, but stage in0.t0 reaches it at 8*b.0 + b.1 within a " \
           "block and loop b.0, whose extent is known only at run time, moves it: split its loops over 'b' by 16 " \
           "first" in reason
    wide, _, _ = transposed_layer(5, rng)
    legal, reason = wide.block("b", 16, stage="in0.t0").split("b", 32, stage="in0.t0").split("b", 16, stage="t0") \
        .check()
    assert not legal and "reaches it at b.1 within a block and its loops take it from 0 to 31" in reason


def test_block_refuses_the_result_a_dim_it_lacks_and_a_second_block(rng):
    tree, _, _ = transposed_layer(5, rng)
    with pytest.raises(ValueError, match="block: stage t1 is the program's result"):
        tree.block("b", 16, stage="t1")
    with pytest.raises(ValueError, match=r"block of stage in0.t0: 'n' must be one of its dims \('k', 'b'\)"):
        tree.block("n", 16, stage="in0.t0")
    with pytest.raises(ValueError, match="a stage takes one block"):
        tree.block("b", 16, stage="in0.t0").block("k", 8, stage="in0.t0")
    with pytest.raises(ValueError, match="size must be a positive integer, got 0"):
        tree.block("b", 0, stage="in0.t0")


def test_a_blocked_schedule_replays_from_json(rng):
    tree, _, _ = transposed_layer(5, rng)
    tree = tree.block("b", 16, stage="in0.t0")
    original = lower_on_host(lt.relu((lt.Tensor(np.ones((5, 24), np.float32)).to(b, k)
                                      * lt.Tensor(np.ones((24, 40), np.float32)).to(k, n)).sum(k)).node)[0]
    again = Schedule.from_json(tree.schedule.to_json(), original)
    assert any(step[0] == "block" for step in json.loads(tree.schedule.to_json())["steps"])
    assert again.of("in0.t0").blocks == (("b", 16),)


@pytest.mark.parametrize("rows", [1, 127, 128, 129, 300])
def test_the_gpu_register_tiles_over_dynamic_rows_read_a_blocked_copy_of_a_unguarded(rng, rows):
    """The float32 template transposes A ahead into (ceil(B/128), k, 128): its k tiles are then copied
    into shared memory whole, as for fixed rows (no guard at B: session 19 on an H100, 8192 rows, the
    guarded copies ran the product at 0.91x the static kernel, whole ones at 0.99x)."""
    x = rng.standard_normal((rows, 96)).astype(np.float32)
    w = rng.standard_normal((96, 200)).astype(np.float32)
    c = lt.relu((lt.Tensor(x).to(b, k) * lt.Tensor(w).to(k, n)).sum(k))
    program, arrays = lower_on_host(c.node)
    tree = runtime_gpu.automatic_tree(program, "sm_90")
    assert tree.check() == (True, "legal")
    text = str(tree)
    assert "in0.t0: f32[96, B] temp, b in blocks of 128" in text
    copy = text[text.index("in0.t0.t0.acc: f32"):text.index("in0.t0.t0.acc[k, b] = in0.t0[k, b]")]
    assert "< B" not in copy
    assert_close(lt.Kernel(tree, 1)(arrays), np.maximum(x.astype(np.float64) @ w, 0), 1e-5)
