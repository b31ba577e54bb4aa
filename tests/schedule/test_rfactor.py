"""rfactor: a reduction split into a stage of independent partial results and a stage that reduces them,
with ragged last blocks, every reduce op, replay from JSON, and refusals in plain words."""
import numpy as np
import pytest

import looptool as lt
from looptool.schedule import Schedule
from tests.helpers import assert_close


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("size, factor", [(1001, 64), (64, 64), (7, 3), (5, 100)])
def test_rfactor_gives_the_same_result_for_every_op_and_block(rng, op, size, factor):
    x = rng.standard_normal((size, 6)).astype(np.float32)
    m, n = lt.symbols("m n")
    total = getattr(lt.Tensor(x).to(m, n), op)(m)
    tree = total.loop_tree().rfactor("m", factor)
    assert tree.check() == (True, "legal")
    assert tree.program.size("m_o") == -(-size // min(factor, size)) and "t0.rf" in str(tree)
    assert_close(total.numpy(tree), getattr(x.astype(np.float64), op)(axis=0), 1e-5)
    assert_close(lt.interpret(total, tree), getattr(x.astype(np.float64), op)(axis=0), 1e-5)


def test_an_rfactored_schedule_replays_from_json_and_takes_further_steps(rng):
    a, b = rng.standard_normal((20, 300)).astype(np.float32), rng.standard_normal((300, 9)).astype(np.float32)
    m, k, n = lt.symbols("m k n")
    c = (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k)
    tree = c.loop_tree().rfactor("k", 32).split("k_i", 8, stage="t0.rf").reorder("k_o", "m", stage="t0.rf")
    again = Schedule.from_json(tree.schedule.to_json(), c.loop_tree().program)
    assert str(lt.LoopTree(again.program, again)) == str(tree)
    assert_close(c.numpy(tree), a.astype(np.float64) @ b, 1e-5)


def test_rfactor_names_a_fresh_dim_when_its_name_is_taken(rng):
    x = rng.standard_normal((10, 4)).astype(np.float32)
    m, m_o = lt.symbols("m m_o")
    total = lt.Tensor(x).to(m, m_o).sum(m)
    tree = total.loop_tree().rfactor("m", 4)
    assert "m_o1" in dict(tree.program.sizes)
    assert_close(total.numpy(tree), x.astype(np.float64).sum(0), 1e-5)


def test_rfactor_refuses_what_it_cannot_split(rng):
    x = rng.standard_normal((10, 4)).astype(np.float32)
    m, n = lt.symbols("m n")
    total = lt.Tensor(x).to(m, n).sum(m)
    with pytest.raises(ValueError, match="n is not a reduction dim of stage t0"):
        total.loop_tree().rfactor("n", 2)
    with pytest.raises(ValueError, match="rfactor of stage t0 must come before its other steps"):
        total.loop_tree().split("m", 2).rfactor("m", 2)
    with pytest.raises(ValueError, match="factor must be a positive integer"):
        total.loop_tree().rfactor("m", 0)
    with pytest.raises(ValueError, match="already reduces through t0.rf"):
        total.loop_tree().rfactor("m", 2).rfactor("m_o", 2)


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"])
def test_pad_computes_a_contraction_on_zero_padded_operands(rng, dtype):
    import ml_dtypes
    dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    a, b = rng.standard_normal((100, 70)).astype(dtype), rng.standard_normal((70, 45)).astype(dtype)
    m, k, n = lt.symbols("m k n")
    c = (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k)
    tree = c.loop_tree().pad({"m": 16, "n": 8, "k": 16})
    assert tree.check() == (True, "legal")
    assert tree.buffers["in0.t0.pad"].shape == (112, 80) and tree.buffers["t0.pad"].shape == (112, 48)
    assert_close(c.numpy(tree), a.astype(np.float64) @ b.astype(np.float64), 1e-5)
    again = Schedule.from_json(tree.schedule.to_json(), c.loop_tree().program)
    assert str(lt.LoopTree(again.program, again)) == str(tree)


def test_pad_refuses_what_zeros_cannot_pad(rng):
    x = rng.standard_normal((10, 4)).astype(np.float32)
    m, n = lt.symbols("m n")
    with pytest.raises(ValueError, match="zeros pad only a sum"):
        lt.Tensor(x).to(m, n).max(m).loop_tree().pad({"m": 8})
    with pytest.raises(ValueError, match="must map its dims"):
        lt.Tensor(x).to(m, n).sum(m).loop_tree().pad({"q": 8})
