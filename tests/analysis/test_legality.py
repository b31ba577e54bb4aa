"""The isl legality check: verdicts and messages on the canonical illegal
schedules, legal schedules that must run, and an oracle test in which the
brute-force NumPy interpreter (which runs statements in the scheduled order,
with no legality check) judges hundreds of sampled schedules: none that isl
calls legal may compute a wrong result."""

import collections
import re

import numpy as np
import pytest

import looptool as lt
from tests.helpers import mentions
from tests.schedule_helpers import (Rejected, RandomChooser, apply_steps, colsum_exp, draw_case, layernorm, matmul,
                              matmul_bias_relu, matmul_chain, random_steps, reduce_broadcast, rowsum_exp,
                              run_guarded, scheduled, softmax, steps_text)


def exp_minus_max(rng, m=4, n=6):
    """y = exp(x - max_n x): t0[m] = max, t1[m, n] = exp(x - t0)."""
    sm, sn = lt.symbols("m n")
    x = rng.standard_normal((m, n)).astype(np.float32)
    xt = lt.Tensor(x).to(sm, sn)
    ref = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    return (xt - xt.max(sn)).exp(), ref


def assert_rejected(tree, *patterns):
    """check() says illegal without raising, assert_legal raises the same message, and the
    message matches every pattern."""
    legal, why = tree.check()
    assert legal is False, f"judged legal:\n{tree}"
    assert isinstance(why, str) and why
    with pytest.raises(lt.IllegalScheduleError) as info:
        tree.assert_legal()
    assert isinstance(info.value, ValueError)
    assert str(info.value) == why
    for p in patterns:
        assert re.search(p, why), f"{p!r} not in: {why}"
    return why


# ------------------------------------------------------------------ the canonical illegal schedules

def test_max_computed_inside_the_loop_still_reducing_it(rng):
    y, ref = exp_minus_max(rng)
    tree = y.loop_tree().place("t0", "t1", 2)
    why = assert_rejected(
        tree,
        mentions("buffer", "t0"), r"buffer t0\b", r"loop 'n'", r"\bflow\b",
        re.escape("`t0[m] = max(t0[m], in0[m, n])` (stage t0)"),
        re.escape("`t1[m, n] = exp((in0[m, n] - t0[m]))` (stage t1)"),
        r"is broken at loop 'n'")
    assert "t1: f32" not in why
    # the brute-force oracle agrees: run in this order, the numbers are wrong
    assert not np.allclose(lt.interpret(y, tree), ref, rtol=1e-5)
    # and the legal depth runs
    good = y.loop_tree().place("t0", "t1", 1)
    assert good.check() == (True, "legal")
    got = y.numpy(good)
    assert np.max(np.abs(got - ref)) < 1e-5


def test_max_inside_a_split_reduction_loop(rng):
    y, _ = exp_minus_max(rng, 5, 9)
    tree = y.loop_tree().split("n", 4).place("t0", "t1", 2)
    assert_rejected(tree, r"buffer t0\b", r"loop 'n\.0'", re.escape("(stage t0)"), re.escape("(stage t1)"))
    tree = y.loop_tree().split("n", 4).place("t0", "t1", 3)
    assert_rejected(tree, r"buffer t0\b", r"loop 'n\.[01]'")


@pytest.mark.parametrize("make, steps, loop", [
    (lambda rng: matmul(rng, 4, 6, 5), [("parallel", "k")], "k"),
    (lambda rng: matmul(rng, 4, 6, 5), [("reorder", "k", "m"), ("parallel", "k")], "k"),
    (lambda rng: matmul(rng, 4, 9, 5), [("split", "k", 4), ("parallel", "k.0")], "k.0"),
    (lambda rng: matmul(rng, 4, 9, 5), [("split", "k", 4), ("parallel", "k.1")], "k.1"),
    (lambda rng: rowsum_exp(rng, 3, 8), [("parallel", "n")], "n"),
    (lambda rng: colsum_exp(rng, 8, 3), [("parallel", "m")], "m"),
], ids=["k", "k outermost", "k.0", "k.1", "rowsum n", "colsum m"])
def test_parallel_reduction_loop(rng, make, steps, loop):
    case = make(rng)
    tree = apply_steps(case.make().loop_tree(), steps)
    assert_rejected(tree, rf"^loop '{re.escape(loop)}' cannot be parallel: it carries a dependence on buffer t0\b",
                    re.escape("t0["))


def test_parallel_reduction_message_names_the_statements(rng):
    tree = matmul(rng, 4, 6, 5).make().loop_tree().parallel("k")
    why = assert_rejected(tree)
    assert why.startswith("loop 'k' cannot be parallel: it carries a dependence on buffer t0 from "
                          "`t0[m, n] += (in0[m, k] * in1[k, n])` to `t0[m, n] += (in0[m, k] * in1[k, n])`"), why


def test_producer_placed_after_its_consumer_reads_it(rng):
    """softmax: t0 (the max) moved into t2's loop, but t1 at the root reads t0 before that."""
    case = softmax(rng, 4, 6)
    t = case.make()
    tree = t.loop_tree().place("t0", "t2", 1)
    assert_rejected(tree, r"buffer t0\b", r"\bflow\b",
                    re.escape("`t0[m] = max(t0[m], in0[m, n])` (stage t0)"),
                    re.escape("(stage t1)"), r"top level")
    assert not np.allclose(lt.interpret(t, tree), case.ref, rtol=1e-5, equal_nan=False)


def test_producer_placed_inside_an_earlier_stage(rng):
    """t1 (sum of exp) placed inside t0 (max): t1 now runs while the max is still being reduced."""
    case = softmax(rng, 4, 6)
    tree = case.make().loop_tree().place("t1", "t0", 2)
    assert_rejected(tree, r"buffer t0\b", re.escape("(stage t0)"), re.escape("(stage t1)"), r"loop 'n'")


def test_sum_placed_inside_the_loop_reading_it(rng):
    case = layernorm(rng, 3, 5)
    tree = case.make().loop_tree().place("t1", "t2", 2)
    assert_rejected(tree, r"buffer t1\b", r"loop 'n'", re.escape("(stage t1)"), re.escape("(stage t2)"))


def test_vectorized_loop_must_be_innermost(rng):
    tree = matmul(rng, 4, 6, 5).make().loop_tree().vectorize("k")
    assert_rejected(tree, r"^loop 'k' is vectorized but has loops inside it")
    tree = matmul(rng, 4, 6, 5).make().loop_tree().split("n", 2).vectorize("n.0")
    assert_rejected(tree, r"^loop 'n\.0' is vectorized")


def test_nested_parallel_loops(rng):
    tree = matmul(rng, 4, 6, 5).make().loop_tree().parallel("m").parallel("n")
    assert_rejected(tree, r"stage t0 is inside two parallel loops \['m', 'n'\]")


def test_parallel_loop_carrying_a_cross_stage_dependence(rng):
    """reduce_broadcast: t1 = max over m. Parallel m of t1 is a parallel reduction."""
    case = reduce_broadcast(rng, 5, 4)
    tree = case.make().loop_tree().parallel("m", stage="t1")
    assert_rejected(tree, r"loop 'm' cannot be parallel", r"buffer t1\b")


# ------------------------------------------------------------------ legal schedules run

LEGAL = {
    "split reductions and reorder them": (lambda rng: matmul(rng, 5, 13, 6), [
        ("split", "k", 4), ("reorder", "k.1", "m", "k.0")]),
    "reduction loop outermost": (lambda rng: matmul(rng, 5, 7, 6), [("reorder", "k", "m")]),
    "parallel pure loop inside the reduction": (lambda rng: matmul(rng, 5, 7, 6), [("parallel", "n")]),
    "parallel rows": (lambda rng: matmul(rng, 5, 7, 6), [("parallel", "m")]),
    "vectorized reduction": (lambda rng: rowsum_exp(rng, 3, 19), [("split", "n", 8), ("vectorize", "n.1")]),
    "softmax rows placed": (lambda rng: softmax(rng, 4, 9), [
        ("place", "t0", "t2", 1), ("place", "t1", "t2", 1), ("parallel", "m")]),
    "softmax nested placement": (lambda rng: softmax(rng, 4, 9), [
        ("place", "t1", "t2", 1), ("place", "t0", "t1", 1)]),
    "layernorm placed": (lambda rng: layernorm(rng, 4, 9), [("place", "t0", "t2", 1), ("place", "t1", "t2", 1)]),
    "matmul tile placed": (lambda rng: matmul_bias_relu(rng, 9, 5, 10), [
        ("split", "m", 4), ("split", "n", 4), ("reorder", "m.0", "n.0", "m.1", "n.1"), ("place", "t0", "t1", 2)]),
    "pointwise consumer at full depth": (lambda rng: matmul_bias_relu(rng, 4, 5, 6), [("place", "t0", "t1", 2)]),
    "two reductions over different dims": (lambda rng: reduce_broadcast(rng, 5, 4), [
        ("place", "t0", "t2", 1), ("parallel", "m")]),
}


@pytest.mark.parametrize("name", list(LEGAL))
def test_legal_schedules_are_accepted_and_run(rng, name):
    case, t, steps, tree = scheduled(LEGAL, name, rng)
    assert tree.check() == (True, "legal"), tree.check()[1]
    assert tree.assert_legal() is None
    case.check(t.numpy(tree), f"{steps_text(steps)}\n{tree}")
    case.check(run_guarded(t, tree, rng).value, f"{steps_text(steps)}\n{tree}")


@pytest.mark.parametrize("builder", [matmul, matmul_bias_relu, matmul_chain, softmax, layernorm, rowsum_exp,
                                     colsum_exp, reduce_broadcast])
def test_default_schedules_are_legal(rng, builder):
    tree = builder(rng).make().loop_tree()
    assert tree.check() == (True, "legal")


# ------------------------------------------------------------------ illegal schedules never reach the compiler

def test_illegal_schedule_is_refused_before_compiling(rng):
    y, _ = exp_minus_max(rng, 3, 5)
    tree = y.loop_tree().place("t0", "t1", 2)
    before = lt.cache_info()["size"]
    with pytest.raises(lt.IllegalScheduleError, match=r"buffer t0\b.*loop 'n'"):
        y.numpy(tree)
    with pytest.raises(lt.IllegalScheduleError):
        y.compile(tree)
    with pytest.raises(lt.IllegalScheduleError):
        y.numpy(tree.schedule)
    with pytest.raises(lt.IllegalScheduleError):
        y.numpy(tree.schedule.to_json())
    with pytest.raises(ValueError):                  # it is a ValueError too
        y.numpy(tree)
    assert lt.cache_info()["size"] == before, "an illegal schedule was compiled and cached"


def test_check_never_raises(rng):
    trees = [
        exp_minus_max(rng)[0].loop_tree().place("t0", "t1", 2),
        matmul(rng, 3, 4, 5).make().loop_tree().parallel("k"),
        matmul(rng, 3, 4, 5).make().loop_tree().vectorize("m"),
        matmul(rng, 3, 4, 5).make().loop_tree().parallel("m").parallel("k"),
        softmax(rng, 3, 4).make().loop_tree().place("t0", "t2", 1),
    ]
    for tree in trees:
        legal, why = tree.check()
        assert legal is False and why


# ------------------------------------------------------------------ found by the fuzz: legal must mean right

def assert_refused_or_right(case, steps):
    """The property of the fuzz on one schedule: a transform refuses to build, check() rejects
    it, or every stage is still computed and the numbers are right (compiled and interpreted)."""
    t = case.make()
    try:
        tree = apply_steps(t.loop_tree(), steps)
    except ValueError:
        return "refused"
    legal, why = tree.check()
    if not legal:
        return "illegal"
    computed = {stmt.stage.name for stmt, _ in tree.statements()}
    missing = [st.name for st in tree.program.stages if st.name not in computed]
    assert not missing, f"judged legal, but stage(s) {missing} are no longer computed anywhere:\n{tree}"
    case.check(run_guarded(t, tree).value, f"judged legal, compiled {steps_text(steps)}\n{tree}")
    case.check(lt.interpret(t, tree), f"judged legal, interpreted {steps_text(steps)}\n{tree}")
    return "right"


def test_consumer_placed_after_a_stage_was_placed_inside_it(rng):
    """t0 sits at depth 1 of t1 (its row loop m).  Placing t1 inside t2's m.0 loop turns t1's
    first loop into m.0, so t0 would only be computed for every third row."""
    assert_refused_or_right(layernorm(rng, 7, 5), [("split", "m", 3), ("place", "t0", "t1", 1),
                                                   ("place", "t1", "t2", 1)])


def test_stage_placed_deeper_than_its_consumer_has_loops(rng):
    """t0 sits at depth 3 of t1 (m.0, m.1, n); t1 placed in t2 keeps only two loops (m, n),
    so t0 is never emitted at all."""
    assert_refused_or_right(softmax(rng, 4, 6), [("split", "m", 1, {"stage": "t1"}), ("place", "t0", "t1", 3),
                                                 ("place", "t1", "t2", 1)])


def test_placed_stage_does_not_keep_tails_of_its_old_loops(rng):
    """t0 split its own n by 25 (tail n.1 + 25*n.0 < 40); placed into t1's loops, which are
    also named n.0 and n.1 (split by 2), that stale tail must not limit t1's loops."""
    assert_refused_or_right(matmul_bias_relu(rng, 3, 2, 40), [("split", "n", 25, {"stage": "t0"}),
                                                              ("split", "n", 2), ("place", "t0", "t1", 2)])


def test_placed_stage_split_does_not_inherit_consumer_tails(rng):
    """t0 (placed at depth 1, sharing m) splits its own n by 8; t1's n is split by 16. The
    tail of t1's n.0/n.1 must not apply to t0's loops of the same names."""
    assert_refused_or_right(softmax(rng, 3, 20), [("split", "n", 16), ("place", "t1", "t2", 1),
                                                  ("split", "n", 8, {"stage": "t1"})])


@pytest.mark.parametrize("m, n", [(1, 1), (3, 4)])
def test_stage_placed_within_the_loops_its_consumer_shares(rng, m, n):
    """t1 sits at depth 2 of t2 (sharing m and n); t0 placed at depth 1 of t1 falls inside
    loops t1 does not own: it must still be computed (found by the slow fuzz at 1x1)."""
    assert_refused_or_right(softmax(rng, m, n), [("split", "m", 1, {"stage": "t0"}), ("place", "t1", "t2", 2),
                                                 ("place", "t0", "t1", 1)])
    assert_refused_or_right(softmax(rng, m + 1, n), [("split", "m", 2), ("place", "t1", "t2", 2),
                                                     ("place", "t0", "t1", 1)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [2, 19])
@pytest.mark.parametrize("annotation", ["vectorize", "parallel", "unroll"])
def test_local_tile_inside_an_annotated_loop(rng, dtype, n, annotation):
    """t1 = max over m (m has one element) placed at full depth of t2: its buffer shrinks to
    one element per iteration of n.  Running n as SIMD lanes (or threads) must give each lane
    its own element, or be refused (found by the slow fuzz: all lanes shared one element)."""
    case = reduce_broadcast(rng, 1, n, dtype)
    assert_refused_or_right(case, [("place", "t1", "t2", 2), (annotation, "n")])


# ------------------------------------------------------------------ the oracle

ORACLE_DRAWS = 300


def _interp_ok(case, t, tree):
    """(True, '') when the interpreter's result matches the reference, else (False, why)."""
    try:
        got = lt.interpret(t, tree)
    except Exception as err:  # noqa: BLE001 - an illegal tree may index out of a tile
        return False, f"interpreter raised {type(err).__name__}: {err}"
    try:
        case.check(got)
    except AssertionError as err:
        return False, str(err)
    return True, ""


def _reason_kind(why: str) -> str:
    if "cannot be parallel" in why:
        return "parallel loop carries a dependence"
    if "cannot be vectorized" in why:
        return "vectorized loop carries a dependence"
    if "vectorized but has loops inside" in why:
        return "vectorized loop not innermost"
    if "two parallel loops" in why:
        return "nested parallel loops"
    if "is broken" in why:
        return "dependence order broken"
    if "shrunk" in why:
        return "local tile read outside its iteration"
    if "before" in why and "has written" in why:
        return "read before written"
    return why.split(":")[0][:60]


def run_oracle(seed: int, draws: int, max_size: int = 9):
    """Sample `draws` wild schedules on small computations; return (stats, problems)."""
    ch = RandomChooser(seed)
    rng = np.random.default_rng(seed)
    stats = collections.Counter()
    problems = []
    for i in range(draws):
        case = draw_case(ch, rng, max_size=max_size, poison=False)
        t = case.make()
        try:
            tree, steps = random_steps(t.loop_tree(), ch, max_steps=5, wild=True)
        except Rejected:
            stats["rejected when built"] += 1
            continue
        where = f"#{i} {case.name}{case.sizes} {steps_text(steps)}\n{tree}"
        try:
            legal, why = tree.check()
        except Exception as err:  # noqa: BLE001 - check() must never raise
            problems.append(f"check() raised {type(err).__name__}: {err}\n{where}")
            continue
        if legal:
            stats["legal"] += 1
            ok, err = _interp_ok(case, t, tree)
            if not ok:
                problems.append(f"judged legal, interpreter wrong: {err}\n{where}")
            try:
                case.check(run_guarded(t, tree, rng).value)
            except Exception as err:  # noqa: BLE001
                problems.append(f"judged legal, compiled result wrong: {type(err).__name__}: {err}\n{where}")
        else:
            stats["illegal"] += 1
            ok, err = _interp_ok(case, t, tree)
            verdict = ("interpreter right" if ok else
                       "interpreter raised" if err.startswith("interpreter raised") else "interpreter also wrong")
            stats[f"illegal, {verdict}"] += 1
            stats[f"  {_reason_kind(why)}: {verdict}"] += 1
            if i % 4 == 0:
                try:
                    t.numpy(tree)
                    problems.append(f"check() said illegal but numpy() ran it: {why}\n{where}")
                except lt.IllegalScheduleError as err:
                    if str(err) != why:
                        problems.append(f"numpy() gave another reason: {err} vs {why}\n{where}")
    return stats, problems


def test_oracle_isl_verdict_against_brute_force(record_property):
    """For small sizes (dims 1..9), every schedule isl accepts computes the right numbers,
    interpreted and compiled (and every illegal one is refused by numpy()).

    isl is conservative, so some rejected schedules still compute the right numbers.  When
    written (seed 2024, 300 draws): 215 legal, 73 illegal, 12 refused when built; of the
    illegal ones the interpreter also got 25 wrong and 48 right.  The 48: 31 vectorized
    loops with loops inside and 5 nested parallel loops (structural rules), 9 parallel loops
    carrying a dependence (the interpreter runs them serially, so it cannot see the race),
    and 3 broken-order verdicts on a reduction stage recomputed redundantly inside a consumer
    loop it does not need (e.g. a matmul row recomputed for every j of the next matmul):
    right, but rejected.  Run with -s for the counts of the current code."""
    stats, problems = run_oracle(2024, ORACLE_DRAWS)
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(stats.items()) if not k.startswith(" "))
    print(f"\noracle ({ORACLE_DRAWS} draws): {summary}")
    print("\n".join(f"{k}: {v}" for k, v in sorted(stats.items()) if k.startswith(" ")))
    record_property("oracle", summary)
    assert stats["legal"] >= ORACLE_DRAWS // 5 and stats["illegal"] >= ORACLE_DRAWS // 10, summary
    assert stats["illegal, interpreter also wrong"] > 0, summary
    assert not problems, problem_report(problems, summary)


def problem_report(problems, summary):
    """Problems grouped by kind (numbers first), then the first examples of each kind."""
    kinds = collections.Counter(re.sub(r"\d+", "N", p.split("\n")[0])[:110] for p in problems)
    ordered = sorted(problems, key=lambda p: ("compiled" not in p.split("\n")[0], "raised" in p.split("\n")[0]))
    seen, examples = collections.Counter(), []
    for p in ordered:
        kind = re.sub(r"\d+", "N", p.split("\n")[0])[:110]
        if seen[kind] < 2:
            examples.append(p)
        seen[kind] += 1
    return (f"{len(problems)} problem(s) ({summary}):\n" + "\n".join(f"  {v} x {k}" for k, v in kinds.most_common())
            + "\n\n" + "\n\n".join(examples))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_oracle_many(seed):
    stats, problems = run_oracle(seed, 2500)
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(stats.items()))
    print(f"\noracle seed {seed}: {summary}")
    assert not problems, problem_report(problems, summary)
