"""Fixtures of the tuner's tests."""
import pytest

from looptool.runtime import tuning_db
from tests.tuner_helpers import PostgresCluster, postgres_bindir, postgres_driver, sqlite_url


@pytest.fixture(autouse=True)
def isolated_tuner_env(tmp_path, monkeypatch):
    """Default storage and tuning DB in this test's tmp dir; a fresh lookup memo."""
    monkeypatch.setenv("LOOPTOOL_STORAGE", sqlite_url(tmp_path / "default-studies.sqlite"))
    monkeypatch.setenv("LOOPTOOL_TUNING_DB", str(tmp_path / "default-tuned.sqlite"))
    tuning_db.forget_memo()
    yield
    tuning_db.forget_memo()


@pytest.fixture(scope="session")
def postgres_cluster():
    """A throw-away PostgreSQL cluster (initdb in a temp dir, 127.0.0.1, free port), started; its `url`.

    Needs the server binaries (Debian/Ubuntu: apt-get install postgresql), as root a `postgres`
    user (the Debian package creates it), and a driver (pip install psycopg2-binary)."""
    driver = postgres_driver()
    if driver is None:
        pytest.skip("no PostgreSQL driver importable: pip install psycopg2-binary (or psycopg)")
    bindir = postgres_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or in "
                    "/usr/lib/postgresql/*/bin: apt-get install postgresql")
    why = PostgresCluster.missing_user()
    if why:
        pytest.skip(why)
    cluster = PostgresCluster(bindir, driver)
    try:
        cluster.start()
    except Exception as err:
        cluster.stop()
        pytest.fail(f"could not start PostgreSQL from {bindir}: {err}\n{cluster.log()[-2000:]}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def postgres_url(postgres_cluster):
    """The URL of the throw-away PostgreSQL cluster's database."""
    return postgres_cluster.url
