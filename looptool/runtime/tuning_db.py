"""The tuning database: the best known schedule per workload, shared by every process.

A workload is a program (computation structure, shapes, strides, dtypes) on a
target (CPU name and features, or GPU name and compute capability).  The tuner
writes the best schedule it found; `Tensor.numpy()` and `.cuda()` look it up and
use it instead of the automatic schedule.  By default it is one SQLite file,
`~/.cache/looptool/tuned.sqlite`; `LOOPTOOL_TUNING_DB` moves it: a file path, an
SQLAlchemy URL (`postgresql://host/db`: one database for a fleet of machines), or
an empty string to turn lookups off.  A store keeps the faster schedule in one
statement, so concurrent writers keep the best; a database that cannot be reached
is reported once, left alone for a minute at a time, and lookups give the automatic
schedule meanwhile.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path

from ..ir import Program

log = logging.getLogger("looptool")
_LOCK = threading.Lock()
_MEMO: dict[tuple[str, str, str], str | None] = {}
_GENERATION = [0]          # counts the writes and memo resets of this process
_DOWN: dict[str, float] = {}        # database -> when this process last failed to reach it
_REPORTED: set[str] = set()         # databases already reported as unreachable by this process
CREATE = ("CREATE TABLE IF NOT EXISTS best (key TEXT, target TEXT, schedule TEXT, seconds DOUBLE PRECISION, "
          "description TEXT, measured_at DOUBLE PRECISION, PRIMARY KEY (key, target))")
UPSERT = ("INSERT INTO best VALUES (:key, :target, :schedule, :seconds, :description, :measured_at) "
          "ON CONFLICT (key, target) DO UPDATE SET schedule = excluded.schedule, seconds = excluded.seconds, "
          "description = excluded.description, measured_at = excluded.measured_at "
          "WHERE excluded.seconds < best.seconds")
SELECT = "SELECT schedule FROM best WHERE key = :key AND target = :target"
CONNECT_SECONDS = 5        # how long a server may take to answer before it counts as unreachable
RETRY_SECONDS = 60         # how long an unreachable database is left alone before it is tried again


def default_path() -> Path | str | None:
    """Where the tuning database lives: a file path, an SQLAlchemy URL (a string), or None when lookups
    are turned off."""
    configured = os.environ.get("LOOPTOOL_TUNING_DB")
    if configured == "":
        return None
    if configured:
        return configured if is_url(configured) else Path(configured)
    return Path.home() / ".cache" / "looptool" / "tuned.sqlite"


def _location(path: Path | str | None) -> Path | str | None:
    """The database to use: `path` (a file path or an SQLAlchemy URL), else `default_path()`."""
    if path is None:
        return default_path()
    return path if is_url(path) else Path(path)


def is_url(location) -> bool:
    """Whether a tuning database location is an SQLAlchemy URL rather than a file path."""
    return isinstance(location, str) and "://" in location


@functools.lru_cache(maxsize=1024)
def workload_key(program: Program) -> str:
    """A stable hash of a program's structure, shapes, strides and dtypes (worked out once per
    program: every call without a schedule looks its workload up)."""
    return hashlib.sha256(repr(program).encode()).hexdigest()[:32]


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=30)
    conn.execute(CREATE)
    return conn


@functools.lru_cache(maxsize=8)
def _engine(url: str):
    """An SQLAlchemy engine for a database URL, its table made (SQLAlchemy is imported only for URLs)."""
    import sqlalchemy
    connect_args = {"connect_timeout": CONNECT_SECONDS} if url.startswith("postgresql") else {}
    engine = sqlalchemy.create_engine(url, connect_args=connect_args, pool_pre_ping=True)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text(CREATE))
    return engine


def _execute(location: Path | str, statement: str, params: dict):
    """Run one statement in its own transaction: (rows fetched for a SELECT, else rows changed)."""
    if is_url(location):
        import sqlalchemy
        with _engine(location).begin() as conn:
            result = conn.execute(sqlalchemy.text(statement), params)
            return result.fetchall() if result.returns_rows else result.rowcount
    with _connect(location) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if statement.startswith("SELECT") else cursor.rowcount


def _down(location) -> bool:
    """Whether the database failed this process less than RETRY_SECONDS ago (it is not tried then)."""
    failed = _DOWN.get(str(location))
    return failed is not None and time.monotonic() - failed < RETRY_SECONDS


def _unreachable(location, err: Exception) -> None:
    """Leave a database that could not be used alone for RETRY_SECONDS; report it once per process."""
    name = str(location)
    _DOWN[name] = time.monotonic()
    if name not in _REPORTED:
        _REPORTED.add(name)
        log.warning("the tuning database %s cannot be used (%s: %s); tuned schedules are not looked up or "
                    "stored until it can, the automatic schedules run", name, type(err).__name__,
                    str(err).splitlines()[0] if str(err) else "")


def store(program: Program, target: str, schedule_json: str, seconds: float, description: str = "",
          path: Path | str | None = None) -> bool:
    """Record a schedule for this workload if it beats the one stored (one statement: concurrent writers
    keep the faster); True when stored."""
    location = _location(path)
    if location is None or _down(location):
        return False
    key = workload_key(program)
    params = {"key": key, "target": target, "schedule": schedule_json, "seconds": seconds,
              "description": description, "measured_at": time.time()}
    try:
        with _LOCK:
            changed = _execute(location, UPSERT, params)
    except Exception as err:        # an unreachable or broken database must not end a tuning run
        _unreachable(location, err)
        return False
    _MEMO.pop((str(location), key, target), None)
    _GENERATION[0] += 1
    return changed > 0


def lookup(program: Program, target: str, path: Path | str | None = None) -> str | None:
    """The stored schedule JSON for this workload and target, or None (also where the database cannot be
    reached: reported once). Remembered per process, so a call path looks a workload up once."""
    location = _location(path)
    if location is None or (not is_url(location) and not location.exists()) or _down(location):
        return None
    key = workload_key(program)
    memo_key = (str(location), key, target)
    if memo_key not in _MEMO:
        try:
            with _LOCK:
                rows = _execute(location, SELECT, {"key": key, "target": target})
        except Exception as err:    # the automatic schedule runs; never an exception in .numpy()
            _unreachable(location, err)
            return None
        _MEMO[memo_key] = rows[0][0] if rows else None
        if rows:
            log.debug("using the tuned schedule for workload %s on %s from %s", key, target, location)
    return _MEMO[memo_key]


def forget_memo():
    """Drop the in-process memo of lookups (after another process wrote the database)."""
    _MEMO.clear()
    _GENERATION[0] += 1


def generation() -> int:
    """A number that changes whenever this process stores a schedule or forgets its memo: what was
    looked up under an older one may be stale."""
    return _GENERATION[0]
