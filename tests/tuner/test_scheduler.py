"""The whole-program task scheduler (tuner/scheduler.py), on simulated tuning curves: no kernel
is compiled.  One real tune_program run checks that the budget is shared and spent."""
from __future__ import annotations

import optuna
import pytest

import tuner
from tuner import scheduler

from tests.tuner_helpers import count_finished, matmul_case, softmax_case, sqlite_url


def _simulated(start_seconds: list[float], floor: float = 0.5, rate: float = 0.8):
    """run_round for kernels whose best time falls by `rate` a trial, down to `floor` of the start."""
    trials = [0] * len(start_seconds)

    def run_round(index, count):
        out = []
        for _ in range(count):
            trials[index] += 1
            out.append(start_seconds[index] * max(floor, rate ** trials[index]))
        return out
    return run_round


def test_more_trials_go_to_the_kernel_with_more_time_to_save():
    tasks = [scheduler.Task("small", 1.0), scheduler.Task("large", 1.0)]
    scheduler.allocate(tasks, 64, _simulated([0.001, 0.010]), round_trials=4)
    assert len(tasks[0].history) + len(tasks[1].history) == 64
    assert len(tasks[1].history) > 2 * len(tasks[0].history)


def test_weights_count_how_often_a_kernel_runs():
    """Equal kernels, but the second runs ten times per program run: it gets more trials."""
    tasks = [scheduler.Task("once", 1.0), scheduler.Task("ten-times", 10.0)]
    scheduler.allocate(tasks, 48, _simulated([0.004, 0.004]), round_trials=4)
    assert len(tasks[1].history) > len(tasks[0].history) >= 4


def test_a_kernel_that_stopped_improving_yields_to_one_that_still_improves():
    """Both are at 5 ms after 16 trials: one has been there all along, the other just got there."""
    tasks = [scheduler.Task("done"), scheduler.Task("improving")]
    tasks[0].history = [0.005] * 16
    tasks[1].history = [0.010 * 0.5 ** (n / 16) for n in range(1, 17)]
    assert tasks[1].time_to_save(4) > tasks[0].time_to_save(4)


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_tune_program_spends_one_budget_over_its_kernels_with_one_warm_worker_each(tmp_path, monkeypatch):
    """Three rounds of 8 trials: one for each kernel, the third for the matmul (its time is far
    larger than the small softmax's, so it has more to save).  Each kernel's worker starts once."""
    starts = []
    original = tuner.Measurer._start

    def counting_start(measurer):
        starts.append(measurer.node)
        original(measurer)
    monkeypatch.setattr(tuner.Measurer, "_start", counting_start)
    url = sqlite_url(tmp_path / "program.sqlite")
    cases = [matmul_case(256, 256, 256), softmax_case(8, 16)]
    results = tuner.tune_program([c.tensor for c in cases], trials=24, storage=url, seed=0, record=False)
    counts = [count_finished(optuna.load_study(study_name=r.study.study_name, storage=url)) for r in results]
    assert counts == [16, 8]
    assert all(r.best_tree is not None for r in results)
    assert len(starts) == 2 and starts[0] is not starts[1]
