"""`ir.split_k`: a contraction's k cut into parts summed by a second stage, checked in the reference
interpreter against float64; and the GPU scheduler's choice of parts (`autoschedule.gpu.split_k_parts`)."""
import numpy as np
import pytest

import looptool as lt
from looptool import ir
from looptool.autoschedule import gpu as templates
from looptool.autoschedule import gpu_rules
from looptool.analysis.gpu_target import GpuTarget
from looptool.runtime.interpreter import interpret
from looptool.schedule import LoopTree
from tests.helpers import assert_close


def matmul(rng, m, k, n, transposed=False):
    sm, sk, sn = lt.symbols("m k n")
    a = rng.standard_normal((k, m) if transposed else (m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    left = lt.Tensor(a).to(sk, sm) if transposed else lt.Tensor(a).to(sm, sk)
    c = (left * lt.Tensor(b).to(sk, sn)).sum(sk)
    a64 = a.T.astype(np.float64) if transposed else a.astype(np.float64)
    return c, a64 @ b


def viewed(array, buffer):
    return np.lib.stride_tricks.as_strided(array, buffer.shape, [s * array.itemsize for s in buffer.strides])


@pytest.mark.parametrize("transposed", [False, True])
def test_split_k_sums_each_part_then_the_parts(rng, transposed):
    c, ref = matmul(rng, 37, 60, 29, transposed)
    program, arrays = ir.lower(c.node)
    split = ir.split_k(program, 3)
    assert [st.name for st in split.stages] == ["t0.part", "t0"]
    assert split.stage("t0.part").dims == ("k_o", "m", "n") and split.stage("t0").reduce_dims == ("k_o",)
    got = interpret(LoopTree(split), [viewed(a, b) for a, b in zip(arrays, split.inputs)])
    assert_close(got, ref, 1e-5)
    tree = gpu_rules.gpu_tree(split, GpuTarget("sm_90", 132))
    assert tree.check() == (True, "legal")
    assert_close(interpret(tree, [viewed(a, b) for a, b in zip(arrays, split.inputs)]), ref, 1e-5)


def test_split_k_refuses_what_it_cannot_cut(rng):
    c, _ = matmul(rng, 8, 10, 6)
    program, _ = ir.lower(c.node)
    assert ir.split_k(program, 3) is None            # 3 does not divide 10
    sm, sn = lt.symbols("m n")
    row_max = lt.Tensor(rng.standard_normal((4, 6)).astype(np.float32)).to(sm, sn).max(sn)
    assert ir.split_k(ir.lower(row_max.node)[0], 2) is None           # only sums are cut


@pytest.mark.parametrize("m, k, n, sms, parts", [(1000, 1500, 777, 132, 5), (4096, 4096, 4096, 132, 1),
                                                  (1000, 1500, 777, 16, 1), (1000, 300, 777, 132, 1),
                                                  (260, 1024, 100, 132, 4)])
def test_float32_contractions_with_fewer_blocks_than_sms_are_split(rng, m, k, n, sms, parts):
    """1000x777 gives 104 blocks of 128 x 64: k = 1500 cut in 5, the most parts of at least 256 (520 blocks,
    short of SPLIT_K_BLOCKS an SM of 132); 4096^2 fills the
    GPU; a GPU of 16 SMs is filled; k = 300 is too short to cut into parts of SPLIT_K_RUN; 6 blocks of
    260x100 never reach 2 an SM: k = 1024 is cut into the most parts allowed."""
    sm, sk, sn = lt.symbols("m k n")
    program = ir.Program((ir.Buffer("in0", ("m", "k"), (m, k), "float32", (k, 1)),
                          ir.Buffer("in1", ("k", "n"), (k, n), "float32", (n, 1))),
                         ir.lower((lt.Tensor(np.zeros((2, 3), np.float32)).to(sm, sk)
                                   * lt.Tensor(np.zeros((3, 2), np.float32)).to(sk, sn)).sum(sk).node)[0].stages,
                         (("k", k), ("m", m), ("n", n)))
    assert templates.split_k_parts(program, sms) == parts


def test_a_dot_product_is_left_to_the_reduction_rules(rng):
    sc = lt.symbols("c")[0]
    x, y = (rng.standard_normal(100_000).astype(np.float32) for _ in range(2))
    dot = (lt.Tensor(x).to(sc) * lt.Tensor(y).to(sc)).sum(sc)
    assert templates.split_k_parts(ir.lower(dot.node)[0], 132) == 1
