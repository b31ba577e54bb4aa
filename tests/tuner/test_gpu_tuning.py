"""Tuning for the GPU: every legal draw of the GPU search space computes the right result; a GPU
study (marked `gpu`) records its best schedule for this GPU where it beats the automatic one."""
import dataclasses
import re

import numpy as np
import pytest

import looptool as lt
from looptool import ir
from looptool.codegen import gpu as codegen_gpu
from looptool.runtime import gpu
from tests.gpu_helpers import cupy_or_skip, matmul, softmax_rows
from tests.helpers import assert_close
from tuner import space


def legal_gpu_draws(tensor, seed: int, draws: int):
    """(trial, tree) for each of `draws` random draws of the GPU space that the legality check accepts."""
    optuna = pytest.importorskip("optuna")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    for _ in range(draws):
        trial = study.ask()
        try:
            tree = space.sample_gpu(trial, tensor.loop_tree())
        except space.InvalidDraw:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        study.tell(trial, 1.0)
        if tree.check()[0]:
            yield trial, tree


def test_every_legal_draw_of_the_gpu_search_space_computes_the_right_result(rng):
    c, ref = matmul(rng, 64, 32, 128)
    sm, _, sm_ref = softmax_rows(rng, rows=32, cols=128)
    measured = 0
    for tensor, expected in ((c, ref), (sm, sm_ref)):
        for _, tree in legal_gpu_draws(tensor, 3, 12):
            assert_close(tensor.numpy(tree), expected, 1e-5)
            measured += 1
    assert measured >= 10


def test_the_rows_family_gives_a_placed_contraction_one_thread_loop(rng):
    """The 'rows' family had bound both loops left of a product placed in its epilogue's rows (k and n) to
    thread.x; on a GPU that ran only their diagonal. Now only the innermost is, and the draw is legal."""
    optuna = pytest.importorskip("optuna")
    c, ref = matmul(rng, 16, 48, 300)
    scaled = c * 0.5
    tree = space.sample_gpu(optuna.trial.FixedTrial({"gpu.family": "rows", "gpu.rows.threads": 128}),
                            scaled.loop_tree())
    assert tree.check() == (True, "legal")
    assert "for k in 0..48\n" in str(tree) and "for n.1 in 0..128  [thread.x]" in str(tree)
    assert_close(scaled.numpy(tree), ref * 0.5, 1e-5)


def test_a_half_precision_product_with_an_epilogue_draws_tensor_cores_and_fuses_the_epilogue(rng):
    """relu(x.w + b) rounded to bfloat16 (the GPU suite's MLP row): the space draws the mma family for its
    product and computes the bias, relu and cast in the write-back (one kernel), as the automatic one does."""
    optuna = pytest.importorskip("optuna")
    import ml_dtypes
    x = rng.standard_normal((256, 128)).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((128, 192)).astype(ml_dtypes.bfloat16)
    bias = rng.standard_normal(192).astype(np.float32)
    m, k, n = lt.symbols("m k n")
    y = lt.relu((lt.Tensor(x).to(m, k) * lt.Tensor(w).to(k, n)).sum(k) + lt.Tensor(bias).to(n)).astype(lt.bfloat16)
    program = ir.lower(y.node)[0]
    assert space.half_contraction(program) == "t0" and len(program.stages) == 2
    start = space.gpu_start_params(program)
    assert start["gpu.family"] == "tiles" and start["gpu.tensor.family"] in ("mma", "wgmma")
    drawn = {"gpu.family": "tiles", "gpu.tensor.family": "mma", "gpu.mma.block.m": 64, "gpu.mma.block.n": 64,
             "gpu.mma.warps.m": 2, "gpu.mma.warps.n": 2, "gpu.mma.k.tile": 32, "gpu.mma.stages": 2}
    tree = space.sample_gpu(optuna.trial.FixedTrial(drawn), lt.LoopTree(program))
    assert tree.check() == (True, "legal") and "[mma.m16n8k16" in str(tree)
    assert len(codegen_gpu.generate(tree, "sm_80").launches) == 1
    ref = np.maximum(x.astype(np.float64) @ w.astype(np.float64) + bias, 0)
    assert_close(y.numpy(tree).astype(np.float64), ref, 2.0 ** -7)


@pytest.mark.gpu
def test_a_gpu_study_measures_draws_and_records_the_best_for_this_gpu(rng, tmp_path, monkeypatch):
    cupy_or_skip()
    pytest.importorskip("optuna")
    from tuner import study
    from looptool.runtime import tuning_db
    monkeypatch.setenv("LOOPTOOL_TUNING_DB", str(tmp_path / "tuned.sqlite"))
    c, ref = matmul(rng, 256, 128, 256)
    result = study.tune(c, trials=12, storage=f"sqlite:///{tmp_path / 's.sqlite'}", seed=0, progress=False,
                        device="gpu", repeats=3)
    assert result.best_tree is not None and result.best_seconds < float("inf")
    automatic = result.study.user_attrs["automatic_seconds"]
    stored = tuning_db.lookup(gpu.lowered_for(c.node)[0], gpu.target_name())
    # stored only where a trial beat the automatic schedule: tuning never makes .cuda() slower
    assert result.best_seconds <= automatic and (stored is None) == (result.best_seconds == automatic)
    import cupy as cp
    assert_close(cp.asnumpy(c.cuda()), ref, 1e-5)        # .cuda() runs the tuned schedule, or the automatic one


@pytest.mark.gpu
def test_a_study_on_every_gpu_of_the_host_measures_on_each(rng, tmp_path, monkeypatch):
    """`gpus=[0, 1]`: one measuring process a GPU, each pinned to its own (the trials say which measured
    them), on the one study; the best is stored and `.cuda()` runs it right."""
    cp = cupy_or_skip()
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip(f"needs 2 GPUs on one host, this one has {cp.cuda.runtime.getDeviceCount()}")
    pytest.importorskip("optuna")
    from tuner import study
    monkeypatch.setenv("LOOPTOOL_TUNING_DB", str(tmp_path / "tuned.sqlite"))
    c, ref = matmul(rng, 256, 128, 256)
    result = study.tune(c, trials=12, storage=f"sqlite:///{tmp_path / 's.sqlite'}", seed=0, progress=False,
                        device="gpu", repeats=3, gpus=[0, 1])
    cards = {t.user_attrs["gpu"] for t in result.study.trials if "gpu" in t.user_attrs}
    buses = {cp.cuda.Device(k).pci_bus_id for k in (0, 1)}
    assert {card.split()[-1] for card in cards} == buses
    assert_close(cp.asnumpy(c.cuda()), ref, 1e-5)


@pytest.mark.gpu
def test_a_gpu_that_is_not_there_fails_three_trials_and_the_study_goes_on(rng, tmp_path, monkeypatch):
    """gpus=[0, N] on a host of N GPUs: the helper pinned to the missing one fails to start its worker three
    times, fails those trials and stops; GPU 0 finishes the study."""
    cp = cupy_or_skip()
    pytest.importorskip("optuna")
    from tuner import study
    monkeypatch.setenv("LOOPTOOL_TUNING_DB", str(tmp_path / "tuned.sqlite"))
    missing = cp.cuda.runtime.getDeviceCount()
    c, ref = matmul(rng, 256, 128, 256)
    result = study.tune(c, trials=24, storage=f"sqlite:///{tmp_path / 's.sqlite'}", seed=0, progress=False,
                        device="gpu", repeats=3, gpus=[0, missing])
    failures = [t.user_attrs.get("failure", "") for t in result.study.trials if t.state.name == "FAIL"]
    lost = sum(f"GPU {missing} failed to start 3 times in a row" in failure for failure in failures)
    starts = sum("while starting" in failure for failure in failures)
    assert 1 <= starts <= 3 and lost == (starts == 3)     # (GPU 0 may finish the study before a third start)
    measured = {t.user_attrs["gpu"].split()[-1] for t in result.study.trials if t.state.name == "COMPLETE"}
    assert measured == {cp.cuda.Device(0).pci_bus_id}           # the other trials: GPU 0's (some pruned)
    assert_close(cp.asnumpy(c.cuda()), ref, 1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_parameter_of_the_gpu_space_keeps_its_choices_from_trial_to_trial(rng, dtype):
    """Optuna refuses a parameter whose choices change between trials of a study ("does not support
    dynamic value space"): the draw was lost as a pruned trial (y.groups once took only the divisors of
    the drawn y.tile)."""
    optuna = pytest.importorskip("optuna")
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    c, _ = matmul(rng, 256, 128, 256, dtype)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    refused = []
    for _ in range(300):
        trial = study.ask()
        try:
            space.sample_gpu(trial, c.loop_tree())
            study.tell(trial, 1.0)
        except space.InvalidDraw as err:
            refused.append(str(err))
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    assert not [why for why in refused if "dynamic value space" in why]
    assert len(refused) < 300


def test_gpus_are_refused_for_a_cpu_study(rng):
    pytest.importorskip("optuna")
    from tuner import study
    c, _ = matmul(rng, 16, 8, 16)
    with pytest.raises(ValueError, match=r"gpus=\[0, 1\] measures on GPUs: pass device='gpu' too"):
        study.tune(c, trials=1, gpus=[0, 1], progress=False)


def legal_family_draws(rng, family: str, tile: str, shape: tuple[int, int, int], seed: int, draws: int) -> int:
    """How many of `draws` random draws of a bfloat16 matmul's GPU space are legal draws of `family`,
    each checked to hold `tile` tiles and to compute the right result (in the interpreter, which runs
    the tiles as loops)."""
    import numpy as np
    import looptool as lt
    m, k, n = lt.symbols("m k n")
    a = rng.standard_normal(shape[:2]).astype(lt.bfloat16)
    b = rng.standard_normal(shape[1:]).astype(lt.bfloat16)
    c = (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    legal = 0
    for trial, tree in legal_gpu_draws(c, seed, draws):
        if trial.params.get("gpu.tensor.family") == family:
            assert re.search(tile, str(tree))
            assert_close(lt.interpret(c, tree), ref, 1e-5)
            legal += 1
    return legal


def test_gpu_draws_of_a_half_precision_contraction_include_tensor_core_schedules(rng):
    """The 'mma' family: mma_tiled's block tile, warps, k tile and stages."""
    assert legal_family_draws(rng, "mma", r"mma\.m16n8k16\.k", (64, 48, 64), 5, 40) >= 3


def test_on_hopper_draws_include_warpgroup_schedules(rng, monkeypatch):
    """The 'wgmma' family (wgmma_tiled's block tile, warpgroups and stages), offered where the GPU is a
    Hopper, whose opt-in shared-memory limit (227 KB on an H100) bounds it."""
    monkeypatch.setattr(space, "tensor_families", lambda: ["tiles", "mma", "wgmma"])
    monkeypatch.setattr(space, "mma_shared_limit", lambda: 227 * 1024)
    assert legal_family_draws(rng, "wgmma", r"wgmma\.m64n\d+k16\.k", (128, 128, 256), 6, 60) >= 2


@pytest.mark.parametrize("families, instruction, pipeline", [
    (["tiles", "mma", "wgmma"], "wgmma.m64n256k16", "pipeline.4.2.tma"),
    (["tiles", "mma"], "mma.m16n8k16", "pipeline.2.0]")])
def test_a_gpu_study_of_a_half_contraction_starts_from_the_gpus_best_tensor_core_family(
        rng, monkeypatch, families, instruction, pipeline):
    """As a CPU study starts from the automatic schedule: the untuned GPU default's configuration,
    wgmma copied by TMA in 4 stages on Hopper, else mma; the draw is legal and computes the right
    result; other programs get no first draw."""
    optuna = pytest.importorskip("optuna")
    monkeypatch.setattr(space, "_gpu", lambda: None)       # (as on a machine without a GPU, whose SM count could narrow the block)
    monkeypatch.setattr(space, "tensor_families", lambda: families)
    monkeypatch.setattr(space, "mma_shared_limit", lambda: 227 * 1024)
    c, ref = matmul(rng, 256, 128, 512, dtype=lt.bfloat16)
    params = space.gpu_start_params(ir.lower(c.node)[0])
    assert params["gpu.tensor.family"] == families[-1]
    tree = space.sample_gpu(optuna.trial.FixedTrial(params), c.loop_tree())
    assert f"[{instruction}.k]" in str(tree) and pipeline in str(tree) and tree.check() == (True, "legal")
    assert_close(c.numpy(tree), ref, 1e-5)
    assert space.gpu_start_params(ir.lower(softmax_rows(rng, rows=32, cols=128)[0].node)[0]) == {}


PARTS_COPIED = "in0.t0.part[k_o, m, k_i] = in0[k_o, m, k_i]"


@pytest.mark.parametrize("m, k, n, parts, copied, sms", [(128, 64, 128, 1, "in0.t0.acc[m, k] = in0[m, k]", 132),
                                                          (256, 1024, 256, 1, "in0.t0[k, m] = in0[m, k]", 132),
                                                          (300, 1024, 200, 4, PARTS_COPIED, 132),
                                                          (256, 512, 64, 2, PARTS_COPIED, 2)])
def test_a_float32_gpu_study_starts_from_the_automatic_schedule(rng, monkeypatch, m, k, n, parts, copied, sms):
    """A float32 study's first draw is the automatic schedule of this GPU (`_tiles_start`: its block, threads,
    tiles and copies), step for step: A's short k tiles copied as stored, A transposed ahead where k is long,
    split-k's parts added into the result atomically, k tiles of 64 and rows in one run (128 x 64 blocks on
    a 2-SM Hopper: `float32_plan`); legal and right. Matrices smaller than one block tile get no first draw."""
    optuna = pytest.importorskip("optuna")
    from looptool.analysis.gpu_target import assumed_gpu
    from looptool.autoschedule import gpu_rules
    h100 = dataclasses.replace(assumed_gpu("sm_90"), sms=sms)
    monkeypatch.setattr(space, "_gpu", lambda: h100)
    c, ref = matmul(rng, m, k, n)
    program, arrays = ir.lower(c.node)
    program = ir.split_k(program, parts) if parts > 1 else program
    params = space.gpu_start_params(program)
    tree = space.sample_gpu(optuna.trial.FixedTrial(params), lt.LoopTree(program))
    assert tree.schedule.steps == gpu_rules.gpu_tree(program, h100).schedule.steps
    assert "[pipeline.2" in str(tree) and copied in str(tree) and tree.check() == (True, "legal")
    views = [np.lib.stride_tricks.as_strided(x, buf.shape, [s * x.itemsize for s in buf.strides])
             for x, buf in zip(arrays, program.inputs)]
    assert_close(lt.Kernel(tree, 1)(views), ref, 1e-5)
    assert space.gpu_start_params(ir.lower(matmul(rng, 32, 16, 32)[0].node)[0]) == {}


def test_tensor_families_offer_wgmma_only_on_hopper(monkeypatch):
    for arch, families in (("sm_90", ["tiles", "mma", "wgmma"]), ("sm_80", ["tiles", "mma"])):
        space.tensor_families.cache_clear()
        monkeypatch.setattr(space.runtime_gpu, "device_arch", lambda arch=arch: arch)
        assert space.tensor_families() == families
    space.tensor_families.cache_clear()


def test_mma_shared_limit_is_the_gpus_or_48_kb_without_one(monkeypatch):
    def no_gpu():
        raise RuntimeError("no GPU")
    space.mma_shared_limit.cache_clear()
    monkeypatch.setattr(space.runtime_gpu, "shared_limit", no_gpu)
    assert space.mma_shared_limit() == 48 * 1024
    space.mma_shared_limit.cache_clear()
    monkeypatch.setattr(space.runtime_gpu, "shared_limit", lambda: 227 * 1024)
    assert space.mma_shared_limit() == 227 * 1024
    space.mma_shared_limit.cache_clear()


def test_a_gpu_study_keeps_its_best_draw_only_where_timed_again_it_beats_the_automatic_schedule(monkeypatch):
    """The trial's time is not enough (trials minutes apart differ by a few per cent): the best draw and the
    automatic schedule are timed again in turn, and the draw is kept only where its median is more than
    1 % faster; a draw that lost in its trial is not timed again, nor one that lowers to the automatic
    schedule's own kernels (session 28: such a draw, trial 0 of a bf16 study, was kept on a 1 % gap)."""
    from types import SimpleNamespace
    from tuner import study
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(np.ones((8, 8), np.float32)).to(sm, sk) * lt.Tensor(np.ones((8, 8), np.float32)).to(sk, sn)).sum(sk)
    tree = c.loop_tree()
    monkeypatch.setattr(gpu, "automatic_tree", lambda program: tree)
    monkeypatch.setattr(gpu, "device_arch", lambda: "sm_90")
    drawn = tree.split("m", 4)
    for times, automatic_trial, kept in (({"drawn": 1.0, "automatic": 1.005}, 2.0, False),
                                         ({"drawn": 1.0, "automatic": 1.05}, 2.0, True),
                                         ({"drawn": 1.0, "automatic": 0.9}, 2.0, False),
                                         ({"drawn": 1.0, "automatic": 0.5}, 0.5, False)):
        measured = []

        def measure(steps, times=times):
            measured.append(steps)
            return SimpleNamespace(seconds=times["drawn" if steps == drawn.schedule.steps else "automatic"])
        tuning = SimpleNamespace(program=tree.program, automatic_seconds=lambda t=automatic_trial: t,
                                 measurer=SimpleNamespace(measure=measure))
        assert study.Tuning.beats_automatic(tuning, 1.0, drawn.schedule) == kept
        assert len(measured) == (2 * study.CONFIRM_ROUNDS if automatic_trial > 1.0 else 0)
    automatic, same = tree.split("m", 4).split("n", 2), tree.split("n", 2).split("m", 4)  # other steps, same kernels
    monkeypatch.setattr(gpu, "automatic_tree", lambda program: automatic)
    assert same.schedule.steps != automatic.schedule.steps and study.same_kernels(same, automatic, "sm_90")
    assert not study.same_kernels(drawn, automatic, "sm_90")
    tuning.measurer = SimpleNamespace(measure=lambda steps: pytest.fail("the automatic schedule's own kernels timed"))
    assert not study.Tuning.beats_automatic(tuning, 1.0, same.schedule)


def test_split_k_parts_drawn_on_register_tiles_add_into_the_result_atomically(rng):
    """A float32 product cut into parts (`ir.split_k`): the tiles family tiles the parts and adds them into the
    result from their blocks (`atomic_parts_total`), as the automatic schedule does, not by a second
    kernel; each legal draw computes the product (on this CPU, against float64)."""
    optuna = pytest.importorskip("optuna")
    sm, sk, sn = lt.symbols("m k n")
    a, b = rng.standard_normal((300, 1024)).astype(np.float32), rng.standard_normal((1024, 200)).astype(np.float32)
    program, arrays = ir.lower((lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk).node)
    split = ir.split_k(program, 4)
    views = [np.lib.stride_tricks.as_strided(x, buf.shape, [s * x.itemsize for s in buf.strides])
             for x, buf in zip(arrays, split.inputs)]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    legal = 0
    for _ in range(30):
        trial = study.ask()
        try:
            tree = space.sample_gpu(trial, lt.LoopTree(split))
        except space.InvalidDraw:
            continue
        assert "gpu.family" not in trial.params          # no 'rows' family: it cannot place the parts' sum
        if not tree.check()[0]:
            continue
        legal += 1
        assert "t0[m, n] += t0.part[k_o, m, n]" in str(tree) and "t0.part: f32[1, " in str(tree)
        assert [launch.grid[2] for launch in codegen_gpu.generate(tree, "sm_90").launches][-1] == 4
        assert_close(lt.Kernel(tree, 1)(views), a.astype(np.float64) @ b, 1e-5)
    assert legal >= 3, legal
