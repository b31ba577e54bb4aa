"""epilogue: a pointwise stage computed in the write-back of the accumulator it reads (bias, relu,
scale, cast on the tile of results, no stage of its own), replayed from JSON, refused in words."""
import numpy as np
import pytest

import looptool as lt
from looptool.schedule import Schedule
from tests.helpers import assert_close


def mlp(rng, m=40, k=30, n=24):
    x, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    sm, sk, sn = lt.symbols("m k n")
    y = lt.relu((lt.Tensor(x).to(sm, sk) * lt.Tensor(w).to(sk, sn)).sum(sk) * 0.5 + lt.Tensor(bias).to(sn))
    return y, np.maximum(x.astype(np.float64) @ w * 0.5 + bias, 0)


def test_a_bias_and_relu_run_in_the_write_back_of_a_register_tile(rng):
    y, ref = mlp(rng)
    tree = y.loop_tree().cache_write("t0").split("m", 8, stage="t0").split("n", 8, stage="t0") \
        .reorder("m.0", "n.0", "m.1", "n.1", stage="t0").place("t0.acc", "t0", 2).epilogue("t1")
    assert [st.name for st in tree.program.stages] == ["t0.acc", "t1"]
    assert "t1[m, n] = relu(((t0.acc[m, n] * 0.5) + in2[n]))" in str(tree)
    assert "t0.acc: f32[8, 8] local" in str(tree) and tree.check() == (True, "legal")
    assert_close(y.numpy(tree), ref, 1e-5)
    assert_close(lt.interpret(y, tree), ref, 1e-5)


def test_a_fused_epilogue_replays_from_json(rng):
    y, ref = mlp(rng)
    tree = y.loop_tree().cache_write("t0").split("m", 8, stage="t0").place("t0.acc", "t0", 1).epilogue("t1")
    again = Schedule.from_json(tree.schedule.to_json(), y.loop_tree().program)
    assert str(lt.LoopTree(again.program, again)) == str(tree)
    assert_close(y.numpy(tree), ref, 1e-5)


def test_epilogue_refuses_a_stage_with_no_write_back_and_a_reduction(rng):
    y, _ = mlp(rng)
    with pytest.raises(ValueError, match=r"epilogue: stage t1 reads no accumulator's write-back"):
        y.loop_tree().epilogue("t1")
    with pytest.raises(ValueError, match=r"epilogue: stage t0.acc reduces over \('k',\)"):
        y.loop_tree().cache_write("t0").epilogue("t0.acc")


def test_epilogue_refuses_a_write_back_another_stage_also_reads(rng):
    x = rng.standard_normal((6, 5)).astype(np.float32)
    m, k, n = lt.symbols("m k n")
    s = (lt.Tensor(x).to(m, k) * lt.Tensor(x.T.copy()).to(k, n)).sum(k)
    both = s.exp() + s.sum(n)              # t0 is read by the sum over n as well
    tree = both.loop_tree().cache_write("t0")
    with pytest.raises(ValueError, match="that it alone reads"):
        tree.epilogue(tree.program.output.name)
