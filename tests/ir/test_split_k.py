"""`ir.split_k`: a contraction's k cut into parts summed by a second stage, checked in the reference
interpreter against float64; and the GPU scheduler's choice of parts (`autoschedule.gpu.split_k_parts`)."""
import numpy as np
import pytest

import looptool as lt
from looptool import ir
from looptool.autoschedule import gpu as templates
from looptool.autoschedule import gpu_rules
from looptool.codegen import gpu as codegen_gpu
from looptool.analysis.gpu_target import GpuTarget
from looptool.runtime.interpreter import interpret
from looptool.schedule import LoopTree
from tests.helpers import assert_close, viewed


def matmul(rng, m, k, n, transposed=False):
    sm, sk, sn = lt.symbols("m k n")
    a = rng.standard_normal((k, m) if transposed else (m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    left = lt.Tensor(a).to(sk, sm) if transposed else lt.Tensor(a).to(sm, sk)
    c = (left * lt.Tensor(b).to(sk, sn)).sum(sk)
    a64 = a.T.astype(np.float64) if transposed else a.astype(np.float64)
    return c, a64 @ b


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
    x = lt.Tensor(rng.standard_normal((4, 6)).astype(np.float32)).to(sm, sn)
    softmax_like = (x * lt.Tensor(rng.standard_normal((6, 6)).astype(np.float32)).to(sn, lt.symbols("o")[0])) \
        .sum(sn).max(lt.symbols("o")[0])
    assert ir.split_k(ir.lower(softmax_like.node)[0], 2) is None      # what follows the sum must be pointwise
    uses_x_again = (x * x).sum(sn) + x.sum(sn)
    assert ir.split_k(ir.lower(uses_x_again.node)[0], 2) is None


def test_a_contraction_followed_by_a_reduction_is_not_split(rng):
    """A head's scores then their row max (k = 4096 long, a few blocks): the GPU's choice of parts asks
    `ir.splittable` first, so it gives 1 instead of parts that `ir.split_k` then refuses."""
    sm, sk, sn = lt.symbols("m k n")
    for dtype in (np.float32, lt.bfloat16):
        x = lt.Tensor(rng.standard_normal((64, 4096)).astype(dtype)).to(sm, sk)
        scores = (x * lt.Tensor(rng.standard_normal((4096, 64)).astype(dtype)).to(sk, sn)).sum(sk)
        program = ir.lower(scores.max(sn).node)[0]
        assert not ir.splittable(program) and templates.split_k_parts(program, 132) == 1
        assert templates.split_k_parts(ir.lower(scores.node)[0], 132) > 1


def test_split_k_keeps_an_epilogue_after_the_parts_are_summed(rng):
    """relu(x @ w + bias) in bfloat16: the parts, their sum, then the epilogue as it was, on wgmma tiles
    (the parts' sum computed in the epilogue's threads: one kernel after the parts) and run on this CPU
    against float64."""
    sm, sk, sn = lt.symbols("m k n")
    a = rng.standard_normal((128, 2048)).astype(lt.bfloat16)
    b = rng.standard_normal((2048, 136)).astype(lt.bfloat16)
    bias = rng.standard_normal(136).astype(np.float32)
    layer = lt.relu((lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk) + lt.Tensor(bias).to(sn))
    program, arrays = ir.lower(layer.node)
    split = ir.split_k(program, templates.split_k_parts(program, 132))
    assert [st.name for st in split.stages] == ["t0.part", "t0", "t1"] and split.stage("t1") == program.stage("t1")
    tree = gpu_rules.gpu_tree(split, GpuTarget("sm_90", 132))
    assert tree.check() == (True, "legal") and "t0.part: a contraction: wgmma tensor-core tiles" in tree.explain()
    assert "t0: its k_o terms summed in t1's threads" in tree.explain()
    assert len(codegen_gpu.generate(tree, "sm_90").launches) == 2
    got = lt.Kernel(tree, 1)([viewed(x, buffer) for x, buffer in zip(arrays, split.inputs)])
    assert_close(got, np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0), 1e-5)


@pytest.mark.parametrize("m, k, n, sms, parts", [(1000, 1500, 777, 132, 5), (4096, 4096, 4096, 132, 1),
                                                  (1000, 1500, 777, 16, 3), (1000, 300, 777, 132, 3),
                                                  (333, 444, 555, 132, 3),
                                                  (260, 1024, 100, 132, 8), (1024, 1024, 1024, 132, 1),
                                                  (64, 8192, 64, 132, 128), (1000, 100, 777, 132, 1), (1536, 1536, 1536, 132, 6),
                                                  (8192, 8192, 8192, 132, 1), (1000, 1536, 777, 132, 2)])
def test_float32_contractions_with_fewer_blocks_than_sms_are_split(rng, m, k, n, sms, parts):
    """The parts and block of least modelled time (`float32_cost`): 1000x777 gives 104 blocks of 128 x 64: k =
    1500 cut in 5 (520 blocks, 4 an SM of 132; 6 parts of 250 would start off 16-byte vectors:
    `aligned_first`); 4096^2 fills the GPU; on a GPU of 16 SMs, 1000x777 in 3 parts (6.5 waves whole, but its
    rows of 777 are padded when whole: `whole_rows`); k = 300 in 3 parts of 100 (padded when whole too); 333x555: k = 444 in 3 parts of 148; 260x100 in 8
    parts of 128 (16 parts of 64 double the blocks an SM for runs half as long); one block of 64x64 with k =
    8192: 128 parts; k = 100 is too short to cut into parts of 64; 1024^2 in 2 parts is modelled under
    SPLIT_K_GAIN faster than whole; 1536^3 in 6 parts of 128 x 128 (864 blocks, 6.5 an SM, against 576 of 64 x
    64 whole, 4.4 an SM: its last wave 36 % full); 8192^3 whole; 1000x1536x777 in 2 parts (padded when whole)."""
    sm, sk, sn = lt.symbols("m k n")
    program = ir.Program((ir.Buffer("in0", ("m", "k"), (m, k), "float32", (k, 1)),
                          ir.Buffer("in1", ("k", "n"), (k, n), "float32", (n, 1))),
                         matmul_stages(np.float32), (("k", k), ("m", m), ("n", n)))
    assert templates.split_k_parts(program, sms) == parts


@pytest.mark.parametrize("m, k, n, block", [(8192, 8192, 8192, (128, 128)), (1024, 1024, 1024, (128, 64)),
                                              (2048, 2048, 2048, (128, 128)), (1000, 1500, 777, (128, 64)),
                                              (1536, 1536, 1536, (128, 128)), (257, 2048, 129, (64, 64))])
def test_a_float32_product_takes_the_block_of_least_modelled_time(m, k, n, block):
    """The register-tile block of the product as `.cuda()` runs it (cut into `split_k_parts` parts): 8192^3 on
    128 x 128 (the outputs-an-SM count it replaced chose 64 x 64: 125 waves of 4096 outputs against 32 of
    16384, 0.73x torch on an H100), 1024^3 whole on 128 x 64 (128 blocks, one wave), 1536^3 in 6 parts on
    128 x 128, the small 257x129 on 64 x 64 (`autoschedule.gpu.float32_cost`)."""
    program = ir.Program((ir.Buffer("in0", ("m", "k"), (m, k), "float32", (k, 1)),
                          ir.Buffer("in1", ("k", "n"), (k, n), "float32", (n, 1))),
                         matmul_stages(np.float32), (("k", k), ("m", m), ("n", n)))
    parts = templates.split_k_parts(program, 132)
    split = ir.split_k(program, parts) if parts > 1 else program
    assert templates.float32_block(split, split.stages[0].name, 132) == block


@pytest.mark.parametrize("m, k, n, hopper, parts", [(768, 3072, 768, True, 3), (256, 16384, 256, True, 16),
                                                    (128, 2048, 136, True, 2), (4096, 4096, 4096, True, 1),
                                                    (1024, 1024, 1024, True, 1), (1000, 3000, 1000, True, 1),
                                                    (3072, 2048, 1024, True, 1), (768, 3072, 768, False, 3)])
def test_half_precision_contractions_with_fewer_blocks_than_sms_are_split_in_whole_k_tiles(m, k, n, hopper, parts):
    """768^2 gives 36 wgmma blocks of 128 x 128, and its parts 18 of 128 x 256 each (the parts' program
    chooses again): k = 3072 cut in 3, the most parts of at least HALF_SPLIT_K_RUN (54 blocks, short of one
    an SM of 132); 256^2 takes 4 blocks, 16 parts of 1024 (64 blocks); 4096^2 fills the GPU; 1024^2 (64
    blocks) has k too short for two parts; k = 3000 has no part of whole 64-deep k tiles; 3072x1024's 96
    blocks of 128 x 256 keep 73 % of the SMs busy, at least HALF_SPLIT_K_BUSY; without wgmma, mma's 18
    blocks of 128 x 256."""
    program = ir.Program((ir.Buffer("in0", ("m", "k"), (m, k), "bfloat16", (k, 1)),
                          ir.Buffer("in1", ("k", "n"), (k, n), "bfloat16", (n, 1))),
                         matmul_stages("bfloat16"), (("k", k), ("m", m), ("n", n)))
    assert templates.split_k_parts(program, 132, hopper) == parts


def matmul_stages(dtype):
    sm, sk, sn = lt.symbols("m k n")
    return ir.lower((lt.Tensor(np.zeros((2, 3), dtype)).to(sm, sk) * lt.Tensor(np.zeros((3, 2), dtype)).to(sk, sn))
                    .sum(sk).node)[0].stages


def test_a_split_half_precision_product_runs_its_parts_on_wgmma_tiles(rng):
    """The parts: a batch of wgmma products (the split inputs' views read by TMA), summed by a second
    kernel; run on this CPU against float64."""
    sm, sk, sn = lt.symbols("m k n")
    a = rng.standard_normal((128, 2048)).astype(lt.bfloat16)
    b = rng.standard_normal((2048, 136)).astype(lt.bfloat16)
    program, arrays = ir.lower((lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk).node)
    split = ir.split_k(program, templates.split_k_parts(program, 132))
    tree = gpu_rules.gpu_tree(split, GpuTarget("sm_90", 132))
    assert tree.check() == (True, "legal") and split.stage("t0.part").dims == ("k_o", "m", "n")
    assert "t0.part: a contraction: wgmma tensor-core tiles" in tree.explain()
    got = lt.Kernel(tree, 1)([viewed(x, buffer) for x, buffer in zip(arrays, split.inputs)])
    assert_close(got, a.astype(np.float64) @ b.astype(np.float64), 1e-5)


def test_a_dot_product_is_left_to_the_reduction_rules(rng):
    sc = lt.symbols("c")[0]
    x, y = (rng.standard_normal(100_000).astype(np.float32) for _ in range(2))
    dot = (lt.Tensor(x).to(sc) * lt.Tensor(y).to(sc)).sum(sc)
    assert templates.split_k_parts(ir.lower(dot.node)[0], 132) == 1


def test_a_dynamic_batch_keeps_its_dim_first_and_the_parts_after_it(rng):
    """relu(x @ w) over a dynamic batch b: the parts go after b in the split view of x and in the parts'
    result (no stride depends on the batch's size); the GPU's choice plans at 256 rows; the split program
    runs at other batches (the interpreter, at each size fixed) and its GPU tree is legal for every size."""
    b, = lt.symbols("b", dynamic=True)
    k, n = lt.symbols("k n")
    x, w = rng.standard_normal((256, 1024)).astype(np.float32), rng.standard_normal((1024, 64)).astype(np.float32)
    program, _ = ir.lower(lt.relu((lt.Tensor(x).to(b, k) * lt.Tensor(w).to(k, n)).sum(k)).node, planned={"b": 256})
    parts = templates.split_k_parts(program, 132)
    split = ir.split_k(program, parts)
    assert parts == 4 and split.dynamic == program.dynamic   # (DYNAMIC_SPLIT_K_RUN; static: 16 parts of 64)
    assert split.inputs[0].dims == ("b", "k_o", "k_i") and split.inputs[0].strides == (1024, 256, 1)
    assert split.stage("t0.part").dims == ("b", "k_o", "n")
    tree = gpu_rules.gpu_tree(split, GpuTarget("sm_90", 132))
    assert tree.check() == (True, "legal")
    assert "in0.t0.part" not in [st.name for st in tree.program.stages]      # dynamic rows: x not transposed ahead
    for rows in (1, 37, 300):
        fixed = ir.with_fixed_sizes(split, {"b": rows})
        xs = rng.standard_normal((rows, 1024)).astype(np.float32)
        got = interpret(LoopTree(fixed), [viewed(xs, fixed.inputs[0]), viewed(w, fixed.inputs[1])])
        assert_close(got, np.maximum(xs.astype(np.float64) @ w, 0), 1e-5)
