"""Helpers for tests/tuner/test_tuner.py: tiny workloads with float64 references, storage URLs,
subprocess environments, trial-state checks and a throw-away PostgreSQL cluster.

Importable from a subprocess too (put tests/ on PYTHONPATH), so a fresh process can
rebuild exactly the same computation (same shapes, strides, dtypes and data)."""
from __future__ import annotations

import glob
import importlib.util
import math
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# Workloads ------------------------------------------------------------------------------

@dataclass
class Case:
    """A lazy looptool tensor and the float64 NumPy reference for its result (in .dims order)."""

    name: str
    tensor: object
    reference: np.ndarray


def matmul_case(m: int = 24, k: int = 20, n: int = 28, seed: int = 0, dtype=np.float32) -> Case:
    import looptool as lt
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    s = lt.symbols("m k n")
    c = (lt.Tensor(a).to(s.m, s.k) * lt.Tensor(b).to(s.k, s.n)).sum(s.k)
    return Case(f"matmul:{m}x{k}x{n}", c, a.astype(np.float64) @ b.astype(np.float64))


def softmax_case(rows: int = 8, cols: int = 16, seed: int = 0, dtype=np.float32) -> Case:
    import looptool as lt
    x_np = np.random.default_rng(seed).standard_normal((rows, cols)).astype(dtype)
    m, n = lt.symbols("m n")
    x = lt.Tensor(x_np).to(m, n)
    e = (x - x.max(n)).exp()
    x64 = x_np.astype(np.float64)
    ex = np.exp(x64 - x64.max(1, keepdims=True))
    return Case(f"softmax:{rows}x{cols}", e / e.sum(n), ex / ex.sum(1, keepdims=True))


def layernorm_case(rows: int = 8, cols: int = 16, seed: int = 0, dtype=np.float32) -> Case:
    import looptool as lt
    rng = np.random.default_rng(seed)
    x_np = rng.standard_normal((rows, cols)).astype(dtype)
    g_np = rng.standard_normal(cols).astype(dtype)
    b_np = rng.standard_normal(cols).astype(dtype)
    m, n = lt.symbols("m n")
    x = lt.Tensor(x_np).to(m, n)
    centered = x - x.mean(n)
    y = centered / ((centered * centered).mean(n) + 1e-5).sqrt() * lt.Tensor(g_np).to(n) + lt.Tensor(b_np).to(n)
    x64 = x_np.astype(np.float64)
    mu = x64.mean(1, keepdims=True)
    ref = (x64 - mu) / np.sqrt(x64.var(1, keepdims=True) + 1e-5) * g_np.astype(np.float64) + b_np.astype(np.float64)
    return Case(f"layernorm:{rows}x{cols}", y, ref)


CASES = {"matmul": matmul_case, "softmax": softmax_case, "layernorm": layernorm_case}


def rel_err(got, ref) -> float:
    """max|got - ref| / max|ref|, in float64."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"shape {got.shape} != reference shape {ref.shape}"
    return float(np.abs(got - ref).max() / max(float(np.abs(ref).max()), 1e-300))


def unwritten_stages(tree) -> list[str]:
    """Computed stages of the program that no statement of the printed loop tree writes.

    A legal schedule must keep every stage; one that lost a stage reads an uninitialised buffer."""
    text = str(tree)
    return [st.name for st in tree.program.stages
            if not re.search(rf"^\s*{re.escape(st.name)}(\[[^\]]*\])? (=|\+=) ", text, re.MULTILINE)]


# Storages, environments, subprocesses ----------------------------------------------------

def sqlite_url(path: Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


def subprocess_env(storage: str | None = None, tuning_db: Path | None = None) -> dict:
    """This environment plus the repo and tests/ on PYTHONPATH and the tuner's env vars."""
    env = dict(os.environ)
    paths = [str(REPO), str(TESTS)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if storage is not None:
        env["LOOPTOOL_STORAGE"] = storage
    if tuning_db is not None:
        env["LOOPTOOL_TUNING_DB"] = str(tuning_db)
    return env


def looptool_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "looptool", *args]


# Trial states ---------------------------------------------------------------------------

def finished_states():
    import optuna
    S = optuna.trial.TrialState
    return (S.COMPLETE, S.PRUNED, S.FAIL)


def count_finished(study) -> int:
    return sum(t.state in finished_states() for t in study.trials)


def assert_trials_consistent(study, tensor, stale=()) -> dict:
    """The tuner's invariants on a study's trials; returns the trials grouped by state name.

    PRUNED: a "rejected" reason, never timed (no timing attrs, no value), and when it carries a
    schedule the schedule really is illegal.  COMPLETE: a legal stored schedule, timed, with a value;
    on a CPU that value is its yardstick ratio times the study's one yardstick time, whichever
    process or worker measured it.  FAIL: a "failure" reason.  Trial numbers are 0..K-1 without
    gaps.  Trials numbered in `stale` (running when their process was killed) may be RUNNING, or FAIL
    without a reason (heartbeat); no other trial may be left unfinished."""
    import optuna
    S = optuna.trial.TrialState
    timing = ("compile_seconds", "relative_error", "overhead_seconds")
    groups: dict[str, list] = {}
    for t in study.trials:
        groups.setdefault(t.state.name, []).append(t)
        attrs = t.user_attrs
        if t.state == S.PRUNED:
            assert isinstance(attrs.get("rejected"), str) and attrs["rejected"], f"trial {t.number}: {attrs}"
            assert not set(timing) & set(attrs), f"pruned trial {t.number} was timed: {attrs}"
            assert t.value is None
            if "schedule" in attrs:   # drawn, then refused by the legality check
                legal, reason = tensor.loop_tree(attrs["schedule"]).check()
                assert not legal, f"pruned trial {t.number} was legal: {attrs['rejected']}"
        elif t.state == S.COMPLETE:
            legal, reason = tensor.loop_tree(attrs["schedule"]).check()
            assert legal, f"complete trial {t.number} has an illegal schedule: {reason}"
            assert "compile_seconds" in attrs and "rejected" not in attrs and "failure" not in attrs
            assert t.value is not None and t.value > 0
            if "yardstick_ratio" in attrs:
                scaled = attrs["yardstick_ratio"] * study.user_attrs["yardstick_seconds"]
                assert math.isclose(t.value, scaled, rel_tol=1e-12), f"trial {t.number} timed on another scale"
        elif t.state == S.FAIL:
            assert "rejected" not in attrs
            assert attrs.get("failure") or t.number in stale, f"failed trial {t.number} without a reason: {attrs}"
        else:
            assert t.state == S.RUNNING and t.number in stale, f"trial {t.number} left {t.state.name}"
    numbers = sorted(t.number for t in study.trials)
    assert numbers == list(range(len(numbers))), f"trial numbers with gaps or duplicates: {numbers}"
    return groups


# PostgreSQL -----------------------------------------------------------------------------

def postgres_driver() -> str | None:
    """The SQLAlchemy dialect+driver to use, or None when no PostgreSQL driver is importable."""
    if importlib.util.find_spec("psycopg2") is not None:
        return "postgresql+psycopg2"
    if importlib.util.find_spec("psycopg") is not None:
        return "postgresql+psycopg"
    return None


def postgres_bindir() -> Path | None:
    """A directory with initdb and pg_ctl: $PATH first, then Debian's /usr/lib/postgresql/<ver>/bin."""
    found = shutil.which("initdb")
    candidates = [Path(found).parent, Path(found).resolve().parent] if found else []

    def version(path: str):
        return [int(p) for p in re.findall(r"\d+", path)] or [0]
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)]
    candidates += [Path("/usr/pgsql/bin"), Path("/usr/local/pgsql/bin")]
    for path in candidates:
        if (path / "initdb").exists() and (path / "pg_ctl").exists():
            return path
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresCluster:
    """A private PostgreSQL cluster in a temporary directory, on 127.0.0.1 and a free port.

    As root the server runs as the `postgres` user (through runuser, else su)."""

    def __init__(self, bindir: Path, driver: str):
        self.bindir, self.driver = bindir, driver
        self.root = self.data = None
        self.port = None
        self.prefix: list[str] = []
        self.url = None

    @staticmethod
    def missing_user() -> str | None:
        """Why the server cannot run here (None when it can)."""
        if os.geteuid() != 0:
            return None
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run the PostgreSQL server as"
        if not (shutil.which("runuser") or shutil.which("su")):
            return "running as root and neither runuser nor su is available to switch to 'postgres'"
        return None

    def _run(self, *argv: str, timeout: float = 120):
        argv = [str(a) for a in argv]
        if os.geteuid() == 0:
            if shutil.which("runuser"):
                argv = ["runuser", "-u", "postgres", "--", *argv]
            else:
                argv = ["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(argv)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done

    def start(self) -> str:
        self.root = Path(tempfile.mkdtemp(prefix="looptool-pg-"))
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self.data = self.root / "data"
        self._run(self.bindir / "initdb", "-D", self.data, "-U", "postgres", "-A", "trust", "-E", "UTF8",
                  "--no-sync")
        self.port = free_port()
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                   f"-c synchronous_commit=off -c full_page_writes=off")
        self.options = options
        self.resume()
        if (self.bindir / "createdb").exists():
            self._run(self.bindir / "createdb", "-h", "127.0.0.1", "-p", self.port, "-U", "postgres", "looptool")
        else:
            self._create_database_with_the_driver("looptool")
        self.url = f"{self.driver}://postgres@127.0.0.1:{self.port}/looptool"
        return self.url

    def _create_database_with_the_driver(self, name: str):
        import sqlalchemy
        engine = sqlalchemy.create_engine(f"{self.driver}://postgres@127.0.0.1:{self.port}/postgres",
                                          isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
        finally:
            engine.dispose()

    def pause(self):
        """Stop the server (fast: open connections are cut), keeping its data for `resume`."""
        self._run(self.bindir / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "-t", "60", "stop")

    def resume(self):
        """Start the server on its data and port (again, after `pause`)."""
        self._run(self.bindir / "pg_ctl", "-D", self.data, "-l", self.root / "server.log", "-w", "-t", "60",
                  "-o", self.options, "start")

    def log(self) -> str:
        try:
            return (self.root / "server.log").read_text()
        except OSError:
            return ""

    def stop(self):
        try:
            if self.data is not None and (self.data / "postmaster.pid").exists():
                self._run(self.bindir / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "-t", "60", "stop")
        finally:
            if self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)


def dynamic_layer(rows: int = 10, k: int = 24, n: int = 40, seed: int = 0):
    """relu(x @ w) as an `lt.function` over a dynamic row dim 'b', and its example arrays x (rows x k)
    and w (k x n): (function, x, w)."""
    import looptool as lt
    b = lt.symbols("b", dynamic=True)[0]
    k_dim, n_dim = lt.symbols("k n")

    @lt.function
    def layer(x: lt.In[b, k_dim], w: lt.In[k_dim, n_dim]):
        return lt.relu((x * w).sum(k_dim))
    rng = np.random.default_rng(seed)
    return layer, rng.standard_normal((rows, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)


def dynamic_layer_tensor():
    """`dynamic_layer`'s result on its example arrays, as a tensor (a workload for `looptool tune`)."""
    layer, x, w = dynamic_layer()
    return layer.tensor(x, w)
