"""inline: a pointwise stage computed where it is read, with no buffer of its own (the zero-padded
operand copies of `pad`, which TMA then fills on Hopper); replayed from JSON, refused in plain words
where the stage reduces, is the result, or has been reshaped already."""
import numpy as np
import pytest

import looptool as lt
from looptool.schedule import Schedule
from tests.helpers import assert_close


@pytest.fixture
def odd_matmul(rng):
    a = rng.standard_normal((13, 7)).astype(np.float32)
    b = rng.standard_normal((7, 5)).astype(np.float32)
    m, k, n = lt.symbols("m k n")
    return (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k), a.astype(np.float64) @ b


def test_inlined_pad_copies_leave_a_product_of_zero_filled_reads(odd_matmul):
    c, ref = odd_matmul
    tree = c.loop_tree().pad({"m": 8, "n": 8, "k": 4}).inline("in0.t0.pad").inline("in1.t0.pad")
    names = [st.name for st in tree.program.stages]
    assert names == ["t0.pad", "t0"] and tree.check() == (True, "legal")
    assert "(in0[m_p, k_p] if 0 <= m_p < 13 and 0 <= k_p < 7 else 0.0)" in str(tree)
    assert_close(c.numpy(tree), ref, 1e-5)
    program = c.loop_tree().program
    assert str(lt.LoopTree(program, Schedule.from_json(tree.schedule.to_json(), program))) == str(tree)


def test_inline_refuses_reductions_the_result_and_reshaped_stages(odd_matmul):
    c, _ = odd_matmul
    padded = c.loop_tree().pad({"m": 8})
    with pytest.raises(ValueError, match=r"inline: stage t0.pad reduces over \('k',\)"):
        padded.inline("t0.pad")
    with pytest.raises(ValueError, match="inline: stage t0 is the result"):
        padded.inline("t0")
    with pytest.raises(ValueError, match="inline of stage in0.t0.pad must come before its other steps"):
        padded.split("m_p", 4, stage="in0.t0.pad").inline("in0.t0.pad")
