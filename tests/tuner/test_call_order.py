"""A CPU trial is timed against the yardstick in two call orders, each kernel right after the other
and each right after itself, and scored by the slower: a kernel whose speed depends on what ran before
it, or that slows the yardstick run after it, is never kept for a speed it has in one order only.
Timed on a fake clock that the fake kernels advance, so nothing here depends on this machine's speed."""
from __future__ import annotations

import pytest

from tuner import worker


class Clock:
    """perf_counter's stand-in: advanced only by the fake kernels."""

    def __init__(self):
        self.now, self.last = 0.0, None

    def __call__(self) -> float:
        return self.now


class FakeKernel:
    """Takes `after_other` seconds of the clock, or `after_self` when it ran last."""

    def __init__(self, clock: Clock, after_other: float, after_self: float):
        self.clock, self.after_other, self.after_self = clock, after_other, after_self

    def __call__(self, inputs):
        self.clock.now += self.after_self if self.clock.last is self else self.after_other
        self.clock.last = self


@pytest.fixture
def clock(monkeypatch):
    made = Clock()
    monkeypatch.setattr(worker.time, "perf_counter", made)
    return made


def test_a_kernel_as_fast_in_either_order_is_scored_by_its_time_over_the_yardstick(clock):
    ratio, spent = worker._paired_runs(FakeKernel(clock, 0.5, 0.5), FakeKernel(clock, 2.0, 2.0), None, 5)
    assert ratio == pytest.approx(0.25)
    assert spent == pytest.approx(2.5 + 5 * (2.0 + 2.0 + 0.5 + 0.5))        # the warm-up runs counted too


@pytest.mark.parametrize("after_other, after_self, score", [(0.5, 0.9, 0.9), (0.7, 0.5, 0.7)])
def test_a_kernel_whose_speed_depends_on_the_call_before_is_scored_by_its_slower_order(clock, after_other,
                                                                                       after_self, score):
    ratio, _ = worker._paired_runs(FakeKernel(clock, after_other, after_self), FakeKernel(clock, 1.0, 1.0), None, 7)
    assert ratio == pytest.approx(score)


class Polluter(FakeKernel):
    """A kernel after which the yardstick's next run takes `slowed` seconds (it evicts what the
    yardstick keeps in cache)."""

    def __init__(self, clock: Clock, seconds: float, yardstick: FakeKernel, slowed: float):
        super().__init__(clock, seconds, seconds)
        self.yardstick, self.slowed = yardstick, slowed

    def __call__(self, inputs):
        super().__call__(inputs)
        self.yardstick.after_other = self.slowed


def test_a_kernel_that_slows_the_yardstick_after_it_is_scored_against_the_yardstick_after_itself(clock):
    """Timed only right after the kernel, the yardstick took 2.0 and the kernel looked 4x faster; each
    after itself, they take 1.0 and 0.5."""
    yardstick = FakeKernel(clock, 1.0, 1.0)
    ratio, _ = worker._paired_runs(Polluter(clock, 0.5, yardstick, 2.0), yardstick, None, 5)
    assert ratio == pytest.approx(0.5)
