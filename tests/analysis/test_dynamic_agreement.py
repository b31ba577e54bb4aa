"""Random schedules over a dynamic dim, against the same schedules at fixed sizes (issue 28).

The check at fixed sizes is itself tested against a brute-force oracle (test_oracle.py). Here, for
schedules drawn at random (splits of the dynamic loops, reorders, parallel loops, unrolled and
vectorized inner loops, packed copies): where the dynamic check says legal, the schedule is legal at
every fixed size tried, and its one kernel computes every size right with nothing read or written
outside its arrays; where it says illegal at a size, the schedule at that fixed size is illegal too.
"""
import re

import numpy as np
import pytest

import looptool as lt
from tests.helpers import assert_close

SIZES = (1, 2, 3, 5, 8, 13, 21)
K, N = 6, 20


def matmul(x, w, b, k, n):
    return (lt.Tensor(x).to(b, k) * lt.Tensor(w).to(k, n)).sum(k), x.astype(np.float64) @ w


def column_max(x, w, b, k, n):
    return lt.Tensor(x).to(b, k).max(b) * 2.0, 2.0 * x.astype(np.float64).max(0)


def rows_then_columns(x, w, b, k, n):
    rows = (lt.Tensor(x).to(b, k) * lt.Tensor(w).to(k, n)).sum(k)          # t0[b, n]
    return rows.sum(b), (x.astype(np.float64) @ w).sum(0)


def draw(tree: lt.LoopTree, rng) -> lt.LoopTree:
    """A few random transforms of `tree` (each that the schedule refuses is skipped)."""
    for _ in range(int(rng.integers(2, 8))):
        stage = str(rng.choice([st.name for st in tree.program.stages]))
        loops = [lp.name for lp in tree.schedule.of(stage).loops]
        if not loops:
            continue
        over_b = [name for name in loops if name.startswith("b")]
        loop = str(rng.choice(over_b if over_b and rng.integers(2) else loops))
        choice = int(rng.integers(0, 6))
        try:
            if choice <= 1:
                tree = tree.split(loop, int(rng.choice([2, 3, 4, 8])), stage=stage)
            elif choice == 2:
                tree = tree.reorder(*rng.permutation(loops).tolist(), stage=stage)
            elif choice == 3:
                tree = tree.parallel(loop, stage=stage)
            elif choice == 4:
                tree = tree.unroll(loop, stage=stage) if rng.integers(2) else tree.vectorize(loop, stage=stage)
            elif tree.program.inputs and stage == tree.program.output.name:
                tree = tree.cache("in0", stage=stage).place(f"in0.{stage}", stage, int(rng.integers(0, len(loops))))
        except ValueError:
            continue
    return tree


def at_size(program_of, tree: lt.LoopTree, size: int) -> lt.LoopTree:
    """The same schedule on the fixed-size program of `size` rows."""
    return lt.LoopTree(program_of(size), lt.Schedule.from_json(tree.schedule.to_json(), program_of(size)))


def guarded(build, size: int, tree, w, rng):
    """Run under `tree` on an x of `size` rows between NaN rows, into an out between sentinels."""
    memory = np.full((size + 2, K), np.nan, np.float32)
    x = memory[1:size + 1]
    x[...] = rng.standard_normal((size, K))
    b, k, n = lt.Symbol("b", dynamic=True), lt.Symbol("k"), lt.Symbol("n")
    tensor, reference = build(x, w, b, k, n)
    padded = np.full((3,) + tensor.shape, 7.0, tensor.dtype)
    result = tensor.compile(tree)(lt.runtime.lower_on_host(tensor.node)[1], out=padded[1])
    assert np.all(padded[0] == 7.0) and np.all(padded[2] == 7.0), "a write outside out"
    return result, reference


@pytest.mark.parametrize("build, breaks_by_size", [(matmul, False), (column_max, True), (rows_then_columns, True)])
# breaks_by_size: some drawn schedules must be refused at a size (a parallel loop over b, which they reduce)
def test_dynamic_verdicts_agree_with_fixed_sizes_and_legal_kernels_run_every_size(build, breaks_by_size, rng):
    w = rng.standard_normal((K, N)).astype(np.float32)
    k, n = lt.Symbol("k"), lt.Symbol("n")
    dynamic = build(np.zeros((4, K), np.float32), w, lt.Symbol("b", dynamic=True), k, n)[0].loop_tree()

    def program_of(size):
        return build(np.zeros((size, K), np.float32), w, lt.Symbol("b"), k, n)[0].loop_tree().program
    seen = set()
    legal_count = sized = 0
    while len(seen) < 20:
        tree = draw(dynamic, rng)
        if tree.schedule.to_json() in seen:
            continue
        seen.add(tree.schedule.to_json())
        legal, reason = tree.check()
        if legal:
            legal_count += 1
            for size in SIZES:
                assert at_size(program_of, tree, size).check() == (True, "legal"), (size, str(tree))
            for size in SIZES:
                result, reference = guarded(build, size, tree, w, rng)
                assert_close(result, reference, 1e-5)
        else:
            found = re.search(r"when b = (\d+) ", reason)
            if found:
                sized += 1
                assert not at_size(program_of, tree, int(found.group(1))).check()[0], reason
    assert legal_count and (sized or not breaks_by_size)   # drawn schedules that break at a size were checked
