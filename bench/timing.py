"""Interleaved timing: run several callables round-robin and keep each one's median."""
from __future__ import annotations

import gc
import os
import random
import statistics
import time
from dataclasses import dataclass


@dataclass
class Timing:
    """Per-call times in seconds of one callable."""

    times: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def best(self) -> float:
        return min(self.times)

    @property
    def spread(self) -> float | None:
        """Interquartile range over median: the run-to-run noise (None with fewer than 4 times)."""
        if len(self.times) < 4:
            return None
        q = statistics.quantiles(self.times, n=4)
        return (q[2] - q[0]) / self.median


def interleaved(fns, repeat: int | None = None, warmup: int = 2, budget: float = 3.0,
                min_repeat: int = 5, max_repeat: int = 60, before=None, shuffle: bool = False) -> list[Timing]:
    """Time zero-argument callables interleaved (a, b, a, b, ...) after `warmup` calls of each.

    With `repeat` None the number of rounds is chosen so that all rounds take about
    `budget` seconds, clamped to [min_repeat, max_repeat].  The garbage collector is
    off while timing.  `before`, if given, is called (untimed) before every timed call.
    With `shuffle`, each round runs them in another order (seeded), so that none always follows
    the same one (what a call leaves behind can cost the next one: bench.peers).
    Returns one Timing per callable, in order."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    if repeat is None:
        start = time.perf_counter()
        for fn in fns:
            fn()
        per_round = max(time.perf_counter() - start, 1e-9)
        repeat = max(min_repeat, min(max_repeat, int(budget / per_round)))
    times: list[list[float]] = [[] for _ in fns]
    enabled = gc.isenabled()
    gc.disable()
    try:
        order, shuffler = list(zip(fns, times)), random.Random(0)
        for _ in range(repeat):
            if shuffle:
                shuffler.shuffle(order)
            for fn, out in order:
                if before is not None:
                    before()
                start = time.perf_counter()
                fn()
                out.append(time.perf_counter() - start)
    finally:
        if enabled:
            gc.enable()
    return [Timing(t) for t in times]


def quiesce(max_wait: float = 0.2, window: float = 0.002) -> None:
    """Wait until this process's threads (e.g. OpenBLAS workers spinning after a call) stop using CPU."""
    deadline = time.perf_counter() + max_wait
    while time.perf_counter() < deadline:
        used = time.process_time()
        time.sleep(window)
        if time.process_time() - used < window / 4:
            return


def _busy_seconds() -> float | None:
    """CPU seconds all processes spent busy since boot (user+nice+system+irq+softirq+steal), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class ForeignLoad:
    """Measures how many cores other processes kept busy while the `with` block ran (None if unknown).

    The machine's busy time from /proc/stat minus this process's CPU time, per second of wall time."""

    def __enter__(self):
        self._busy, self._own, self._wall = _busy_seconds(), _own_seconds(), time.perf_counter()
        self.cores = None
        return self

    def __exit__(self, *exc):
        busy = _busy_seconds()
        wall = time.perf_counter() - self._wall
        if busy is not None and self._busy is not None and wall > 0:
            self.cores = max(0.0, (busy - self._busy) - (_own_seconds() - self._own)) / wall
        return False


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


def wait_until_quiet(max_wait: float, threshold: float = 0.25, window: float = 0.5) -> float | None:
    """Wait (at most `max_wait` s) for a `window` in which other processes use < `threshold` cores.

    Returns the foreign load of the last window seen."""
    deadline = time.perf_counter() + max_wait
    while True:
        with ForeignLoad() as load:
            time.sleep(window)
        if load.cores is None or load.cores < threshold or time.perf_counter() >= deadline:
            return load.cores
