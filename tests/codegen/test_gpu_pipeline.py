"""Pipelined shared-memory copies (LoopTree.pipeline): cp.async in the PTX, rotating buffers, waits,
the legality rules, and results (on the CPU here; on a GPU where one is present)."""
import re

import numpy as np
import pytest

import looptool as lt
from looptool.codegen import gpu
from tests.gpu_helpers import cupy_or_skip, matmul, register_tiles
from tests.helpers import assert_close
from looptool.autoschedule import gpu as templates


def calls(llvm_ir: str, intrinsic: str) -> int:
    return len(re.findall(rf"call void @\"?{re.escape(intrinsic)}\"?\(", llvm_ir))


@pytest.mark.parametrize("stages", [2, 4])
def test_copies_become_cp_async_with_one_commit_per_issue(rng, stages):
    c, _ = matmul(rng, 64, 64, 64)
    module = gpu.generate(register_tiles(c).pipeline("k.0", stages, stage="t0.acc"), "sm_90")
    issues = stages                                  # stages - 1 in the prologue, one in the loop
    assert calls(module.llvm_ir, "llvm.nvvm.cp.async.commit.group") == issues
    # in1's tile rows are contiguous on both sides: one 16-byte copy per vector of 4; in0 is
    # transposed into shared memory, so it is loaded and stored (into the buffer of its iteration)
    assert calls(module.llvm_ir, "llvm.nvvm.cp.async.cg.shared.global.16") == 2 * issues
    assert "cp.async.ca" not in module.llvm_ir
    assert sorted(set(re.findall(r"cp\.async\.wait_group\s+(\d+)", module.ptx))) == sorted({str(stages - 2), "0"})
    assert "cp.async.cg.shared.global" in module.ptx and "ld.global.nc.v4" in module.ptx


def test_a_copy_whose_source_rows_are_off_16_byte_boundaries_runs_as_a_cp_async_an_element(rng):
    """B of 66 columns: its rows start off 16-byte boundaries, so its tile cannot be copied in 16-byte
    vectors; it is copied a 4-byte cp.async an element (loads into registers would stall the thread at
    the store, in the iteration issuing them). A, transposed into shared memory, is still read in
    vectors and stored an element."""
    c, _ = matmul(rng, 64, 64, 66)
    module = gpu.generate(register_tiles(c).pipeline("k.0", 2, stage="t0.acc"), "sm_90")
    assert calls(module.llvm_ir, "llvm.nvvm.cp.async.ca.shared.global.4") > 0
    assert calls(module.llvm_ir, "llvm.nvvm.cp.async.cg.shared.global.16") == 0
    assert "ld.global.nc.v4" in module.ptx and "st.shared.b32" in module.ptx


def test_an_unpipelined_tree_has_no_async_copies(rng):
    c, _ = matmul(rng, 64, 64, 64)
    module = gpu.generate(register_tiles(c), "sm_90")
    assert "cp.async" not in module.ptx and "ld.global" in module.ptx


@pytest.mark.parametrize("stages, in_flight", [(2, 0), (4, 1)])
def test_pipelined_schedules_run_as_plain_loops_on_the_cpu(rng, stages, in_flight):
    c, ref = matmul(rng, 37, 21, 45)                 # tails in every dim, k tiles included
    tree = register_tiles(c).pipeline("k.0", stages, in_flight, stage="t0.acc")
    assert tree.check() == (True, "legal")
    assert_close(lt.interpret(c, tree), ref, 1e-5)   # (compiling this tree for the CPU takes ~15 s)
    replayed = c.loop_tree(tree.schedule.to_json())
    assert str(replayed) == str(tree) and f"[pipeline.{stages}.{in_flight}]" in str(tree)


def test_too_shallow_a_wait_is_refused(rng):
    c, _ = matmul(rng, 64, 64, 64)
    legal, reason = register_tiles(c).pipeline("k.0", 3, in_flight=2, stage="t0.acc").check()
    assert not legal
    assert reason == ("loop 'k.0' is pipelined with 3 stages but waits only until 2 groups of copies are in "
                      "flight: the copy for an iteration is issued 2 iterations ahead, so it could still be "
                      "running when the iteration reads it (at most 1 may stay in flight)")
    with pytest.raises(lt.IllegalScheduleError, match="at most 1 may stay in flight"):
        gpu_tree = register_tiles(c).pipeline("k.0", 3, in_flight=2, stage="t0.acc")
        gpu_tree.assert_legal()


def test_pipelines_without_copies_or_inside_threads_are_refused(rng):
    c, _ = matmul(rng, 64, 64, 64)
    tree = register_tiles(c)
    legal, reason = tree.pipeline("k.1", 2, stage="t0.acc").check()
    assert not legal and "pipelined inside thread-bound loops ['m.1.0', 'n.1.1.0']" in reason
    legal, reason = tree.pipeline("m.0", 2, stage="t0").check()
    assert not legal and reason.startswith("loop 'm.0' is pipelined but no stage is placed at it")


def test_a_placed_stage_that_is_no_input_copy_is_refused(rng):
    m, n = lt.symbols("m n")
    x = lt.Tensor(rng.standard_normal((8, 32)).astype(np.float32)).to(m, n)
    e = (x - x.max(n)).exp()
    tree = e.loop_tree().split("m", 2).place("t0", "t1", 1).pipeline("m.0", 2)
    legal, reason = tree.check()
    assert not legal and reason.startswith("stage t0 is placed at pipelined loop 'm.0' but is not a copy of a buffer its "
                                          "kernel leaves unchanged (it reduces)")


@pytest.mark.parametrize("stages, bad", [(1, "stages must be an integer >= 2"), (2.5, "stages must be an integer")])
def test_bad_pipeline_arguments(rng, stages, bad):
    c, _ = matmul(rng)
    with pytest.raises(ValueError, match=bad):
        register_tiles(c).pipeline("k.0", stages, stage="t0.acc")


@pytest.mark.gpu
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_pipelined_matmul_runs_on_the_gpu(rng, stages):
    cp = cupy_or_skip()
    c, ref = matmul(rng, 130, 77, 150)
    out = c.cuda(register_tiles(c).pipeline("k.0", stages, stage="t0.acc"))
    assert_close(cp.asnumpy(out), ref, 1e-5)


def transposed_ahead_tiles(c, **changes):
    """A transposed ahead by a kernel of its own, then both k tiles copied as stored into shared
    memory by a 2-stage pipeline, each thread's 8 rows in two runs of 4."""
    tree = templates.transposed_ahead(c.loop_tree(), "t0", "in0")
    params = dict(x_threads=8, x_groups=2, vector=4, y_threads=8, y_tile=8, k_tile=8, unroll_k=True,
                  shared=("in0.t0", "in1"), as_stored=("in0.t0", "in1"), y_groups=2)
    return templates.register_tiled(tree, "t0", **{**params, **changes}).pipeline("k.0", 2, stage="t0.acc")


def test_an_input_transposed_ahead_runs_as_its_own_kernel_and_is_then_copied_by_cp_async(rng):
    c, _ = matmul(rng, 64, 64, 64)
    tree = transposed_ahead_tiles(c)
    assert tree.check() == (True, "legal")
    module = gpu.generate(tree, "sm_90")
    assert [launch.block for launch in module.launches] == [(32, 8, 1), (8, 8, 1)]
    transpose, tiles = module.ptx.split(".entry")[1:]
    assert "cp.async" not in transpose and "ld.global.nc.v4.b32" in transpose   # 16-byte loads along k
    assert len(re.findall(r"st\.global\.b32", transpose)) == 4                     # a word to each of 4 rows
    # both k tiles are copied in whole 16-byte vectors, 2 per thread and k tile of A (8 x 64) and 2
    # of B (8 x 64), in the prologue and the loop; nothing goes into shared memory word by word
    assert len(re.findall(r"cp\.async\.cg\.shared\.global", tiles)) == 2 * (2 + 2)
    assert "st.shared" not in tiles and "ld.shared.v4.b32" in tiles


def test_an_input_transposed_ahead_gives_numpys_result_with_tails(rng):
    c, ref = matmul(rng, 37, 21, 45)                 # tails in every dim, both kernels
    tree = transposed_ahead_tiles(c)
    assert tree.check() == (True, "legal")
    assert_close(lt.interpret(c, tree), ref, 1e-5)
    assert "in0.t0[k, m] = in0[m, k]" in str(tree) and str(c.loop_tree(tree.schedule.to_json())) == str(tree)


def test_a_pipelined_copy_of_a_buffer_written_in_the_same_kernel_is_refused(rng):
    c, _ = matmul(rng, 64, 64, 64)
    tree = transposed_ahead_tiles(c).place("in0.t0", "t0", 2)
    legal, reason = tree.check()
    assert not legal
    assert reason.startswith("stage in0.t0.t0.acc is placed at pipelined loop 'k.0' but is not a copy of a buffer "
                             "its kernel leaves unchanged (it reads in0.t0)")


def test_transposed_ahead_refuses_an_input_already_laid_out_reduction_first(rng):
    c, _ = matmul(rng, 64, 64, 64)
    with pytest.raises(ValueError, match=r"transposed_ahead: in1 \(dims \('k', 'n'\)\) is not a 2-D input \(or a "
                                         r"batch of them\) with the reduction dim of t0 \(\('k',\)\) last"):
        templates.transposed_ahead(c.loop_tree(), "t0", "in1")


def test_a_pipelined_copy_each_thread_reads_only_its_own_slice_of_is_refused(rng):
    """Found by compute-sanitizer's racecheck on an H100 (a random softmax schedule): a copy kept per thread
    (its registers) was pipelined, so every thread's cp.async wrote the same shared-memory tile."""
    x = rng.standard_normal((37, 300)).astype(np.float32)
    m, n = lt.symbols("m n")
    c = lt.Tensor(x).to(m, n).max(n)
    tree = (c.loop_tree().split("m", 32).bind("m.0", "block.x").bind("m.1", "thread.x").cache_write("t0")
            .place("t0.acc", "t0", 1).split("n", 4, stage="t0.acc").reorder("n.0", "m.1", "n.1", stage="t0.acc")
            .bind("m.1", "thread.x", stage="t0.acc").cache("in0", stage="t0.acc").place("in0.t0.acc", "t0.acc", 2)
            .bind("m.1", "thread.x", stage="in0.t0.acc").vectorize("n.1", stage="in0.t0.acc"))
    assert tree.check() == (True, "legal")
    legal, reason = tree.pipeline("n.0", 3, stage="t0.acc").check()
    assert not legal
    assert reason.startswith("stage in0.t0.acc is placed at pipelined loop 'n.0', but each thread reads only its own")
