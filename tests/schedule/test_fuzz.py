"""Property-based fuzzing of schedules.

Each draw picks a computation (matmul, matmul + bias + relu, a matmul chain,
softmax, layer-norm, row/column sums of exp, 1-d and 2-d convolutions written
with windows, max-pool, pointwise chains with broadcasting, reductions over
different dims feeding one output), sizes 1..40 (odd ones favoured), float32 or
float64, input layouts embedded in NaN-poisoned memory (padded, transposed or
contiguous), and a random transform sequence: splits by any factor (non-divisors
and factors larger than the loop included), permutations of a stage's own loops,
unroll of small loops, vectorize of the innermost loop, parallel of an outer loop,
placement of producers into their readers at any depth.

The property: either a transform refuses to build (ValueError) or `check()`
rejects the schedule, or the compiled kernel -- writing into a slice of a
canary-filled array -- matches NumPy (float64 reference, rel. err. < 1e-5 in
float32) and leaves the canaries untouched.  Legal draws also round-trip through
JSON onto the computation built again.

CI runs a few hundred draws (derandomized, so runs are reproducible); the `slow`
variant runs 10,000 fresh ones: `pytest -m slow tests/schedule/test_fuzz.py`.
"""
import collections

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import looptool as lt
from tests.schedule_helpers import HypothesisChooser, Rejected, draw_case, random_steps, run_guarded, steps_text

CI_DRAWS = 250
SLOW_DRAWS = 10_000

STATS = collections.Counter()

COMMON = dict(deadline=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much])


def fuzz_one(data, stats):
    ch = HypothesisChooser(data)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="data seed"))
    case = draw_case(ch, rng, max_size=40, poison=True)
    t = case.make()
    note(f"computation: {case.name} {case.sizes} {case.dtype}")
    try:
        tree, steps = random_steps(t.loop_tree(), ch, max_steps=6)
    except Rejected as err:
        stats["rejected when built"] += 1
        note(f"rejected when built: {err}")
        return
    note(f"steps: {steps_text(steps)}\n{tree}")
    legal, why = tree.check()
    if not legal:
        stats["rejected by check"] += 1
        note(f"rejected by check: {why}")
        return
    stats["legal"] += 1
    for step in steps:
        stats["op " + step[0]] += 1
    stats["kind " + case.name] += 1
    stats["legal, " + ("with " if any(s[0] == "place" and s[3] for s in steps) else "no ") + "placement"] += 1
    computed = {stmt.stage.name for stmt, _ in tree.statements()}
    missing = [s.name for s in tree.program.stages if s.name not in computed]
    assert not missing, f"judged legal, but stage(s) {missing} are computed nowhere"
    result = run_guarded(t, tree, rng)
    case.check(result.value, f"compiled {steps_text(steps)}\n{tree}")
    # schedules are data: the same steps on the computation built again give the same tree
    text = tree.schedule.to_json()
    assert str(case.make().loop_tree(text)) == str(tree)


@settings(max_examples=CI_DRAWS, derandomize=True, **COMMON)
@given(st.data())
def test_fuzz_schedules(data):
    fuzz_one(data, STATS)


def test_fuzz_draws_were_mostly_meaningful():
    """Runs after test_fuzz_schedules: the draws must not be mostly rejected."""
    total = sum(STATS[k] for k in ("legal", "rejected by check", "rejected when built"))
    if not total:
        pytest.skip("test_fuzz_schedules did not run in this session")
    print(f"\nfuzz: {dict(STATS)}")
    assert STATS["legal"] >= total // 2, dict(STATS)
    assert STATS["legal, with placement"] > 0, dict(STATS)


@pytest.mark.slow
@settings(max_examples=SLOW_DRAWS, **COMMON)
@given(st.data())
def test_fuzz_schedules_many(data):
    if STATS["slow draws"] % 500 == 499:
        lt.clear_cache()  # thousands of JIT-compiled kernels add up
    STATS["slow draws"] += 1
    fuzz_one(data, STATS)
