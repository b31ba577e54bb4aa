"""Tuning a program with a dynamic dim (issue 28): measured at the sizes named (or the default spread),
scored by the geometric mean of seconds per row, only schedules legal for every size kept, and the
result stored so that `lt.function` runs it at any size, correct against float64 at sizes never
measured (1, sizes below the split factor, sizes off every tile)."""
from __future__ import annotations

import math
import subprocess

import numpy as np
import optuna
import pytest

import looptool as lt
from looptool.codegen import cpu
from looptool.runtime import tuning_db
import tuner
from tuner import worker
from tuner.study import study_name_for

from tests.tuner_helpers import (REPO, dynamic_layer, looptool_cli, matmul_case, rel_err, sqlite_url,
                                 subprocess_env)

pytestmark = [pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")]
S = optuna.trial.TrialState


def program_of(tensor):
    return lt.runtime.lower_on_host(tensor.node)[0]


def test_sizes_named_and_the_default_spread():
    layer, x, w = dynamic_layer()
    program = program_of(layer.tensor(x, w))
    assert worker.measured_sizes(program, {"b": [1, 64, 1000]}) == [{"b": 1}, {"b": 64}, {"b": 1000}]
    assert worker.measured_sizes(program, {"b": np.int64(7)}) == [{"b": 7}]
    assert worker.measured_sizes(program, {"b": np.array([3, 9])}) == [{"b": 3}, {"b": 9}]
    assert worker.measured_sizes(program, None) == [{"b": size} for size in worker.DEFAULT_SIZES]
    wide = lt.symbols("b", dynamic=True, min=300)[0]
    k = lt.symbols("k")[0]
    tall = program_of(lt.Tensor(np.ones((400, 3), np.float32)).to(wide, k).sum(k))
    assert worker.measured_sizes(tall, None) == [{"b": 300}, {"b": 2048}]     # raised to the minimum
    assert worker.measured_sizes(program_of(matmul_case(4, 4, 4).tensor), None) == [{}]


@pytest.mark.parametrize("sizes, message", [
    ({"c": [4]}, r"sizes name dims \['c'\]; the workload's dynamic dims are \['b'\]"),
    ({"b": [4, 0]}, r"size 0 of dynamic dim 'b' cannot be measured: it takes whole sizes from 1 up"),
    ({"b": [4, 2.5]}, r"size 2.5 of dynamic dim 'b'"),
])
def test_bad_sizes_are_refused_naming_the_dim(sizes, message):
    layer, x, w = dynamic_layer()
    with pytest.raises(ValueError, match=message):
        tuner.Measurer(layer.tensor(x, w).node, sizes=sizes)


def test_sizes_for_a_program_without_dynamic_dims_are_refused():
    with pytest.raises(ValueError, match=r"sizes \{'m': \[4\]\} given, but the workload has no dynamic dim"):
        tuner.Measurer(matmul_case(4, 4, 4).tensor.node, sizes={"m": [4]})


def test_sizes_of_two_dims_of_unequal_counts_are_refused():
    b, c = lt.symbols("b c", dynamic=True)
    k = lt.symbols("k")[0]
    x = lt.Tensor(np.ones((5, 3), np.float32)).to(b, k)
    y = lt.Tensor(np.ones((6, 3), np.float32)).to(c, k)
    program = program_of(x + y.sum(c))
    assert worker.measured_sizes(program, {"b": [2, 9], "c": 4}) == [{"b": 2, "c": 4}, {"b": 9, "c": 4}]
    with pytest.raises(ValueError, match=r"each needs as many \(or one\): 'b' has 2, 'c' has 3"):
        worker.measured_sizes(program, {"b": [2, 9], "c": [1, 2, 3]})


def test_the_measurer_runs_every_named_size():
    """The sizes a measurement reports are read from the arrays the worker ran, one ratio to the yardstick
    each; the measurement's ratio is their geometric mean."""
    layer, x, w = dynamic_layer()
    with tuner.Measurer(layer.tensor(x, w).node, repeats=2, sizes={"b": [3, 50, 129]}) as measurer:
        result = measurer.measure(layer.tensor(x, w).loop_tree().split("b", 4).schedule.steps)
    assert result.sizes == [{"b": 3}, {"b": 50}, {"b": 129}]
    assert len(result.size_ratios) == 3 and all(r > 0 for r in result.size_ratios)
    assert result.yardstick_ratio == pytest.approx(math.prod(result.size_ratios) ** (1 / 3), rel=1e-9)
    assert result.seconds == pytest.approx(result.yardstick_ratio * measurer.yardstick_seconds, rel=1e-12)


def test_a_static_measurement_reports_no_sizes():
    case = matmul_case(8, 8, 8)
    with tuner.Measurer(case.tensor.node, repeats=1) as measurer:
        result = measurer.measure([])
    assert result.sizes is None and result.size_ratios is None and result.yardstick_ratio > 0


@pytest.fixture(scope="module")
def tuned_layer(tmp_path_factory):
    """The dynamic layer tuned at b = 5 and 40 (6 random trials), its study and tuning DB in a tmp dir."""
    folder = tmp_path_factory.mktemp("dynamic-study")
    url, db = sqlite_url(folder / "studies.sqlite"), folder / "tuned.sqlite"
    layer, x, w = dynamic_layer()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOOPTOOL_TUNING_DB", str(db))
        tuning_db.forget_memo()
        result = tuner.tune(layer.tensor(x, w), trials=6, storage=url, seed=0, progress=False, repeats=2,
                            sampler="random", sizes={"b": [5, 40]})
    return layer, x, w, result, url, db


def test_a_tuned_dynamic_study_measures_at_the_named_sizes(tuned_layer):
    layer, x, w, result, url, _ = tuned_layer
    study = optuna.load_study(study_name=result.study.study_name, storage=url)
    program = program_of(layer.tensor(x, w))
    assert study.study_name == study_name_for(program, 1, sizes={"b": [5, 40]}) and study.study_name.endswith("-b5,40")
    assert study.user_attrs["measured_sizes"] == [{"b": 5}, {"b": 40}]
    complete = [t for t in study.trials if t.state == S.COMPLETE]
    assert complete
    for trial in complete:
        ratios = trial.user_attrs["size_ratios"]
        assert len(ratios) == 2
        assert trial.value == pytest.approx(math.sqrt(ratios[0] * ratios[1]) * study.user_attrs["yardstick_seconds"],
                                            rel=1e-9)
    assert "measured at b = 5, 40: times are the geometric mean over these sizes of seconds per row" \
        in result.summary()


def test_every_measured_schedule_is_legal_for_every_size(tuned_layer):
    layer, x, w, result, url, _ = tuned_layer
    study = optuna.load_study(study_name=result.study.study_name, storage=url)
    tensor = layer.tensor(x, w)
    for trial in study.trials:
        if trial.state == S.COMPLETE:
            legal, reason = tensor.loop_tree(trial.user_attrs["schedule"]).check()
            assert legal, reason
    assert result.best_tree.check()[0]


def test_the_tuned_schedule_runs_at_sizes_never_measured(tuned_layer, monkeypatch):
    """`lt.function` takes the stored schedule at any size (one lookup: the workload has no size), and
    it matches float64 at 1, sizes below its split factor, and sizes off every tile."""
    layer, x, w, result, _, db = tuned_layer
    monkeypatch.setenv("LOOPTOOL_TUNING_DB", str(db))
    tuning_db.forget_memo()
    stored = result.best_tree.schedule.to_json()
    target = cpu.HostTarget.get().name
    assert tuning_db.lookup(program_of(layer.tensor(x[:3], w)), target, path=db) == stored
    factors = [step[3] for step in result.best_tree.schedule.steps if step[0] == "split" and step[2].startswith("b")]
    assert factors and max(factors) > 2, result.best_tree.schedule.steps     # so sizes 1 and 2 are below it
    rng = np.random.default_rng(1)
    for size in (1, 2, max(factors) - 1, max(factors) + 1, 300, 1001):
        xs = rng.standard_normal((size, x.shape[1])).astype(np.float32)
        assert layer.loop_tree(xs, w).schedule.to_json() == stored
        assert rel_err(layer(xs, w), np.maximum(xs.astype(np.float64) @ w.astype(np.float64), 0)) < 1e-5


def test_a_study_measured_at_other_sizes_is_refused(tuned_layer):
    layer, x, w, result, url, _ = tuned_layer
    with pytest.raises(ValueError, match=r"measured at sizes \[\{'b': 5\}, \{'b': 40\}\], not \[\{'b': 6\}\]"):
        tuner.tune(layer.tensor(x, w), trials=6, storage=url, study_name=result.study.study_name, progress=False,
                   sizes={"b": [6]})


def test_cli_tune_takes_sizes(tmp_path):
    url = sqlite_url(tmp_path / "cli.sqlite")
    done = subprocess.run(looptool_cli("tune", "tuner_helpers:dynamic_layer_tensor", "--trials", "2", "--storage",
                                       url, "--seed", "0", "--sizes", "b=3,33"),
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=subprocess_env(tuning_db=tmp_path / "tuned.sqlite"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "measured at b = 3, 33" in done.stdout, done.stdout
    study = optuna.load_study(study_name=optuna.get_all_study_names(url)[0], storage=url)
    assert study.user_attrs["measured_sizes"] == [{"b": 3}, {"b": 33}]
    bad = subprocess.run(looptool_cli("tune", "tuner_helpers:dynamic_layer_tensor", "--storage", url,
                                      "--sizes", "b=3,x"), capture_output=True, text=True, timeout=300, cwd=REPO,
                         env=subprocess_env(tuning_db=tmp_path / "tuned.sqlite"))
    assert bad.returncode != 0 and "--sizes 'b=3,x': write DIM=SIZE,SIZE,..." in bad.stderr


@pytest.mark.gpu
def test_a_gpu_study_of_a_dynamic_program_measures_at_the_named_sizes(tmp_path, monkeypatch):
    """On the GPU too: each trial runs at every size named (checked against the default schedule there),
    its seconds the geometric mean of seconds per row; `.cuda()` then runs the stored schedule at sizes
    never measured."""
    from tests.gpu_helpers import cupy_or_skip
    cp = cupy_or_skip()
    monkeypatch.setenv("LOOPTOOL_TUNING_DB", str(tmp_path / "tuned.sqlite"))
    tuning_db.forget_memo()
    layer, x, w = dynamic_layer()
    url = sqlite_url(tmp_path / "gpu.sqlite")
    result = tuner.tune(layer.tensor(x, w), trials=6, storage=url, seed=0, progress=False, repeats=2,
                        sampler="random", device="gpu", sizes={"b": [5, 300]})
    study = optuna.load_study(study_name=result.study.study_name, storage=url)
    assert study.user_attrs["measured_sizes"] == [{"b": 5}, {"b": 300}]
    complete = [t for t in study.trials if t.state == S.COMPLETE]
    assert complete and all(t.user_attrs.get("gpu") for t in complete)
    rng = np.random.default_rng(2)
    for size in (1, 37, 1000):
        xs = rng.standard_normal((size, x.shape[1])).astype(np.float32)
        got = cp.asnumpy(layer(cp.asarray(xs), cp.asarray(w)))
        assert rel_err(got, np.maximum(xs.astype(np.float64) @ w.astype(np.float64), 0)) < 1e-5
