"""Pipelined shared-memory copies (LoopTree.pipeline): cp.async in the PTX, rotating buffers, waits,
the legality rules, and results (on the CPU here; on a GPU where one is present)."""
import re

import numpy as np
import pytest

import looptool as lt
from looptool.codegen import gpu
from tests.gpu_helpers import cupy_or_skip, matmul, register_tiles
from tests.helpers import assert_close


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
    assert not legal and reason.startswith("stage t0 is placed at pipelined loop 'm.0' but is not a copy of inputs")


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
