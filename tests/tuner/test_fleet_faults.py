"""A fleet's faults on one PostgreSQL study (issue 30): a worker killed mid-study, and the database server
stopped for a while, lose no completed trial and leave every other process running to the end.

Each worker is its own `looptool tune` process (as on separate machines), sharing the study through a
throw-away PostgreSQL cluster (`postgres_cluster`, skipped with its reason where PostgreSQL is missing)."""
import signal
import subprocess
import time

import optuna
import pytest

from tests.tuner_helpers import REPO, count_finished, looptool_cli, subprocess_env

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
WORKLOAD = "matmul:24x20x28"


def start_worker(url: str, study: str, trials: int, seed: int, tuning_db) -> subprocess.Popen:
    return subprocess.Popen(looptool_cli("tune", WORKLOAD, "--trials", str(trials), "--storage", url,
                                         "--study", study, "--seed", str(seed)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            env=subprocess_env(tuning_db=tuning_db))


def wait_for_trials(url: str, study: str, count: int, limit: float = 240) -> optuna.Study:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            loaded = optuna.load_study(study_name=study, storage=url)
            if count_finished(loaded) >= count:
                return loaded
        except KeyError:          # the study is not made yet
            pass
        time.sleep(0.5)
    raise AssertionError(f"study {study} did not reach {count} finished trials in {limit} s")


def completed(study: optuna.Study) -> dict[int, float]:
    return {t.number: t.value for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE}


def test_killing_a_worker_loses_no_completed_trial_and_the_others_finish_the_study(postgres_url, tmp_path):
    first = start_worker(postgres_url, "fleet-kill", 40, 0, tmp_path / "a.sqlite")
    second = start_worker(postgres_url, "fleet-kill", 40, 1, tmp_path / "b.sqlite")
    before = completed(wait_for_trials(postgres_url, "fleet-kill", 6))
    second.send_signal(signal.SIGKILL)
    second.wait(timeout=60)
    out, _ = first.communicate(timeout=600)
    assert first.returncode == 0, out[-3000:]
    study = optuna.load_study(study_name="fleet-kill", storage=postgres_url)
    after = completed(study)
    assert all(after.get(number) == value for number, value in before.items())     # nothing completed was lost
    assert count_finished(study) >= 40 and len(after) >= 38


def test_a_database_stopped_for_a_while_loses_no_completed_trial_and_every_worker_goes_on(postgres_cluster, tmp_path):
    url = postgres_cluster.url
    workers = [start_worker(url, "fleet-outage", 40, seed, tmp_path / f"{seed}.sqlite") for seed in (0, 1)]
    before = completed(wait_for_trials(url, "fleet-outage", 6))
    postgres_cluster.pause()
    try:
        time.sleep(8)
        dead = [worker for worker in workers if worker.poll() is not None]
    finally:
        postgres_cluster.resume()
    assert not dead, "a worker ended while the server was stopped:\n" + dead[0].communicate()[0][-3000:]
    for worker in workers:
        out, _ = worker.communicate(timeout=600)
        assert worker.returncode == 0, out[-3000:]
        assert "study storage unreachable" in out
    study = optuna.load_study(study_name="fleet-outage", storage=url)
    after = completed(study)
    assert all(after.get(number) == value for number, value in before.items())
    assert count_finished(study) >= 40
