"""Random programs from the whole frontend, against a float64 NumPy evaluation of the same
expression written independently of looptool (its interpreter included).

A program is an expression tree over named inputs (1 to 3 dims from a small pool, sizes
1..40, float32 or float64, sometimes mixed): pointwise unary and binary operations with
broadcasting by name and Python scalars, sum/max/min/mean over any of a term's dims (so
reductions chain), and the index views pad, window and concat.  Each draw runs under the
default schedule and under a random schedule (tests/schedule_helpers.random_steps) that the
isl check accepts.  Errors are measured against the largest magnitude computed on the way
(cancellation in float32 keeps only the digits float32 has for the values that cancel).
The programs and their references come from tests/random_program_helpers.py, which the GPU test
(tests/runtime/test_gpu_random_programs.py) draws from too.  CI runs a few dozen derandomized
draws; `-m slow` runs more fresh ones.
"""
from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from tests.helpers import rtol_for
from tests.random_program_helpers import COMMON, MAX_DEPTH, Builder, check
from tests.schedule_helpers import HypothesisChooser, Rejected, random_steps, steps_text

CI_DRAWS = 25
SLOW_DRAWS = 1_000


def run_one(data, stats):
    ch = HypothesisChooser(data)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="data seed"))
    builder = Builder(ch, rng)
    term = builder.term(ch.int(1, MAX_DEPTH))
    t = term.tensor
    note(f"dims {term.dims} sizes {builder.sizes} dtype {t.dtype}\n{t.loop_tree()}")
    assert tuple(str(d) for d in t.dims) == term.dims
    rtol = rtol_for(builder.dtype)   # a float32 program with a float64 input: float32 intermediates
    check(t.numpy(), term, rtol)
    stats["programs"] += 1
    try:
        tree, steps = random_steps(t.loop_tree(), ch, max_steps=5)
    except Rejected:
        return
    note(f"steps {steps_text(steps)}\n{tree}")
    if tree.check()[0]:
        stats["legal random schedules"] += 1
        check(t.numpy(tree), term, rtol)


STATS = collections.Counter()


@settings(max_examples=CI_DRAWS, derandomize=True, **COMMON)
@given(st.data())
def test_random_programs(data):
    run_one(data, STATS)


def test_random_programs_were_meaningful():
    """Runs after test_random_programs: most draws must have run, some under a random schedule."""
    if not STATS["programs"]:
        pytest.skip("test_random_programs did not run in this session")
    print(f"\nrandom programs: {dict(STATS)}")
    assert STATS["legal random schedules"] > 0, dict(STATS)


@pytest.mark.slow
@settings(max_examples=SLOW_DRAWS, **COMMON)
@given(st.data())
def test_random_programs_many(data):
    run_one(data, STATS)
