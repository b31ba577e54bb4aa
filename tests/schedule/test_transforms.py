"""Schedule transforms, one at a time and combined: split (dividing and not,
nested), reorder (reduction loop outermost and innermost), unroll, vectorize,
parallel, place; their loop-tree text; JSON round trips.  Every result is compared
with a float64 NumPy reference (relative error < 1e-5 in float32), run through
canary-guarded output buffers.  (The vector code they give: tests/codegen; the
interpreter running them: tests/runtime.)"""

import json
import re

import numpy as np
import pytest

import looptool as lt
from looptool import ir
from tests.schedule_helpers import (apply_steps, colsum_exp, conv2d, embed, layernorm, matmul, matmul_bias_relu,
                              matmul_chain, pointwise, rowsum_exp, run_guarded, scheduled, softmax, steps_text,
                              without)


def run_case(case, steps, rng=None, interpret=True):
    """Apply `steps`, check legality, run compiled (guarded) and interpreted; return (tree, result)."""
    t = case.make()
    tree = apply_steps(t.loop_tree(), steps)
    legal, why = tree.check()
    assert legal, f"{steps_text(steps)} judged illegal: {why}\n{tree}"
    got = run_guarded(t, tree, rng).value
    case.check(got, f"compiled {steps_text(steps)}\n{tree}")
    case.check(t.numpy(tree), f"numpy() {steps_text(steps)}")
    if interpret:
        case.check(lt.interpret(t, tree), f"interpreted {steps_text(steps)}\n{tree}")
    return tree, got


def loop_lines(tree):
    return [ln.strip() for ln in str(tree).splitlines() if ln.strip().startswith("for ")]


def loop_line(tree, name):
    """The first `for <name> in ...` line of the tree text."""
    for ln in loop_lines(tree):
        if ln.split()[1] == name:
            return ln
    raise AssertionError(f"no loop {name!r} in\n{tree}")


def update_path(tree, stage=None):
    """Loop names around the (update or assign) statement of `stage` (default: the output)."""
    stage = stage or tree.program.output.name
    for stmt, path in tree.statements():
        if stmt.stage.name == stage and stmt.kind in ("update", "assign"):
            return [n.loop.name for n in path]
    raise AssertionError(f"no statement of {stage}")


# ------------------------------------------------------------------ split

@pytest.mark.parametrize("extent, factor", [(257, 16), (1000, 7), (16, 16), (16, 4), (7, 32), (13, 1), (1, 3),
                                            (31, 30), (64, 63)])
def test_split_reduction_loop(rng, extent, factor):
    case = rowsum_exp(rng, m=3, n=extent)
    tree, _ = run_case(case, [("split", "n", factor)], rng)
    f = min(factor, extent)
    assert re.match(rf"for n\.0 in 0\.\.{-(-extent // f)}$", loop_line(tree, "n.0"))
    inner = loop_line(tree, "n.1")
    assert inner.startswith(f"for n.1 in 0..{f}")
    if extent % f:
        assert re.search(rf"while (n\.1 \+ {f}\*n\.0|{f}\*n\.0 \+ n\.1) < {extent}$", inner), inner
    else:
        assert "while" not in str(tree)


@pytest.mark.parametrize("extent, factor", [(1000, 7), (257, 16), (5, 2)])
def test_split_pure_loop(rng, extent, factor):
    case = pointwise(rng, m=2, n=extent)
    tree, _ = run_case(case, [("split", "n", factor)], rng)
    assert update_path(tree) == ["m", "n.0", "n.1"]
    assert "while" in loop_line(tree, "n.1")


def test_split_matmul_k_257_by_16(rng):
    case = matmul(rng, 5, 257, 6)
    tree, _ = run_case(case, [("split", "k", 16)], rng)
    assert re.search(r"for k\.1 in 0\.\.16 while (16\*k\.0 \+ k\.1|k\.1 \+ 16\*k\.0) < 257", str(tree)), str(tree)
    assert loop_line(tree, "k.0") == "for k.0 in 0..17"


def test_nested_splits_with_tails(rng):
    case = matmul(rng, 4, 257, 5)
    steps = [("split", "k", 16), ("split", "k.1", 5), ("split", "k.0", 3)]
    tree, _ = run_case(case, steps, rng)
    assert update_path(tree) == ["m", "k.0.0", "k.0.1", "k.1.0", "k.1.1", "n"]
    assert loop_line(tree, "k.0.0").startswith("for k.0.0 in 0..6")
    assert loop_line(tree, "k.0.1").startswith("for k.0.1 in 0..3")
    assert loop_line(tree, "k.1.0").startswith("for k.1.0 in 0..4")
    assert loop_line(tree, "k.1.1").startswith("for k.1.1 in 0..5")
    # k.0 has 17 = 3*5 + 2 iterations, split by 3: a tail on k.0.1 bounded by 17;
    # k.1 has 16 = 5*3 + 1, split by 5: k.1.1 keeps both the 257 and the 16 bounds
    assert re.search(r"while (k\.0\.1 \+ 3\*k\.0\.0|3\*k\.0\.0 \+ k\.0\.1) < 17$", loop_line(tree, "k.0.1"))
    inner = loop_line(tree, "k.1.1")
    assert re.search(r"while .*< 257 and .*< 16$|while .*< 16 and .*< 257$", inner), inner
    assert "while" not in loop_line(tree, "k.1.0")


@pytest.mark.parametrize("k, limited", [(300, "k.1.0"), (302, "k.1.1")])
def test_a_split_tail_whole_runs_of_the_inner_loop_never_decide_stays_on_the_outer_one(rng, k, limited):
    """k = 300 in tiles of 32 cut into runs of 4: 300 is whole runs, so the tail tests the runs (8*k.0 +
    k.1.0 < 75) and the steps of a run run free; at 302 the steps keep it."""
    tree, _ = run_case(matmul(rng, 3, k, 5), [("split", "k", 32), ("split", "k.1", 4)], rng)
    assert "while" in loop_line(tree, limited)
    free = {"k.1.0", "k.1.1"} - {limited}
    assert "while" not in loop_line(tree, free.pop())
    if k == 300:
        assert re.search(r"while (8\*k\.0 \+ k\.1\.0|k\.1\.0 \+ 8\*k\.0) < 75$", loop_line(tree, "k.1.0"))


@pytest.mark.parametrize("factors", [(2, 2, 2), (3, 5, 7), (9, 1, 4), (40, 3, 2)])
def test_repeated_inner_splits(rng, factors):
    case = rowsum_exp(rng, m=2, n=37)
    steps, name = [], "n"
    for f in factors:
        steps.append(("split", name, f))
        name += ".1"
    tree, _ = run_case(case, steps, rng)
    assert update_path(tree)[-1] == name


def test_split_factor_larger_than_extent_is_clamped(rng):
    case = matmul(rng, 3, 7, 5)
    tree, _ = run_case(case, [("split", "k", 32)], rng)
    assert loop_line(tree, "k.0") == "for k.0 in 0..1"
    assert loop_line(tree, "k.1") == "for k.1 in 0..7"


# ------------------------------------------------------------------ reorder

@pytest.mark.parametrize("order, path", [
    (("k", "m"), ["k", "m", "n"]),            # reduction loop outermost
    (("n", "k"), ["m", "n", "k"]),            # reduction loop innermost
    (("n", "m"), ["n", "k", "m"]),            # the listed loops keep the positions they occupy
    (("k", "n", "m"), ["k", "n", "m"]),
    (("n", "k", "m"), ["n", "k", "m"]),
    (("m", "k", "n"), ["m", "k", "n"]),       # identity
])
def test_reorder_matmul(rng, order, path):
    case = matmul(rng, 13, 17, 11)
    tree, _ = run_case(case, [("reorder", *order)], rng)
    assert update_path(tree) == path


def test_reorder_reduction_outermost_puts_init_first(rng):
    case = matmul(rng, 6, 9, 7)
    tree, _ = run_case(case, [("reorder", "k", "m")], rng)
    lines = str(tree).splitlines()
    body = [ln for ln in lines if not re.match(r"\w+: ", ln)]
    # the whole output is initialized before the k loop starts accumulating
    assert body[0] == "for m in 0..6" and body[2].strip() == "t0[m, n] = 0"
    assert body[3] == "for k in 0..9"


def test_reorder_tiled_matmul(rng):
    case = matmul(rng, 19, 23, 29)
    steps = [("split", "m", 4), ("split", "n", 8), ("split", "k", 5),
             ("reorder", "m.0", "n.0", "k.0", "m.1", "k.1", "n.1")]
    tree, _ = run_case(case, steps, rng)
    assert update_path(tree) == ["m.0", "n.0", "k.0", "m.1", "k.1", "n.1"]
    # and with the inner reduction loop outermost of all
    tree, _ = run_case(case, steps + [("reorder", "k.1", "m.0")], rng)
    assert update_path(tree) == ["k.1", "n.0", "k.0", "m.1", "m.0", "n.1"]


def test_reorder_colsum_reduction_innermost(rng):
    case = colsum_exp(rng, m=33, n=7)
    tree, _ = run_case(case, [("reorder", "n", "m")], rng)
    assert update_path(tree) == ["n", "m"]


# ------------------------------------------------------------------ unroll

@pytest.mark.parametrize("k, factor", [(12, 4), (13, 4), (7, 8), (3, 3)])
def test_unroll_inner_split(rng, k, factor):
    case = matmul(rng, 5, k, 6)
    tree, _ = run_case(case, [("split", "k", factor), ("unroll", "k.1")], rng)
    line = loop_line(tree, "k.1")
    assert line.endswith("[unroll]")
    assert ("while" in line) == (k % min(k, factor) != 0)


def test_unroll_whole_small_loops(rng):
    case = matmul(rng, 3, 4, 5)
    tree, _ = run_case(case, [("unroll", "n"), ("unroll", "k")], rng)
    assert loop_line(tree, "n").endswith("[unroll]") and loop_line(tree, "k").endswith("[unroll]")
    # the init nest's n loop is the same loop, so it is unrolled too
    assert sum(ln.startswith("for n in") and ln.endswith("[unroll]") for ln in loop_lines(tree)) == 2


def test_unroll_outer_loop_with_tail(rng):
    case = softmax(rng, m=11, n=9)
    tree, _ = run_case(case, [("split", "m", 4), ("unroll", "m.1")], rng)
    assert re.search(r"for m\.1 in 0\.\.4 while .*< 11  \[unroll\]$", loop_line(tree, "m.1"))


# ------------------------------------------------------------------ vectorize

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, factor", [(16, 16), (37, 16), (3, 16), (33, 8), (1, 4), (64, 16), (100, 32)])
def test_vectorize_inner_split_matmul(rng, n, factor, dtype):
    case = matmul(rng, 5, 9, n, dtype)
    tree, _ = run_case(case, [("split", "n", factor), ("vectorize", "n.1")], rng)
    assert loop_line(tree, "n.1").endswith("[vectorize]")


@pytest.mark.parametrize("n", [1, 7, 8, 19, 64])
def test_vectorize_whole_innermost_loop(rng, n):
    case = pointwise(rng, m=3, n=n)
    tree, _ = run_case(case, [("vectorize", "n")], rng)
    assert loop_line(tree, "n") == f"for n in 0..{n}  [vectorize]"


@pytest.mark.parametrize("n, factor", [(64, 8), (37, 8), (5, 16), (100, 16)])
def test_vectorize_reduction_loop(rng, n, factor):
    """A row sum whose innermost loop is the reduction loop: the lanes reassociate the sum."""
    case = rowsum_exp(rng, m=4, n=n)
    run_case(case, [("split", "n", factor), ("vectorize", "n.1")], rng)


@pytest.mark.parametrize("n", [16, 21, 3])
def test_vectorize_softmax_output_and_placed_stages(rng, n):
    case = softmax(rng, m=5, n=n)
    steps = [("split", "n", 8), ("vectorize", "n.1"),
             ("split", "n", 8, {"stage": "t1"}), ("vectorize", "n.1", {"stage": "t1"}),
             ("place", "t1", "t2", 1)]
    tree, _ = run_case(case, steps, rng)
    assert sum(ln.endswith("[vectorize]") for ln in loop_lines(tree)) == 2


def test_vectorize_conv_output_channels(rng):
    case = conv2d(rng, n=1, c=3, h=9, w=9, o=16)
    run_case(case, [("reorder", "c", "oh", "ow"), ("vectorize", "o")], rng)


# ------------------------------------------------------------------ parallel

def run_parallel_vs_serial(case, steps, rng):
    """The schedule with and without its parallel steps: bitwise-identical results, close to the reference."""
    t = case.make()
    tree, _ = run_case(case, steps, rng, interpret=False)
    serial_steps = without(steps, "parallel")
    serial = t.numpy(apply_steps(t.loop_tree(), serial_steps))
    par = t.numpy(tree)
    assert par.dtype == serial.dtype
    assert np.array_equal(par.view(np.uint8), serial.view(np.uint8)), \
        f"parallel {steps_text(steps)} differs from serial {steps_text(serial_steps)}: " \
        f"max |diff| {np.max(np.abs(par - serial))}"
    for _ in range(3):  # threads must not race: repeated runs are identical too
        assert np.array_equal(t.numpy(tree).view(np.uint8), par.view(np.uint8))
    return tree


@pytest.mark.parametrize("steps", [
    [("parallel", "m")],
    [("split", "m", 5), ("parallel", "m.0")],                       # tail: 37 = 7*5 + 2
    [("split", "m", 8), ("parallel", "m.1")],                       # the inner half
    [("parallel", "n")],                                            # pure loop inside the k loop
    [("split", "n", 16), ("vectorize", "n.1"), ("split", "m", 4), ("parallel", "m.0")],
    [("split", "k", 4), ("unroll", "k.1"), ("parallel", "m")],
], ids=lambda s: steps_text(s))
def test_parallel_matmul_is_bitwise_serial(rng, steps):
    tree = run_parallel_vs_serial(matmul(rng, 37, 23, 41), steps, rng)
    assert any(ln.endswith("[parallel]") for ln in loop_lines(tree))


def test_parallel_softmax_with_local_buffers(rng):
    """Per-row temporaries placed inside a parallel row loop must be private to each thread."""
    case = softmax(rng, m=64, n=33)
    steps = [("place", "t0", "t2", 1), ("place", "t1", "t2", 1), ("parallel", "m")]
    tree = run_parallel_vs_serial(case, steps, rng)
    assert "t1: f32[1] local" in str(tree)


def test_parallel_layernorm_with_local_buffers(rng):
    case = layernorm(rng, m=48, n=40)
    steps = [("split", "m", 3), ("place", "t0", "t2", 2), ("place", "t1", "t2", 2), ("parallel", "m.0")]
    run_parallel_vs_serial(case, steps, rng)


def test_parallel_tiled_matmul_with_local_tile(rng):
    case = matmul_bias_relu(rng, m=30, k=17, n=27)
    steps = [("split", "m", 4), ("split", "n", 8), ("reorder", "m.0", "n.0", "m.1", "n.1"),
             ("place", "t0", "t1", 2), ("parallel", "m.0")]
    tree = run_parallel_vs_serial(case, steps, rng)
    assert "t0: f32[4, 8] local" in str(tree)


def test_parallel_conv2d(rng):
    case = conv2d(rng, n=2, c=3, h=17, w=15, o=8)
    run_parallel_vs_serial(case, [("parallel", "oh")], rng)
    run_parallel_vs_serial(case, [("split", "ow", 3), ("parallel", "n")], rng)


def test_parallel_single_iteration_and_small_loops(rng):
    run_parallel_vs_serial(matmul(rng, 1, 5, 3), [("parallel", "m")], rng)
    run_parallel_vs_serial(matmul(rng, 2, 5, 3), [("parallel", "m")], rng)
    run_parallel_vs_serial(rowsum_exp(rng, m=3, n=200), [("split", "m", 2), ("parallel", "m.0")], rng)


# ------------------------------------------------------------------ place

def test_place_softmax_rows(rng):
    case = softmax(rng, m=9, n=37)
    tree, _ = run_case(case, [("place", "t0", "t2", 1), ("place", "t1", "t2", 1)], rng)
    text = str(tree)
    # t1 is read only by t2: one element per row; t0 is also read by t1, placed in the same row of
    # t2, so it shrinks too
    assert "t1: f32[1] local" in text
    assert "t0: f32[1] local" in text
    assert [ln for ln in text.splitlines() if not ln.startswith(" ") and ln.startswith("for")] == ["for m in 0..9"]
    assert update_path(tree, "t0") == ["m", "n"] and update_path(tree, "t1") == ["m", "n"]


def test_place_softmax_chain_inside_each_other(rng):
    case = softmax(rng, m=6, n=11)
    tree, _ = run_case(case, [("place", "t1", "t2", 1), ("place", "t0", "t1", 1)], rng)
    assert update_path(tree, "t0") == ["m", "n"]
    assert "t1: f32[1] local" in str(tree)


def test_place_layernorm_rows(rng):
    case = layernorm(rng, m=7, n=33, eps=1e-5)
    tree, _ = run_case(case, [("place", "t0", "t2", 1), ("place", "t1", "t2", 1)], rng)
    assert "t1: f32[1] local" in str(tree)


def test_place_matmul_tile_in_consumer(rng):
    case = matmul_bias_relu(rng, m=10, k=9, n=13)        # 10 = 2*4 + 2, 13 = 8 + 5: tails
    steps = [("split", "m", 4), ("split", "n", 8), ("reorder", "m.0", "n.0", "m.1", "n.1"),
             ("place", "t0", "t1", 2)]
    tree, _ = run_case(case, steps, rng)
    text = str(tree)
    assert "t0: f32[4, 8] local" in text
    assert update_path(tree, "t0")[:2] == ["m.0", "n.0"]
    # the placed stage inherits its consumer's tails
    assert "while" in loop_line(tree, "m.1") and "while" in loop_line(tree, "n.1")
    # and can be reshaped further through its own loops
    tree2, _ = run_case(case, steps + [("reorder", "k", "m.1", {"stage": "t0"})], rng)
    assert update_path(tree2, "t0") == ["m.0", "n.0", "k", "n.1", "m.1"]


def test_place_matmul_at_depth_one_keeps_unshared_dims(rng):
    case = matmul_bias_relu(rng, m=10, k=9, n=13)
    tree, _ = run_case(case, [("split", "m", 4), ("place", "t0", "t1", 1)], rng)
    assert "t0: f32[4, 13] local" in str(tree)


def test_place_matmul_chain_row(rng):
    case = matmul_chain(rng, m=6, k=7, n=9, j=5)
    tree, _ = run_case(case, [("place", "t0", "t1", 1)], rng)
    assert "t0: f32[1, 9] local" in str(tree)


def test_place_depth_zero_returns_to_root(rng):
    case = softmax(rng, m=4, n=5)
    t = case.make()
    default = str(t.loop_tree())
    assert str(t.loop_tree().place("t0", "t2", 1).place("t0", None)) == default
    assert str(t.loop_tree().place("t1", "t2", 1).place("t1", "t2", 0)) == default


def test_placed_stage_split_does_not_inherit_consumer_tails(rng):
    """A placed stage splitting its own (unshared) loop must not pick up the tail of the
    consumer's loop that happens to have the same name (n.0/n.1 here)."""
    sm, sn = lt.symbols("m n")
    X = rng.standard_normal((2, 20)).astype(np.float32)
    x = lt.Tensor(X).to(sm, sn)
    y = x.exp().sum(sn) * x                     # t0[m] = sum_n exp(x[m, n]); t1[m, n] = t0[m] * x[m, n]
    tree = y.loop_tree().split("n", 16).place("t0", "t1", 1).split("n", 8, stage="t0")
    t0_inner = [ln.strip() for ln in str(tree).splitlines()
                if ln.strip().startswith("for n.1 in 0..8")]
    assert len(t0_inner) == 1
    assert "16*n.0" not in t0_inner[0], f"t0 inherited t1's tail:\n{tree}"
    ref = np.exp(X.astype(np.float64)).sum(axis=1, keepdims=True) * X
    got = y.numpy(tree)
    assert np.max(np.abs(got - ref)) / np.max(np.abs(ref)) < 1e-5, f"wrong result for a legal schedule:\n{tree}"


def test_replace_placed_stage_keeps_its_loops(rng):
    """Moving a placed stage to a shallower depth must give it back the loops the deeper placement shared."""
    case = softmax(rng, m=4, n=6)
    t = case.make()
    deep = t.loop_tree().place("t1", "t2", 2)           # illegal on its own, but a valid tree
    tree = deep.place("t1", "t2", 1)
    assert str(tree) == str(t.loop_tree().place("t1", "t2", 1))
    case.check(t.numpy(tree))


# ------------------------------------------------------------------ combinations

COMBOS = {
    "matmul tiled+vector+parallel": (lambda rng: matmul(rng, 45, 37, 50), [
        ("split", "m", 8), ("split", "n", 16), ("split", "k", 4),
        ("reorder", "m.0", "n.0", "k.0", "m.1", "k.1", "n.1"),
        ("unroll", "k.1"), ("vectorize", "n.1"), ("parallel", "m.0")]),
    "matmul k outer, split n": (lambda rng: matmul(rng, 9, 31, 33), [
        ("reorder", "k", "m"), ("split", "n", 8), ("vectorize", "n.1"), ("split", "k", 10)]),
    "matmul k innermost unrolled": (lambda rng: matmul(rng, 7, 12, 9), [
        ("reorder", "n", "k"), ("split", "k", 4), ("unroll", "k.1"), ("parallel", "m")]),
    "matmul f64 tiles": (lambda rng: matmul(rng, 17, 19, 23, np.float64), [
        ("split", "m", 3), ("split", "n", 5), ("reorder", "m.0", "n.0", "m.1", "k", "n.1"), ("unroll", "n.1")]),
    "matmul_bias_relu tile placed": (lambda rng: matmul_bias_relu(rng, 33, 20, 35), [
        ("split", "m", 8), ("split", "n", 16), ("reorder", "m.0", "n.0", "m.1", "n.1"),
        ("place", "t0", "t1", 2), ("vectorize", "n.1"),
        ("reorder", "k", "m.1", "n.1", {"stage": "t0"}),
        ("split", "n.1", 8, {"stage": "t0"}), ("vectorize", "n.1.1", {"stage": "t0"}),
        ("parallel", "m.0")]),
    "softmax placed+vector+parallel": (lambda rng: softmax(rng, 23, 45), [
        ("split", "n", 16), ("vectorize", "n.1"), ("parallel", "m"),
        ("place", "t0", "t2", 1), ("place", "t1", "t2", 1),
        ("split", "n", 8, {"stage": "t1"}), ("unroll", "n.1", {"stage": "t1"})]),
    "softmax split rows": (lambda rng: softmax(rng, 17, 9), [
        ("split", "m", 4), ("place", "t0", "t2", 2), ("place", "t1", "t2", 2), ("parallel", "m.0"),
        ("split", "n", 4)]),
    "layernorm placed+vector": (lambda rng: layernorm(rng, 19, 70, eps=1e-5), [
        ("place", "t0", "t2", 1), ("place", "t1", "t2", 1), ("split", "n", 16), ("vectorize", "n.1"),
        ("split", "n", 8, {"stage": "t0"}), ("vectorize", "n.1", {"stage": "t0"}), ("parallel", "m")]),
    "layernorm split rows": (lambda rng: layernorm(rng, 21, 13, eps=1e-5), [
        ("split", "m", 5), ("place", "t1", "t2", 1), ("place", "t0", "t1", 2), ("unroll", "m.1")]),
    "conv2d reorder+vector": (lambda rng: conv2d(rng, 2, 3, 11, 10, 16), [
        ("reorder", "c", "oh", "ow"), ("split", "ow", 2), ("vectorize", "o"), ("unroll", "kw")]),
    "conv2d parallel+split": (lambda rng: conv2d(rng, 1, 4, 13, 13, 5, stride=1, padding=1), [
        ("split", "oh", 4), ("parallel", "oh.0"), ("reorder", "kh", "kw", "c"), ("split", "ow", 5),
        ("unroll", "kh")]),
}


@pytest.mark.parametrize("name", list(COMBOS))
def test_combination(rng, name):
    build, steps = COMBOS[name]
    run_case(build(rng), steps, rng)


@pytest.mark.parametrize("name", [n for n in COMBOS if any(s[0] == "parallel" for s in COMBOS[n][1])])
def test_combination_parallel_is_bitwise_serial(rng, name):
    build, steps = COMBOS[name]
    run_parallel_vs_serial(build(rng), steps, rng)


# ------------------------------------------------------------------ the tree text shows every transform

def test_tree_text_shows_every_transform(rng):
    case = matmul_bias_relu(rng, 10, 37, 13)   # (k = 257 here takes ~10 s to compile)
    steps = [("split", "m", 4), ("split", "n", 8), ("reorder", "m.0", "n.0", "m.1", "n.1"),
             ("place", "t0", "t1", 2), ("vectorize", "n.1"), ("parallel", "m.0"),
             ("split", "k", 16, {"stage": "t0"}), ("unroll", "m.1", {"stage": "t0"})]
    tree, _ = run_case(case, steps, rng)
    text = str(tree)
    lines = [ln.strip() for ln in text.splitlines()]
    assert "t0: f32[4, 8] local" in lines
    assert "t1: f32[10, 13] output" in lines
    assert not any(ln.startswith("t0: ") and "temp" in ln for ln in lines)
    assert "for m.0 in 0..3  [parallel]" in lines
    assert "for n.0 in 0..2" in lines
    assert re.search(r"^ *for m\.1 in 0\.\.4 while (m\.1 \+ 4\*m\.0|4\*m\.0 \+ m\.1) < 10  \[unroll\]$", text, re.M)
    assert re.search(r"^ *for n\.1 in 0\.\.8 while (n\.1 \+ 8\*n\.0|8\*n\.0 \+ n\.1) < 13  \[vectorize\]$", text, re.M)
    assert re.search(r"^ *for k\.1 in 0\.\.16 while (k\.1 \+ 16\*k\.0|16\*k\.0 \+ k\.1) < 37$", text, re.M)
    assert "for k.0 in 0..3" in lines
    assert "t0[m, n] += (in0[m, k] * in1[k, n])" in lines
    assert "t1[m, n] = relu((t0[m, n] + in2[n]))" in lines
    # the local buffer is declared inside the loop it is a tile of
    decl = next(i for i, ln in enumerate(text.splitlines()) if "t0: f32[4, 8] local" in ln)
    assert text.splitlines()[decl - 1].strip() == "for n.0 in 0..2"


def test_exact_tree_text_of_placed_softmax(rng):
    case = softmax(rng, m=5, n=7)
    tree = apply_steps(case.make().loop_tree(),
                       [("place", "t0", "t2", 1), ("place", "t1", "t2", 1), ("split", "n", 4),
                        ("vectorize", "n.1"), ("parallel", "m")])
    assert str(tree) == "\n".join([
        "in0: f32[5, 7] input",
        "t2: f32[5, 7] output",
        "for m in 0..5  [parallel]",
        "  t0: f32[1] local",
        "  t1: f32[1] local",
        "  t0[m] = -inf",
        "  for n in 0..7",
        "    t0[m] = max(t0[m], in0[m, n])",
        "  t1[m] = 0",
        "  for n in 0..7",
        "    t1[m] += exp((in0[m, n] - t0[m]))",
        "  for n.0 in 0..2",
        "    for n.1 in 0..4 while n.1 + 4*n.0 < 7  [vectorize]",
        "      t2[m, n] = (exp((in0[m, n] - t0[m])) / t1[m])",
    ])


def test_transforms_return_new_trees(rng):
    t = matmul(rng, 4, 5, 6).make()
    tree = t.loop_tree()
    before = str(tree)
    for new in (tree.split("k", 2), tree.reorder("k", "m"), tree.unroll("k"), tree.vectorize("n"),
                tree.parallel("m")):
        assert new is not tree and str(new) != before
    assert str(tree) == before and tree.schedule.steps == ()


# ------------------------------------------------------------------ schedules are data

@pytest.mark.parametrize("name", list(COMBOS))
def test_json_round_trip_on_a_rebuilt_computation(rng, name):
    case, t, steps, tree = scheduled(COMBOS, name, rng)
    text = tree.schedule.to_json()
    data = json.loads(text)
    assert data["format"] == 1 and len(data["steps"]) == len(steps)
    t2 = case.make()                                   # new Tensor objects, same arrays and shapes
    assert t2 is not t and t2.node is not t.node
    tree2 = t2.loop_tree(text)
    assert str(tree2) == str(tree)
    program, _ = ir.lower(t2.node)
    sched = lt.Schedule.from_json(text, program)
    assert sched.stages == tree.schedule.stages
    assert str(t2.loop_tree(sched)) == str(tree)
    a, b, c = t.numpy(tree), t2.numpy(text), t2.numpy(sched)
    assert np.array_equal(a, b) and np.array_equal(a, c)


def test_json_schedule_on_new_arrays_of_the_same_shape(rng):
    m, k, n = lt.symbols("m k n")
    a1, b1 = rng.standard_normal((7, 9)).astype(np.float32), rng.standard_normal((9, 20)).astype(np.float32)
    a2, b2 = rng.standard_normal((7, 9)).astype(np.float32), rng.standard_normal((9, 20)).astype(np.float32)
    t1 = (lt.Tensor(a1).to(m, k) * lt.Tensor(b1).to(k, n)).sum(k)
    text = t1.loop_tree().split("n", 8).vectorize("n.1").reorder("k", "m").schedule.to_json()
    t2 = (lt.Tensor(a2).to(m, k) * lt.Tensor(b2).to(k, n)).sum(k)
    got = t2.numpy(text)
    assert np.max(np.abs(got - a2.astype(np.float64) @ b2)) / np.max(np.abs(a2.astype(np.float64) @ b2)) < 1e-5


# ------------------------------------------------------------------ transforms that cannot be built

def test_split_of_a_loop_shared_with_a_placed_stage_is_refused(rng):
    t = softmax(rng, 4, 5).make()
    tree = t.loop_tree().place("t1", "t2", 1)
    with pytest.raises(ValueError, match=r"(?s)cannot split loop 'm' of stage t2.*t1 is placed inside it"):
        tree.split("m", 2)
    with pytest.raises(ValueError, match=r"cannot reorder loop 'm' of stage t2"):
        tree.reorder("n", "m")
    tree.split("n", 2)  # the loops it does not share are fine


def test_loops_of_a_placed_stage_below_a_stage_placed_in_it_can_be_reshaped(rng):
    """Depths of stages placed inside a placed stage count the loops it shares with its consumer."""
    case = matmul(rng, 8, 6, 8)
    c = case.make()
    t = c.loop_tree().cache_write().split("m", 4).split("n", 4).reorder("m.0", "n.0", "m.1", "n.1")
    t = t.place("t0.acc", "t0", 2).split("k", 2, stage="t0.acc").reorder("k.0", "m.1", "n.1", "k.1", stage="t0.acc")
    t = t.cache("in0", stage="t0.acc").place("in0.t0.acc", "t0.acc", 3)
    t = t.split("m.1", 2, stage="t0.acc")            # inside k.0, where the copy is placed: fine
    with pytest.raises(ValueError, match=r"(?s)cannot split loop 'k.0' of stage t0.acc.*in0.t0.acc is placed"):
        t.split("k.0", 2, stage="t0.acc")
    assert t.check() == (True, "legal")
    case.check(c.numpy(t))


def test_bad_transform_arguments(rng):
    tree = matmul(rng, 4, 5, 6).make().loop_tree()
    with pytest.raises(ValueError, match="factor must be a positive integer"):
        tree.split("k", 0)
    with pytest.raises(ValueError, match=r"no loop 'q'"):
        tree.split("q", 2)
    with pytest.raises(ValueError, match=r"no loop 'k.1'"):
        tree.unroll("k.1")
    with pytest.raises(ValueError, match="names a loop twice"):
        tree.reorder("m", "m")
    t = softmax(rng, 4, 5).make()
    with pytest.raises(ValueError, match=r"cannot place t0 at depth 3 of t2"):
        t.loop_tree().place("t0", "t2", 3)
    with pytest.raises(ValueError, match=r"cannot place t2 inside t1: t1 is computed inside t2"):
        t.loop_tree().place("t1", "t2", 1).place("t2", "t1", 1)


def test_non_contiguous_inputs_under_a_schedule(rng):
    case = matmul(rng, 11, 13, 17, inp=lambda a: embed(a, rng, "transposed"))
    run_case(case, [("split", "n", 8), ("vectorize", "n.1"), ("reorder", "k", "m")], rng)
    case = softmax(rng, 6, 19, inp=lambda a: embed(a, rng, "padded"))
    run_case(case, [("place", "t0", "t2", 1), ("place", "t1", "t2", 1), ("split", "n", 4)], rng)
