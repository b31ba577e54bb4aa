"""Tuning a whole program: one trial budget shared over its kernels, as Ansor's task scheduler does.

The program's time is sum(weight_i * best_seconds_i) (weight: how often kernel i runs per program
run).  After one round for every kernel, each next round goes to the kernel whose next trials
promise to save the most program time: its weight times a blend of how fast its best time fell
over its last round (backward) and the rate it would keep if its best time so far had been earned
evenly (forward, the optimistic guess of Ansor's scheduler).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from .costmodel import BATCH

BACKWARD_SHARE = 0.5      # weight of the observed recent rate against the optimistic one


@dataclass
class Task:
    """One kernel of the program: its weight and its best time after each of its trials."""

    name: str
    weight: float = 1.0
    history: list[float] = field(default_factory=list)

    @property
    def best(self) -> float:
        return min(self.history, default=math.inf)

    def time_to_save(self, window: int = BATCH) -> float:
        """Program seconds one more trial is expected to save."""
        trials = len(self.history)
        if trials == 0 or math.isinf(self.best):
            return math.inf
        back = self.history[max(0, trials - window - 1)]
        backward = (back - self.best) / min(window, trials) if not math.isinf(back) else self.best / trials
        forward = self.best / trials
        return self.weight * (BACKWARD_SHARE * backward + (1 - BACKWARD_SHARE) * forward)


def allocate(tasks: list[Task], budget: int, run_round: Callable[[int, int], list[float]],
             round_trials: int = BATCH) -> list[Task]:
    """Spend `budget` trials over `tasks`, `round_trials` at a time: every task once, then always the
    one with the most time to save.  `run_round(i, n)` runs n more trials of task i and returns its
    best time after each of them."""
    spent = 0
    order = list(range(len(tasks)))
    while spent < budget:
        pending = [i for i in order if not tasks[i].history]
        index = pending[0] if pending else max(order, key=lambda i: tasks[i].time_to_save(round_trials))
        count = min(round_trials, budget - spent)
        tasks[index].history += run_round(index, count)
        spent += count
    return tasks
