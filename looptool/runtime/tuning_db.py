"""The tuning database: the best known schedule per workload, shared by every process.

A workload is a program (computation structure, shapes, strides, dtypes) on a
target (CPU name and features).  The tuner writes the best schedule it found;
`Tensor.numpy()` looks it up and uses it instead of the default schedule.  It is
one SQLite file, by default `~/.cache/looptool/tuned.sqlite`; set
`LOOPTOOL_TUNING_DB` to move it, or to an empty string to turn lookups off.
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


def default_path() -> Path | None:
    """Where the tuning database lives (None when lookups are turned off)."""
    configured = os.environ.get("LOOPTOOL_TUNING_DB")
    if configured == "":
        return None
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "looptool" / "tuned.sqlite"


@functools.lru_cache(maxsize=1024)
def workload_key(program: Program) -> str:
    """A stable hash of a program's structure, shapes, strides and dtypes (worked out once per
    program: every call without a schedule looks its workload up)."""
    return hashlib.sha256(repr(program).encode()).hexdigest()[:32]


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=30)
    conn.execute("CREATE TABLE IF NOT EXISTS best (key TEXT, target TEXT, schedule TEXT, seconds REAL, "
                 "description TEXT, measured_at REAL, PRIMARY KEY (key, target))")
    return conn


def store(program: Program, target: str, schedule_json: str, seconds: float, description: str = "",
          path: Path | None = None) -> bool:
    """Record a schedule for this workload if it beats the one stored; True when stored."""
    path = path or default_path()
    if path is None:
        return False
    key = workload_key(program)
    with _LOCK, _connect(path) as conn:
        row = conn.execute("SELECT seconds FROM best WHERE key=? AND target=?", (key, target)).fetchone()
        if row is not None and row[0] <= seconds:
            return False
        conn.execute("INSERT OR REPLACE INTO best VALUES (?, ?, ?, ?, ?, ?)",
                     (key, target, schedule_json, seconds, description, time.time()))
        _MEMO.pop((str(path), key, target), None)
        _GENERATION[0] += 1
    return True


def lookup(program: Program, target: str, path: Path | None = None) -> str | None:
    """The stored schedule JSON for this workload and target, or None."""
    path = path or default_path()
    if path is None or not path.exists():
        return None
    key = workload_key(program)
    memo_key = (str(path), key, target)
    if memo_key not in _MEMO:
        with _LOCK, _connect(path) as conn:
            row = conn.execute("SELECT schedule FROM best WHERE key=? AND target=?", (key, target)).fetchone()
        _MEMO[memo_key] = row[0] if row else None
        if row:
            log.debug("using the tuned schedule for workload %s on %s from %s", key, target, path)
    return _MEMO[memo_key]


def forget_memo():
    """Drop the in-process memo of lookups (after another process wrote the database)."""
    _MEMO.clear()
    _GENERATION[0] += 1


def generation() -> int:
    """A number that changes whenever this process stores a schedule or forgets its memo: what was
    looked up under an older one may be stale."""
    return _GENERATION[0]
