"""GPU backend: PTX structure and GPU legality on any machine; execution where a GPU is present."""
import re

import numpy as np
import pytest

import looptool as lt
from looptool import codegen_gpu, ir, runtime_gpu
from tuner import space

from helpers import assert_close


def matmul(rng, m=64, k=32, n=48):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    sm, sk, sn = lt.symbols("m k n")
    return (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk), a.astype(np.float64) @ b


def tiled(tree):
    return (tree.split("m", 16).split("n", 32).split("m.1", 4)
            .reorder("m.0", "n.0", "m.1.0", "n.1", "k", "m.1.1")
            .bind("m.0", "block.y").bind("n.0", "block.x").bind("m.1.0", "thread.y").bind("n.1", "thread.x")
            .unroll("m.1.1"))


def test_ptx_has_one_entry_per_root_nest_with_guards_and_global_memory(rng):
    c, _ = matmul(rng, 50, 32, 70)
    module = codegen_gpu.generate(tiled(c.loop_tree()), "sm_90")
    assert module.launches[0].grid == (3, 4, 1) and module.launches[0].block == (32, 4, 1)
    ptx = module.ptx
    assert ".target sm_90" in ptx and ".visible .entry looptool_k0(" in ptx and ".maxntid 32, 4, 1" in ptx
    for register in ("%ctaid.x", "%ctaid.y", "%tid.x", "%tid.y"):
        assert register in ptx
    assert re.search(r"ld\.global(\.nc)?\.b32", ptx) and re.search(r"st\.global\.b32", ptx)
    assert re.search(r"fma\.rn\.f32", ptx)
    assert "setp" in ptx  # tails of 50 and 70 are guarded


def test_root_stages_are_separate_launches_and_softmax_ptx_is_arch_specific(rng):
    x = lt.Tensor(rng.standard_normal((40, 24)).astype(np.float32)).to(*lt.symbols("m n"))
    m, n = lt.symbols("m n")
    e = (x - x.max(n)).exp()
    sm = e / e.sum(n)
    tree = sm.loop_tree().split("m", 8, stage="t2").bind("m.0", "block.x", stage="t2").bind("m.1", "thread.x", stage="t2")
    module = codegen_gpu.generate(tree, "sm_80")
    assert [k.name for k in module.launches] == ["looptool_k0", "looptool_k1", "looptool_k2"]
    assert ".target sm_80" in module.ptx
    assert module.launches[2].grid == (5, 1, 1) and module.launches[2].block == (8, 1, 1)


def test_bound_loops_run_as_plain_loops_on_the_cpu(rng):
    c, ref = matmul(rng, 37, 29, 41)
    tree = tiled(c.loop_tree())
    assert tree.check() == (True, "legal")
    assert_close(c.numpy(tree), ref, 1e-5)
    assert_close(lt.interpret(c, tree), ref, 1e-5)
    assert "[thread.x]" in str(tree) and "[block.y]" in str(tree)


def test_reduction_bound_to_blocks_is_illegal(rng):
    c, _ = matmul(rng)
    tree = c.loop_tree().reorder("m", "n", "k").bind("k", "block.x").bind("n", "thread.x")
    legal, reason = tree.check()
    assert not legal
    assert "crosses GPU threads" in reason and "without a combine" in reason and "buffer t0" in reason


def test_reading_a_reduction_inside_the_thread_loop_that_combines_it_is_illegal(rng):
    x_np = rng.standard_normal((16, 8)).astype(np.float32)
    m, n = lt.symbols("m n")
    x = lt.Tensor(x_np).to(m, n)
    y = x - x.exp().sum(n)
    tree = y.loop_tree().bind("m", "block.x").bind("n", "thread.x").place("t0", "t1", 2)
    legal, reason = tree.check()
    assert not legal and "buffer t0" in reason and "loop 'n'" in reason


def softmax_rows(rng, rows=6, cols=40, threads=16):
    x_np = rng.standard_normal((rows, cols)).astype(np.float32)
    m, n = lt.symbols("m n")
    x = lt.Tensor(x_np).to(m, n)
    e = (x - x.max(n)).exp()
    sm = e / e.sum(n)
    tree = sm.loop_tree().bind("m", "block.x", stage="t2").place("t0", "t2", 1).place("t1", "t2", 1)
    for stage in ("t0", "t1", "t2"):
        tree = tree.split("n", threads, stage=stage).reorder("n.1", "n.0", stage=stage) \
            .bind("n.1", "thread.x", stage=stage)
    ref = np.exp(x_np - x_np.max(1, keepdims=True))
    return sm, tree, ref / ref.sum(1, keepdims=True)


def test_reductions_bound_to_threads_are_combined_through_shared_memory(rng):
    sm, tree, ref = softmax_rows(rng)
    assert tree.check() == (True, "legal")
    assert_close(sm.numpy(tree), ref, 1e-5)
    assert_close(lt.interpret(sm, tree), ref, 1e-5)
    ptx = codegen_gpu.generate(tree, "sm_90").ptx
    assert ".shared" in ptx and "bar.sync" in ptx


def test_unknown_axis_and_oversized_blocks_are_refused(rng):
    c, _ = matmul(rng)
    with pytest.raises(ValueError, match="unknown GPU axis 'warp.x'"):
        c.loop_tree().bind("m", "warp.x")
    big = c.loop_tree().reorder("m", "n", "k").bind("m", "thread.y").bind("n", "thread.x")
    with pytest.raises(ValueError, match="1024-thread limit"):
        codegen_gpu.generate(big, "sm_90")


def test_parallel_annotation_is_refused_on_the_gpu(rng):
    c, _ = matmul(rng)
    with pytest.raises(ValueError, match="bind it to blocks or threads"):
        codegen_gpu.generate(c.loop_tree().parallel("m"), "sm_90")


def register_tiles(c, **changes):
    """The tuner's GPU matmul template: 8 x 8 outputs per thread in registers, 128-bit vectors,
    both inputs staged in shared memory."""
    params = dict(x_threads=8, x_groups=2, vector=4, y_threads=8, y_tile=4, k_tile=8, unroll_k=True,
                  shared=("in0", "in1"))
    return space.register_tiled(c.loop_tree(), "t0", **{**params, **changes})


def test_cache_write_keeps_a_register_tile_per_thread_across_the_k_loop(rng):
    c, ref = matmul(rng, 100, 72, 136)   # tails in both pure dims
    tree = register_tiles(c)
    assert tree.check() == (True, "legal")
    assert "t0.acc[m, n] += (in0.t0.acc[k, m] * in1.t0.acc[k, n])" in str(tree)
    slices = tree.thread_slices
    assert set(slices) == {"t0.acc"} and dict(slices["t0.acc"].coeffs) == {"thread.x": 4, "thread.y": 256}
    assert_close(c.numpy(tree), ref, 1e-5)
    assert_close(lt.interpret(c, tree), ref, 1e-5)
    ptx = codegen_gpu.generate(tree, "sm_90").ptx
    assert ".local" not in ptx                      # accumulators never leave registers
    assert re.search(r"ld\.global\.nc\.v4\.[bf]32", ptx) and re.search(r"st\.global\.v4\.[bf]32", ptx)
    assert re.search(r"ld\.shared\.v4\.[bf]32", ptx)
    assert codegen_gpu.generate(tree, "sm_90", aligned_params=False).aligned == ()
    assert set(codegen_gpu.generate(tree, "sm_90").aligned) == {"in0", "in1", "t0"}


def test_independent_block_level_nests_share_one_barrier(rng):
    c, _ = matmul(rng, 64, 16, 64)
    llvm_ir = codegen_gpu.generate(register_tiles(c, unroll_k=False), "sm_90").llvm_ir
    # inside the k loop: both copies, one barrier, the products, one barrier that ends the body
    # (none around the accumulators: each thread has its own)
    assert llvm_ir.count("call void @\"llvm.nvvm.barrier0\"()") == 2


def test_a_thread_tile_bound_differently_where_it_is_read_lives_in_shared_memory(rng):
    c, ref = matmul(rng, 32, 16, 32)
    tree = c.loop_tree().cache_write().split("m", 16).split("n", 16) \
        .reorder("m.0", "n.0", "m.1", "n.1").bind("m.0", "block.y").bind("n.0", "block.x") \
        .bind("m.1", "thread.x").bind("n.1", "thread.y").place("t0.acc", "t0", 2) \
        .bind("m.1", "thread.y", stage="t0.acc").bind("n.1", "thread.x", stage="t0.acc")
    assert tree.thread_slices == {} and tree.check() == (True, "legal")
    assert_close(c.numpy(tree), ref, 1e-5)
    assert ".shared" in codegen_gpu.generate(tree, "sm_90").ptx


def test_every_legal_draw_of_the_gpu_search_space_computes_the_right_result(rng):
    optuna = pytest.importorskip("optuna")
    c, ref = matmul(rng, 64, 32, 128)
    sm, _, sm_ref = softmax_rows(rng, rows=32, cols=128)
    measured = 0
    for tensor, expected in ((c, ref), (sm, sm_ref)):
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
        for _ in range(12):
            trial = study.ask()
            try:
                tree = space.sample_gpu(trial, tensor.loop_tree())
            except space.InvalidDraw:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            study.tell(trial, 1.0)
            if tree.check()[0]:
                assert_close(tensor.numpy(tree), expected, 1e-5)
                measured += 1
    assert measured >= 10


def test_the_default_gpu_schedule_gives_every_stage_blocks_and_threads(rng):
    sm, _, ref = softmax_rows(rng, rows=12, cols=300)
    program = sm.loop_tree().program
    tree = runtime_gpu.default_tree(program)
    assert tree.check() == (True, "legal")
    assert str(tree).count("[thread.x]") == 3 and str(tree).count("[block.x]") == 3
    assert_close(lt.interpret(sm, tree), ref, 1e-5)


def _cupy_or_skip():
    cp = pytest.importorskip("cupy", reason="GPU execution needs CuPy (pip install 'looptool[gpu]')")
    try:
        if cp.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no NVIDIA GPU present")
    except cp.cuda.runtime.CUDARuntimeError as err:
        pytest.skip(f"no usable NVIDIA GPU: {err}")
    return cp


@pytest.mark.gpu
def test_matmul_runs_on_the_gpu_and_writes_every_element(rng):
    cp = _cupy_or_skip()
    c, ref = matmul(rng, 50, 33, 70)
    got = c.cuda(tiled(c.loop_tree()))
    assert isinstance(got, cp.ndarray)
    assert_close(cp.asnumpy(got), ref, 1e-5)


@pytest.mark.gpu
def test_softmax_with_combined_reductions_runs_on_the_gpu(rng):
    cp = _cupy_or_skip()
    sm, tree, ref = softmax_rows(rng, rows=37, cols=1000, threads=128)
    assert_close(cp.asnumpy(sm.cuda(tree)), ref, 1e-5)


@pytest.mark.gpu
def test_gpu_inputs_stay_on_the_device(rng):
    cp = _cupy_or_skip()
    x = cp.asarray(rng.standard_normal(1000).astype(np.float32))
    i, = lt.symbols("i")
    t = lt.Tensor(x).to(i)
    y = (t * t + 1.0).relu()
    tree = y.loop_tree().split("i", 128).bind("i.0", "block.x").bind("i.1", "thread.x")
    assert_close(cp.asnumpy(y.cuda(tree)), np.maximum(cp.asnumpy(x).astype(np.float64) ** 2 + 1, 0), 1e-5)
    assert_close(y.numpy(), np.maximum(cp.asnumpy(x).astype(np.float64) ** 2 + 1, 0), 1e-5)


@pytest.mark.gpu
def test_register_tiles_run_on_the_gpu_also_on_unaligned_inputs(rng):
    cp = _cupy_or_skip()
    a = rng.standard_normal((100, 72)).astype(np.float32)
    b = rng.standard_normal((72, 136)).astype(np.float32)
    sm, sk, sn = lt.symbols("m k n")
    base = cp.zeros(100 * 72 + 1, dtype=np.float32)
    base[1:] = cp.asarray(a).ravel()
    offset = base[1:].reshape(100, 72)                      # starts 4 bytes into its allocation
    assert offset.data.ptr % 16 == 4
    ref = a.astype(np.float64) @ b
    for a_dev in (cp.asarray(a), offset):
        c = (lt.Tensor(a_dev).to(sm, sk) * lt.Tensor(cp.asarray(b)).to(sk, sn)).sum(sk)
        out = c.cuda(register_tiles(c))
        assert_close(cp.asnumpy(out), ref, 1e-5)


@pytest.mark.gpu
def test_a_gpu_study_measures_draws_and_records_the_best_for_this_gpu(rng, tmp_path, monkeypatch):
    _cupy_or_skip()
    pytest.importorskip("optuna")
    from tuner import study
    from looptool import tuning_db
    monkeypatch.setenv("LOOPTOOL_TUNING_DB", str(tmp_path / "tuned.sqlite"))
    c, ref = matmul(rng, 256, 128, 256)
    result = study.tune(c, trials=12, storage=f"sqlite:///{tmp_path / 's.sqlite'}", seed=0, progress=False,
                        device="gpu", repeats=3)
    assert result.best_tree is not None and result.best_seconds < float("inf")
    stored = tuning_db.lookup(ir.lower(c.node)[0], runtime_gpu.target_name())
    assert stored is not None
    import cupy as cp
    assert_close(cp.asnumpy(c.cuda()), ref, 1e-5)        # .cuda() now runs the tuned schedule
