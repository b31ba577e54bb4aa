"""hoist: the factor of a reduction's product that leaves out some of its dims computed once, into a
stage of its own (attention's softmax values, not once for every output column), replayed from JSON,
refused in plain words where there is none. The attention head is lowered as the GPU lowers it (the
softmax inlined into the weighted sum; the CPU's lowering makes it a stage of its own already) and
run on this CPU by `lt.Kernel`."""
import numpy as np
import pytest

import looptool as lt
from looptool import ir
from looptool.schedule import Schedule
from tests.helpers import assert_close


def attention(rng, length=40, width=8):
    q, k, v = (rng.standard_normal((length, width)).astype(np.float32) for _ in range(3))
    i, j, d = lt.symbols("i j d")
    scores = (lt.Tensor(q).to(i, d) * lt.Tensor(k).to(j, d)).sum(d) * 0.5
    e = (scores - scores.max(j)).exp()
    s = q.astype(np.float64) @ k.T.astype(np.float64) * 0.5
    p = np.exp(s - s.max(1, keepdims=True))
    return (e / e.sum(j) * lt.Tensor(v).to(j, d)).sum(j), p / p.sum(1, keepdims=True) @ v


def inlined(out):
    """The loop tree of `out` as the GPU lowers it, and its input arrays."""
    program, arrays = ir.lower(out.node)
    return lt.LoopTree(program), arrays


def test_the_softmax_of_an_attention_head_is_hoisted_out_of_its_weighted_sum(rng):
    out, ref = attention(rng)
    tree, arrays = inlined(out)
    head = tree.program.output.name          # the weighted sum: exp(s - max) / total * v, summed over j
    tree = tree.hoist(head)
    assert tree.check() == (True, "legal")
    hoisted = tree.program.stage(f"{head}.f")
    assert hoisted.dims == ("i", "j") and not hoisted.reduce_dims and "exp" in str(hoisted.expr)
    assert f"{head}[i, d] += ({head}.f[i, j] * in2[j, d])" in str(tree)
    assert_close(lt.Kernel(tree, 1)(arrays), ref, 1e-5)


def test_a_hoisted_schedule_replays_from_json_and_takes_further_steps(rng):
    out, ref = attention(rng)
    tree, arrays = inlined(out)
    head = tree.program.output.name
    plain = tree.program
    tree = tree.hoist(head).place(f"{head}.f", head, 1).split("j", 8, stage=head)
    again = Schedule.from_json(tree.schedule.to_json(), plain)
    assert str(lt.LoopTree(again.program, again)) == str(tree)
    assert tree.check() == (True, "legal")
    assert_close(lt.Kernel(tree, 1)(arrays), ref, 1e-5)


def test_hoist_refuses_a_product_of_plain_loads_and_a_stage_that_is_not_a_product(rng):
    a, b = rng.standard_normal((5, 6)).astype(np.float32), rng.standard_normal((6, 7)).astype(np.float32)
    m, k, n = lt.symbols("m k n")
    c = (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k)
    with pytest.raises(ValueError, match=r"neither factor of stage t0's product is computed"):
        c.loop_tree().hoist("t0")
    with pytest.raises(ValueError, match=r"hoist: stage t0 is not a reduction of a product"):
        lt.Tensor(a).to(m, k).exp().sum(k).loop_tree().hoist("t0")


def test_hoist_comes_before_the_stages_other_steps(rng):
    out, _ = attention(rng)
    tree, _ = inlined(out)
    head = tree.program.output.name
    with pytest.raises(ValueError, match=rf"hoist of stage {head} must come before its other steps"):
        tree.split("j", 4, stage=head).hoist(head)
