"""The isl check against the brute-force oracle (tests/analysis/oracle.py), both ways.

Each draw takes a small computation (dims 1..6) and a wild random schedule (any loop
vectorized or parallel, stages placed anywhere), and asks both for a verdict.  They must
agree, except where the isl check is stricter by design; each such rule is listed in
CONSERVATIVE with why, and counted:

- "vectorize innermost only": the code generator vectorizes a loop of statements; a loop
  with loops inside cannot be vectorized even when its lanes share no element.
- "one parallel loop per nest": parallelism is one level of threads; the oracle only asks
  that no parallel loop races.
- "no tile per SIMD lane": a buffer shrunk to one tile per iteration of a vectorized loop is
  refused outright (its lanes would need one tile each); the oracle only sees a problem when
  two lanes really share an element.
- "reduction recomputed redundantly": a reduction placed inside a consumer loop over a dim it
  does not have (a matmul row recomputed for every j of the next matmul) is computed again,
  from its initialization, in each iteration of that loop.  isl relates instances by their
  original time, so the updates of a later iteration look like the same instances running
  after a read of an earlier one; the values read are right.

Any other difference fails: isl accepting what the oracle refuses is a soundness bug (the
first run found one: buffers placed at a parallel loop were shared by its threads, see
tests/codegen/test_cpu_codegen.py), and isl refusing what the oracle accepts is an
undocumented loss of schedules.  Run with -s for the counts.
"""
import collections
import itertools
import re

import numpy as np
import pytest

from tests.analysis import oracle
from tests.schedule_helpers import (RandomChooser, Rejected, apply_steps, draw_case, layernorm, matmul,
                                    matmul_bias_relu, matmul_chain, random_steps, softmax, steps_text)

CI_DRAWS = 1_000
SLOW_DRAWS = 10_000
MAX_SIZE = 6

CONSERVATIVE = {
    "vectorize innermost only": "is vectorized but has loops inside it",
    "one parallel loop per nest": "is inside two parallel loops",
    "no tile per SIMD lane": "is shrunk to one tile per iteration of the vectorized loop",
}
BROKEN = re.compile(r"dependence on buffer (\S+) from `[^`]*` \(stage \1\) to .* is broken")


def conservative_rule(tree, why: str) -> str | None:
    """The documented rule behind an isl refusal the oracle does not share, or None."""
    for rule, words in CONSERVATIVE.items():
        if words in why:
            return rule
    found = BROKEN.search(why)
    if found and recomputed_reduction(tree, found.group(1)):
        return "reduction recomputed redundantly"
    return None


def recomputed_reduction(tree, stage_name: str) -> bool:
    """Whether a reduction stage runs inside a loop over a dim it does not iterate over."""
    stage = tree.program.stage(stage_name)
    return bool(stage.reduce_op) and any(
        node.loop.dim not in stage.loop_dims
        for stmt, path in tree.statements() if stmt.stage is stage for node in path)


def compare(seed: int, draws: int):
    """(counts, disagreements) of `draws` (program, schedule) pairs judged by both."""
    ch, rng = RandomChooser(seed), np.random.default_rng(seed)
    counts, disagreements = collections.Counter(), []
    for i in itertools.count():
        if counts["drawn"] == draws:
            break
        case = draw_case(ch, rng, max_size=MAX_SIZE, poison=False)
        try:
            tree, steps = random_steps(case.make().loop_tree(), ch, max_steps=5, wild=True)
        except Rejected:
            counts["refused when built"] += 1
            continue
        isl_legal, isl_why = tree.check()
        oracle_legal, oracle_why = oracle.verdict(tree)
        counts["drawn"] += 1
        if isl_legal == oracle_legal:
            counts["agree, " + ("legal" if isl_legal else "illegal")] += 1
            continue
        rule = None if isl_legal else conservative_rule(tree, isl_why)
        if rule:
            counts["conservative: " + rule] += 1
            continue
        disagreements.append(f"#{i} {case.name}{case.sizes} {steps_text(steps)}\n  isl: {isl_why}\n"
                             f"  oracle: {oracle_why}\n{tree}")
    return counts, disagreements


def check_agreement(seed: int, draws: int):
    counts, disagreements = compare(seed, draws)
    print(f"\nisl vs oracle, seed {seed}: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    assert not disagreements, f"{len(disagreements)} disagreement(s):\n\n" + "\n\n".join(disagreements[:5])
    assert counts["agree, legal"] >= draws // 4 and counts["agree, illegal"] >= draws // 20, counts
    return counts


def test_isl_agrees_with_the_brute_force_oracle():
    check_agreement(16, CI_DRAWS)


@pytest.mark.slow
def test_isl_agrees_with_the_brute_force_oracle_many():
    check_agreement(1616, SLOW_DRAWS)


# ------------------------------------------------------------------ the oracle itself

@pytest.mark.parametrize("build, steps, words", [
    (lambda rng: softmax(rng, 3, 5), [("place", "t0", "t2", 2)],
     "t0[0] reduced over 1 contribution(s) where t0[0] reduced over 5"),
    (lambda rng: matmul(rng, 3, 4, 5), [("parallel", "k")], "parallel loop 'k' both touch t0[0, 0]"),
    (lambda rng: matmul_chain(rng, 3, 2, 1, 2), [("place", "t0", "t1", 1), ("parallel", "k", {"stage": "t0"})],
     "parallel loop 'k' both touch t0[0, 0]"),
])
def test_oracle_refuses_illegal_schedules(rng, build, steps, words):
    """A max read before it has seen its whole row, a parallel reduction loop (over a full
    buffer, and over a tile): refused by both, the oracle saying why."""
    tree = apply_steps(build(rng).make().loop_tree(), steps)
    legal, why = oracle.verdict(tree)
    assert not legal and words in why, why
    assert not tree.check()[0]


@pytest.mark.parametrize("build, steps", [
    (lambda rng: layernorm(rng, 4, 5), []),
    (lambda rng: matmul(rng, 3, 4, 5), [("reorder", "k", "n", "m"), ("split", "n", 2), ("vectorize", "m")]),
    (lambda rng: matmul_bias_relu(rng, 4, 3, 5), [("place", "t0", "t1", 1), ("parallel", "m", {"stage": "t1"})]),
])
def test_oracle_accepts_legal_schedules(rng, build, steps):
    tree = apply_steps(build(rng).make().loop_tree(), steps)
    assert oracle.verdict(tree) == (True, "legal"), tree
    assert tree.check() == (True, "legal")
