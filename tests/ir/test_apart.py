"""`ir.weights_apart`: an attention head as its softmax weights and their weighted sum, two programs,
checked by running both in the reference interpreter against float64; and when the GPU rules ask for it."""
import dataclasses

import numpy as np

import looptool as lt
from looptool import ir
from looptool.analysis.gpu_target import assumed_gpu
from looptool.autoschedule import gpu_rules
from looptool.runtime.interpreter import interpret
from looptool.schedule import LoopTree
from tests.helpers import assert_close


def attention_head(rng, length, width, v_first=False):
    q, k, v = (rng.standard_normal((length, width)).astype(np.float32) for _ in range(3))
    i, j, d = lt.symbols("i j d")
    scores = (lt.Tensor(q).to(i, d) * lt.Tensor(k).to(j, d)).sum(d) * width ** -0.5
    e = (scores - scores.max(j)).exp()
    weights, values = e / e.sum(j), lt.Tensor(v).to(j, d)
    head = ((values * weights) if v_first else (weights * values)).sum(j)
    s = q.astype(np.float64) @ k.T.astype(np.float64) * width ** -0.5
    p = np.exp(s - s.max(1, keepdims=True))
    return head, p / p.sum(1, keepdims=True) @ v


def test_an_attention_head_is_its_weights_then_their_weighted_sum(rng):
    for v_first in (False, True):
        head, ref = attention_head(rng, 40, 8, v_first)
        program, arrays = ir.lower(head.node)
        apart = ir.weights_apart(program)
        assert apart is not None and sorted(apart.inputs + (apart.other,)) == [0, 1, 2]
        assert program.inputs[apart.other].dims == ("j", "d")                # v, which the weights do not read
        assert set(apart.first.output.dims) == {"i", "j"} and not apart.first.output.reduce_dims
        weights = interpret(LoopTree(apart.first), [arrays[index] for index in apart.inputs])
        assert apart.product.inputs[0].shape == weights.shape == (40, 40)
        got = interpret(LoopTree(apart.product), [weights, arrays[apart.other]])
        assert_close(got if program.output.dims == ("i", "d") else got.T, ref, 1e-5)


def test_programs_that_end_otherwise_stay_whole(rng):
    i, j, d = lt.symbols("i j d")
    a, b = rng.standard_normal((6, 5)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    matmul = (lt.Tensor(a).to(i, j) * lt.Tensor(b).to(j, d)).sum(j)
    assert ir.weights_apart(ir.lower(matmul.node)[0]) is None        # one stage: nothing computes its factor
    x = lt.Tensor(a).to(i, j)
    softmax = (x - x.max(j)).exp() / (x - x.max(j)).exp().sum(j)
    assert ir.weights_apart(ir.lower(softmax.node)[0]) is None       # no weighted sum at the end


def test_the_gpu_rules_run_the_weighted_sum_apart_where_walking_it_in_the_rows_reads_too_much(rng):
    """1024 rows of a 1024 x 64 v walked in the rows read 256 MiB: 2 MiB an SM of an H100 (fused); 2048 rows
    of a 2048 x 128 v, 2 GiB: 15.5 MiB an SM, over WALK_BYTES_PER_SM, so apart."""
    h100 = assumed_gpu("sm_90")
    for length, width, sms, apart in [(1024, 64, 132, False), (2048, 128, 132, True), (1024, 64, 8, True)]:
        program = ir.lower(attention_head(rng, length, width)[0].node)[0]
        chosen = gpu_rules.weights_apart(program, dataclasses.replace(h100, sms=sms))
        assert (chosen is not None) == apart, (length, width, sms)
