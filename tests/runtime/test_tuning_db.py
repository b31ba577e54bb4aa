"""The tuning database at a file path or an SQLAlchemy URL: the faster schedule kept (also by concurrent
writers), lookups keyed by target, and a database that cannot be reached reported once while the
automatic schedule runs. The PostgreSQL case (a real server) is in tests/tuner/test_tuner.py."""
import logging
import multiprocessing as mp
import time

import numpy as np
import pytest

import looptool as lt
from looptool import ir
from looptool.runtime import tuning_db
from tests.helpers import assert_close

UNREACHABLE = "sqlite:////proc/no-such-folder/tuned.sqlite"      # SQLite cannot create a file there


def matmul(rng, m=12, k=10, n=14):
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    sm, sk, sn = lt.symbols("m k n")
    return (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk), a.astype(np.float64) @ b


def locations(tmp_path):
    return [tmp_path / "tuned.sqlite", f"sqlite:///{tmp_path / 'tuned-url.sqlite'}"]


@pytest.mark.parametrize("kind", [0, 1], ids=["file", "url"])
def test_the_faster_schedule_is_kept_and_lookups_are_keyed_by_target(rng, tmp_path, kind):
    location = locations(tmp_path)[kind]
    program = ir.lower(matmul(rng)[0].node)[0]
    assert tuning_db.store(program, "cpu-a", '{"n": 1}', 2.0, path=location)
    assert not tuning_db.store(program, "cpu-a", '{"n": 2}', 3.0, path=location)      # slower: not kept
    assert tuning_db.store(program, "cpu-a", '{"n": 3}', 1.0, path=location)
    assert tuning_db.store(program, "cpu-b", '{"n": 4}', 9.0, path=location)
    assert tuning_db.lookup(program, "cpu-a", location) == '{"n": 3}'
    assert tuning_db.lookup(program, "cpu-b", location) == '{"n": 4}'
    assert tuning_db.lookup(program, "cpu-c", location) is None                         # another target's


def _store_many(location, seconds: list[float], program):
    for value in seconds:
        tuning_db.store(program, "cpu-a", f'{{"seconds": {value}}}', value, path=location)


@pytest.mark.parametrize("kind", [0, 1], ids=["file", "url"])
def test_concurrent_writers_keep_the_best(rng, tmp_path, kind):
    location = locations(tmp_path)[kind]
    program = ir.lower(matmul(rng)[0].node)[0]
    draws = rng.uniform(1.0, 2.0, size=(4, 25)).tolist()
    context = mp.get_context("spawn")
    writers = [context.Process(target=_store_many, args=(location, row, program)) for row in draws]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(120)
        assert writer.exitcode == 0
    best = min(min(row) for row in draws)
    tuning_db.forget_memo()
    assert tuning_db.lookup(program, "cpu-a", location) == f'{{"seconds": {best}}}'


def test_an_unreachable_database_is_reported_once_and_numpy_runs_the_automatic_schedule(rng, monkeypatch, caplog):
    monkeypatch.setattr(tuning_db, "_DOWN", {})
    monkeypatch.setattr(tuning_db, "_REPORTED", set())
    monkeypatch.setenv("LOOPTOOL_TUNING_DB", UNREACHABLE)
    c, ref = matmul(rng)
    program = ir.lower(c.node)[0]
    with caplog.at_level(logging.WARNING, logger="looptool"):
        assert tuning_db.lookup(program, "cpu-a") is None
        assert not tuning_db.store(program, "cpu-a", "{}", 1.0)
        assert_close(c.numpy(), ref, 1e-5)
        started = time.perf_counter()
        assert tuning_db.lookup(program, "cpu-b") is None          # left alone for RETRY_SECONDS: no new try
        assert time.perf_counter() - started < 0.01
    warnings = [r.getMessage() for r in caplog.records if "cannot be used" in r.getMessage()]
    assert len(warnings) == 1 and UNREACHABLE in warnings[0] and "automatic schedules run" in warnings[0]


def test_an_unreachable_database_is_tried_again_after_a_while(rng, tmp_path, monkeypatch):
    monkeypatch.setattr(tuning_db, "_DOWN", {})
    program = ir.lower(matmul(rng)[0].node)[0]
    location = tmp_path / "later" / "tuned.sqlite"
    (tmp_path / "later").write_text("a file where the database's folder should be")
    assert not tuning_db.store(program, "cpu-a", "{}", 1.0, path=location)
    (tmp_path / "later").unlink()
    assert not tuning_db.store(program, "cpu-a", "{}", 1.0, path=location)     # within RETRY_SECONDS: not tried
    monkeypatch.setattr(tuning_db, "RETRY_SECONDS", 0.0)
    assert tuning_db.store(program, "cpu-a", "{}", 1.0, path=location)
    assert tuning_db.lookup(program, "cpu-a", location) == "{}"
