"""The rules for stages with no register reuse (issue #27), each from the target's facts and tested on fake
AVX2 and AVX-512 targets: a reduction over an outer dim keeps a block of accumulators in L1; a transpose
is vectorized along its contiguous store, one register of gathered lanes, the gathered dim blocked for L1;
a reduction vectorizes the dim its streamed loads are contiguous along, not one it reads once per result.
Every schedule is also run and checked against float64."""
import numpy as np
import pytest

import looptool as lt
from looptool.autoschedule import auto_tree
from looptool.runtime import lower_on_host
from tests.autoschedule.test_rules import fake
from tests.helpers import assert_close

TARGETS = {"avx2": dict(registers=16, bits=256), "avx512": dict(registers=32, bits=512)}


def loops(tree, stage="t0") -> dict:
    return {lp.name: (lp.extent, lp.annotation) for lp in tree.schedule.of(stage).loops}


def order(tree, stage="t0") -> list:
    return [lp.name for lp in tree.schedule.of(stage).loops]


def outer_max(rows=64, cols=16384):
    x = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
    m, n = lt.symbols("m n")
    return lt.Tensor(x).to(m, n).max(m), x.astype(np.float64).max(0)


@pytest.mark.parametrize("kind", TARGETS)
@pytest.mark.parametrize("cores", [1, 2, 8])
def test_an_outer_reduction_keeps_half_of_l1_of_accumulators_one_block_a_core_at_least(kind, cores):
    c, ref = outer_max(cols=8192)
    target = fake(cores=cores, l1=32 * 1024, **TARGETS[kind])
    tree = auto_tree(lower_on_host(c.node)[0], target)
    lanes = target.lanes("float32")
    found = loops(tree)
    block = 8192 // found["n.0"][0]
    assert block == min(32 * 1024 // 2 // 4, 8192 // cores)          # 16 KiB of accumulators, or a core's share
    assert order(tree) == ["n.0", "m", "n.1.0", "n.1.1"] and found["n.1.1"] == (4 * lanes, "vectorize")
    assert (found["n.0"][1] == "parallel") == (cores > 1)
    assert f"reduction over outer dims: n in blocks of {block}" in tree.explain()
    assert_close(c.numpy(tree), ref, 1e-6)


@pytest.mark.parametrize("l1", [8 * 1024, 32 * 1024, 64 * 1024])
def test_the_accumulator_block_follows_the_l1_size(l1):
    c, _ = outer_max()
    tree = auto_tree(lower_on_host(c.node)[0], fake(32, 512, l1=l1))
    assert 16384 // loops(tree)["n.0"][0] == l1 // 2 // 4


def transpose(rows=4096, cols=1024):
    x = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
    m, n = lt.symbols("m n")
    return lt.Tensor(np.zeros(cols, np.float32)).to(n) + lt.Tensor(x).to(m, n), x.T.astype(np.float64)


@pytest.mark.parametrize("kind", TARGETS)
def test_a_transpose_stores_contiguously_and_blocks_its_gathered_rows_for_l1(kind):
    c, ref = transpose()
    target = fake(l1=32 * 1024, **TARGETS[kind])
    tree = auto_tree(lower_on_host(c.node)[0], target)
    lanes = target.lanes("float32")
    found = loops(tree)
    assert found["m.1"] == (lanes, "vectorize")                         # along the store: one register
    block = 32 * 1024 // 2 // (lanes * 4)                                 # lanes rows x block: half of L1
    assert found["n.1"] == (block, "") and order(tree) == ["n.0", "m.0", "n.1", "m.1"]
    assert f"in blocks of {block} inside m's outer loop" in tree.explain()
    np.testing.assert_array_equal(c.numpy(tree), ref)


def test_a_pointwise_stage_with_contiguous_loads_and_store_is_unchanged():
    x = np.random.default_rng(0).standard_normal((64, 256), dtype=np.float32)
    m, n = lt.symbols("m n")
    c = (lt.Tensor(x).to(m, n) * 2.0).exp()
    tree = auto_tree(lower_on_host(c.node)[0], fake(32, 512))
    assert order(tree) == ["m", "n.0", "n.1"] and loops(tree)["n.1"] == (64, "vectorize")
    assert "gathered" not in tree.explain()


def test_a_row_sum_of_a_shifted_exp_vectorizes_the_row_not_the_shift():
    """exp(s[i, j] - max[i]) summed over j: max[i] is read once per row, so j (along which s streams) is
    the vector dim, not i (a gather of s per lane)."""
    s = np.random.default_rng(0).standard_normal((128, 256), dtype=np.float32)
    i, j = lt.symbols("i j")
    t = lt.Tensor(s).to(i, j)
    total = (t - t.max(j)).exp().sum(j)
    tree = auto_tree(lower_on_host(total.node)[0], fake(32, 512))
    sums = tree.schedule.of("t1").loops
    assert [lp.dim for lp in sums if lp.annotation == "vectorize"] == ["j"]
    ref = np.exp(s - s.max(1, keepdims=True)).sum(1)
    assert_close(total.numpy(tree), ref, 1e-6)


@pytest.mark.parametrize("l3, outermost", [(32 << 20, True), (4 << 20, False)])
def test_a_parallel_column_loop_leaves_the_reduction_blocks_when_the_broadcast_operand_fits_l3(l3, outermost):
    """1024³: A (4 MiB) is swept once per column tile by each thread; it fits in half of a thread's share
    of a 32 MiB L3 (2 cores), not of a 4 MiB one. (A 4 MiB L2 holds each core's half of the results, so the
    reduction block is L1's.)"""
    a, b = (np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32) for _ in range(2))
    m, k, n = lt.symbols("m k n")
    c = (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k)
    tree = auto_tree(lower_on_host(c.node)[0], fake(32, 512, cores=2, l2=4 << 20, l3=l3))
    names = order(tree)
    parallel = next(lp.name for lp in tree.schedule.of("t0").loops if lp.annotation == "parallel")
    assert (names[0] == parallel) == outermost and ("parallel n.0 outermost" in tree.explain()) == outermost


def row_softmax(rows, cols=256):
    x = np.random.default_rng(1).standard_normal((rows, cols), dtype=np.float32)
    m, n = lt.symbols("m n")
    t = lt.Tensor(x).to(m, n)
    e = (t - t.max(n)).exp()
    ref = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    return e / e.sum(n), ref / ref.sum(1, keepdims=True)


@pytest.mark.parametrize("kind", TARGETS)
@pytest.mark.parametrize("rows, threaded", [(64, False), (300, True)])
def test_the_rows_loop_takes_threads_by_the_work_of_every_stage_placed_in_it(kind, rows, threaded):
    """300 rows of 256 are 76,800 results, under the 2 x 65,536 iterations two threads must each be given;
    with the row's exp and sum placed in the rows' loop the nest runs 3 x 76,800, and does (2 threads on a
    Zen 4: 40 us against 69 on one). 64 rows stay on one thread."""
    c, ref = row_softmax(rows)
    program = lower_on_host(c.node)[0]
    tree = auto_tree(program, fake(cores=2, **TARGETS[kind]))
    output = program.output.name
    placed = [st.name for st in tree.program.stages if tree.schedule.of(st.name).consumer == output]
    assert len(placed) >= 2
    annotations = [lp.annotation for lp in tree.schedule.of(output).loops]
    assert ("parallel" in annotations) == threaded
    assert_close(lt.Kernel(tree, 2)(lower_on_host(c.node)[1]), ref, 1e-5)
