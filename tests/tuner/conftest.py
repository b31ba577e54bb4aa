"""Fixtures of the tuner's tests."""
import pytest

from looptool.runtime import tuning_db
from tests.tuner_helpers import sqlite_url


@pytest.fixture(autouse=True)
def isolated_tuner_env(tmp_path, monkeypatch):
    """Default storage and tuning DB in this test's tmp dir; a fresh lookup memo."""
    monkeypatch.setenv("LOOPTOOL_STORAGE", sqlite_url(tmp_path / "default-studies.sqlite"))
    monkeypatch.setenv("LOOPTOOL_TUNING_DB", str(tmp_path / "default-tuned.sqlite"))
    tuning_db.forget_memo()
    yield
    tuning_db.forget_memo()
