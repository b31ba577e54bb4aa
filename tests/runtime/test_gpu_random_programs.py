"""Random programs on the GPU (issue 31), against a float64 NumPy evaluation of the same expression.

The programs come from tests/random_program_helpers.py, the generator of the CPU test
(tests/frontend/test_random_programs.py), extended here (`GpuBuilder`) by families the GPU
schedules differently:

* expression: the CPU test's own draws (pointwise chains, reductions over any dims, views);
* contraction: explicit sums of products of 1 to 3 operands over up to 5 dims of sizes 1..64
  (odd ones often), keeping some of the dims or none (a scalar); "dot product" draws only
  `(x * y).sum(c)`, and the GPU runs also draw a "big contraction", a matmul large enough for
  the GPU's contraction templates (register tiles, mma, wgmma);
* reduction: sum/max/min/mean of a term over some or all (a scalar) of its dims; "full
  reduction" reduces over all of them;
* pointwise and views: the CPU test's draws limited to pointwise operations, or rich in
  pad/window/concat;
* softmax: `(x - x.max(n)).exp()` divided by its sum over `n` (one or several dims), or that
  sum alone (a scalar where `n` is every dim);
* layernorm: `(x - mean) / sqrt(var + eps) * g + b` over one or several dims.

Any of them may have bfloat16 or float16 inputs (ml_dtypes), and then sometimes a result rounded
back to that type.

Each program runs on the GPU (marked `gpu`: `python -m pytest -m gpu`) under its untuned
schedule (`runtime.gpu.automatic_tree`, the one `.cuda()` runs with no tuned schedule stored:
the tuning database is turned off here), into an output filled with NaN first, so an element a
kernel skips fails the check; then through `.cuda()` itself; then under a few random GPU
schedules that `tree.check()` accepts: half are draws of the tuner's GPU space
(`tuner.space.sample_gpu`, driven by hypothesis through `ChooserTrial`), half random transform
steps (tests/schedule_helpers.random_steps) with loops then bound to blocks and threads
(`random_binds`). Every `EXPORT_EVERY`-th program is also exported (`lt.export(..., device="gpu")`),
loaded back and run. The default GPU run (`-m gpu`) draws `CI_DRAWS` (40) derandomized programs,
`FAMILY_DRAWS` of each family (one test per family: `-k contraction` picks some); `-m "gpu and slow"`
draws `SLOW_DRAWS` (310) fresh ones. No shrinking (each step compiles kernels): a failure's
hypothesis notes give its program, its schedule and how the schedule was drawn.

Without a GPU, `test_automatic_gpu_schedule_on_the_cpu` (not marked, so CI runs it) draws
`len(CPU_PROGRAMS)` programs, builds the automatic GPU schedule for sm_90 and sm_80, checks it is
legal, runs it on the CPU (GPU-bound loops run as plain loops) into a NaN-filled output and
compares, generates its PTX for that arch, and runs a few random legal GPU schedules the same way.

Tolerances: errors are measured against the largest magnitude computed on the way
(tests/random_program_helpers.check): 1e-5 for float32 programs, half-precision inputs included (they
are read exactly and computed in float32, and the reference starts from the same half values),
1e-12 for float64 ones; a result rounded back to half precision may also be off by that one
rounding, its unit roundoff (2**-8 bfloat16, 2**-11 float16) of the magnitude, as in
tests/frontend/test_half_precision.py.

Refusals: a program or schedule the GPU cannot run must say why in plain words. The test accepts
exactly the ValueError/NotImplementedError messages listed in `PROGRAM_REFUSALS` (for any
schedule) and `SCHEDULE_REFUSALS` (for a random schedule only, never the automatic one), and
counts them; every other exception (an IndexError from inside the scheduler, a wrong or missing
element) fails the test.
"""
from __future__ import annotations

import collections
import itertools
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import Phase, given, note, settings
from hypothesis import strategies as st

import looptool as lt
from looptool import ir
from looptool.codegen import gpu as codegen_gpu
from looptool.runtime import gpu as runtime_gpu
from tests.gpu_helpers import cupy_or_skip
from tests.helpers import rtol_for
from tests.random_program_helpers import COMMON, MAX_DEPTH, Builder, Term, check, made
from tests.schedule_helpers import (HypothesisChooser, RandomChooser, Rejected, apply_steps, draw_size, random_steps,
                                    steps_text, without)
from tuner import space

# programs per family: (default GPU run, derandomized; slow GPU run, fresh)
FAMILY_DRAWS = {"contraction": (8, 60), "dot product": (3, 20), "big contraction": (3, 8), "expression": (4, 60),
                "reduction": (4, 30), "full reduction": (2, 12), "pointwise": (4, 30), "views": (4, 30),
                "softmax": (4, 30), "layernorm": (4, 30)}
CI_DRAWS = sum(default for default, _ in FAMILY_DRAWS.values())     # 40
SLOW_DRAWS = sum(slow for _, slow in FAMILY_DRAWS.values())         # 310
RANDOM_SCHEDULES = 3          # draws of a random GPU schedule per program (the illegal ones are skipped)
EXPORT_EVERY = 10             # export, load and run every 10th program
CONTRACTION_SIZE = 64         # the largest size of a contraction's dims
MAX_ITERATIONS = 1 << 18      # of a contraction's iteration space (sizes are halved down to it)
HALF_PERCENT = 20             # of programs with half-precision inputs
LAYERNORM_EPS = 1e-2          # a largish eps keeps float32 layer norm well conditioned on rows of 1 or 2
UNIT_ROUNDOFF = {np.dtype(lt.bfloat16): 2.0 ** -8, np.dtype(lt.float16): 2.0 ** -11}
BFLOAT16_NAN = 0x7FC0
ARCHS = ("sm_90", "sm_80")    # the CPU variant's targets: Hopper (wgmma) and Ampere (mma)

# What the GPU may refuse, as (name, pattern of the message of a ValueError or NotImplementedError).
# For any program and schedule: math the GPU backend has no code for yet (codegen.gpu).
PROGRAM_REFUSALS = (
    ("float64 exp, log, tanh or erf on the GPU", r"^(exp|log|tanh|erf) of float64 is not supported on the GPU backend"),
)
# For a random schedule only (the automatic schedule must stay within them): the GPU's limits.
SCHEDULE_REFUSALS = (
    ("over 1024 threads a block", r"^a GPU block of \d+x\d+x\d+ threads exceeds the 1024-thread limit"),
    ("too much local memory", r"^buffer \S+ \(\d+ bytes\) is too large for a GPU thread's local memory"),
    ("too much shared memory", r"needs \d+ bytes of shared memory a block; this GPU allows \d+"),
)


def refusal(err: BaseException, automatic: bool) -> str | None:
    """The name of the allowed refusal `err` is (None: it is a bug, re-raise it)."""
    if type(err) not in (ValueError, NotImplementedError):      # not IllegalScheduleError either
        return None
    allowed = PROGRAM_REFUSALS + (() if automatic else SCHEDULE_REFUSALS)
    return next((name for name, pattern in allowed if re.search(pattern, str(err))), None)


# ------------------------------------------------------------------ programs

def syms(dims) -> tuple:
    return tuple(lt.symbols(" ".join(dims))) if dims else ()


class GpuBuilder(Builder):
    """The CPU test's Builder plus the GPU test's families, half-precision inputs and results."""

    KINDS = {"pointwise": ("unary", "binary", "binary", "scalar"),
             "views": ("view", "view", "unary", "binary", "scalar", "reduce")}

    def __init__(self, ch, rng: np.random.Generator):
        super().__init__(ch, rng)
        self.kinds = None
        self.half = ch.choice([lt.bfloat16, lt.float16]) if ch.chance(HALF_PERCENT) else None
        if self.half is not None:
            self.dtype = np.float32           # half values are computed in float32

    def term(self, depth: int) -> Term:
        if self.kinds is None:
            return super().term(depth)
        if depth == 0 or self.ch.chance(20):
            return self.leaf()
        return getattr(self, self.ch.choice(self.kinds))(depth)

    def leaf(self) -> Term:
        term = super().leaf()
        if self.half is None:
            return term
        array = term.value.astype(self.half)
        return made(lt.Tensor(array).to(*syms(term.dims)), array.astype(np.float64), term.dims)

    def input(self, dims: tuple[str, ...], low: float | None = None, high: float | None = None) -> Term:
        """An input over `dims` in the program's precision: standard normal, or uniform in [low, high)."""
        shape = [self.sizes[d] for d in dims]
        values = self.rng.standard_normal(shape) if low is None else self.rng.uniform(low, high, shape)
        array = values.astype(self.half or self.dtype)
        return made(lt.Tensor(array).to(*syms(dims)), array.astype(np.float64), dims)

    def nonscalar(self, depth: int) -> Term:
        x = self.term(depth)
        return x if x.dims else self.leaf()

    # families ---------------------------------------------------------------
    def contraction(self, scalar: bool | None = None, dot: bool = False) -> Term:
        """sum over `over` of the product of 1 to 3 operands, each over some of up to 5 dims."""
        ch = self.ch
        if dot:                                             # (x * y).sum(c)
            dims = [self.new_dim(draw_size(ch, CONTRACTION_SIZE))]
            operands = [tuple(dims), tuple(dims)]
        else:
            dims = [self.new_dim(draw_size(ch, CONTRACTION_SIZE)) for _ in range(ch.int(1, 5))]
            while self.elements(dims) > MAX_ITERATIONS:
                largest = max(dims, key=self.sizes.get)
                self.sizes[largest] //= 2
            operands = [tuple(ch.permutation(dims)[:ch.int(1, len(dims))]) for _ in range(ch.int(1, 3))]
            operands[-1] += tuple(d for d in dims if not any(d in op for op in operands))
        terms = [self.input(op) for op in operands]
        product = tuple(dict.fromkeys(d for op in operands for d in op))     # the order `*` gives
        scalar = dot or (ch.chance(20) if scalar is None else scalar)
        over = product if scalar else tuple(ch.permutation(product)[:ch.int(1, max(1, len(product) - 1))])
        return self.summed(terms, over)

    def big_contraction(self) -> Term:
        """A matmul of two float32 or half-precision matrices (either layout) large enough for the GPU's
        contraction templates (its result is not rounded: a template takes a single stage), sometimes
        with tails of their tiles in m and k; not in n, the contiguous dim: the PTX of float32 register
        tiles with a tail there takes 20-40 s to generate (e.g. 136 x 64 x 136)."""
        ch = self.ch
        m = self.new_dim(ch.choice([256, 128, 136, 200]))     # the first choices (hypothesis's first
        n = self.new_dim(ch.choice([256, 128]))               # draw) fit the wgmma template
        k = self.new_dim(ch.choice([64, 32, 96, 70]))
        if self.half is None:
            self.dtype = np.float32
        a = self.input((m, k) if ch.chance(70) else (k, m))
        b = self.input((k, n) if ch.chance(70) else (n, k))
        return self.summed([a, b], (k,))

    def summed(self, terms: list[Term], over: tuple[str, ...]) -> Term:
        product = tuple(dict.fromkeys(d for t in terms for d in t.dims))
        kept = tuple(d for d in product if d not in over)
        tensor = terms[0].tensor
        for t in terms[1:]:
            tensor = tensor * t.tensor
        letters = {d: chr(ord("a") + i) for i, d in enumerate(product)}
        spec = ",".join("".join(letters[d] for d in t.dims) for t in terms) + "->" + "".join(letters[d] for d in kept)
        value = np.einsum(spec, *[t.value for t in terms])
        partial = float(np.einsum(spec, *[np.abs(t.value) for t in terms]).max(initial=0.0))   # bounds partial sums
        return made(tensor.sum(*syms(over)), value, kept, *terms, partial)

    def reduction(self, depth: int, full: bool | None = None) -> Term:
        """sum/max/min/mean of a term over some of its dims, or all of them (a scalar)."""
        x = self.nonscalar(depth - 1)
        full = self.ch.chance(15) if full is None else full
        over = x.dims if full else tuple(self.ch.permutation(x.dims)[:self.ch.int(1, max(1, len(x.dims) - 1))])
        axes = tuple(x.dims.index(d) for d in over)
        op = self.ch.choice(["sum", "max", "min", "mean"])
        partial = float(np.asarray(getattr(np, op)(np.abs(x.value), axis=axes)).max(initial=0.0))
        return made(getattr(x.tensor, op)(*syms(over)), getattr(np, op)(x.value, axis=axes),
                    tuple(d for d in x.dims if d not in over), x, partial)

    def softmax(self) -> Term:
        """(x - x.max(n)).exp() / its sum over n, or that sum alone; n one or several of x's dims."""
        x = self.nonscalar(self.ch.int(0, 1))          # a leaf or one operation: see the module doc
        over = tuple(self.ch.permutation(x.dims)[:self.ch.int(1, len(x.dims))])
        axes = tuple(x.dims.index(d) for d in over)
        e = (x.tensor - x.tensor.max(*syms(over))).exp()
        e_value = np.exp(x.value - x.value.max(axis=axes, keepdims=True))
        if self.ch.chance(25):
            return made(e.sum(*syms(over)), e_value.sum(axis=axes), tuple(d for d in x.dims if d not in over), x)
        return made(e / e.sum(*syms(over)), e_value / e_value.sum(axis=axes, keepdims=True), x.dims, x)

    def layernorm(self) -> Term:
        """(x - mean) / sqrt(var + eps) * g + b over one or several of x's dims; g, b over those dims."""
        x = self.nonscalar(0)
        over = tuple(self.ch.permutation(x.dims)[:self.ch.int(1, len(x.dims))])
        g = self.input(tuple(self.ch.permutation(over)), 0.5, 1.5)
        b = self.input(tuple(self.ch.permutation(over))[:self.ch.int(0, len(over))] or over[:1], -0.5, 0.5)
        s = syms(over)
        mu = x.tensor.mean(*s)
        d = x.tensor - mu
        y = d / ((d * d).mean(*s) + LAYERNORM_EPS).sqrt() * g.tensor + b.tensor
        axes = tuple(x.dims.index(dim) for dim in over)
        d_value = x.value - x.value.mean(axis=axes, keepdims=True)
        normed = d_value / np.sqrt((d_value * d_value).mean(axis=axes, keepdims=True) + LAYERNORM_EPS)
        value = normed * self.spread(g, x.dims) + self.spread(b, x.dims)
        return made(y, value, x.dims, x, g, b)

    def rounded(self, term: Term) -> Term:
        """Sometimes the result of a half-precision program, rounded back to its type (where it fits)."""
        if self.half is None or self.ch.chance(60) or np.abs(term.value).max(initial=0.0) > 1e4:
            return term
        return Term(term.tensor.astype(self.half), term.value, term.dims, term.magnitude)


FAMILIES = ("expression", "contraction", "contraction", "reduction", "pointwise", "views", "softmax", "layernorm")
FAMILY_SEEDS = {family: i for i, family in enumerate(FAMILY_DRAWS)}


@dataclass
class Drawn:
    family: str
    builder: GpuBuilder
    term: Term

    @property
    def tensor(self) -> lt.Tensor:
        return self.term.tensor

    @property
    def scalar(self) -> bool:
        return not self.term.dims

    @property
    def rtol(self) -> float:
        """float32 or float64 accuracy (the program's precision), plus one rounding of a half result."""
        rtol = rtol_for(self.builder.dtype)
        return rtol + UNIT_ROUNDOFF.get(np.dtype(self.tensor.dtype), 0.0)

    def describe(self) -> str:
        t = self.tensor
        return (f"{self.family}: dims {self.term.dims} sizes {self.builder.sizes} dtype {t.dtype} "
                f"half inputs {self.builder.half}\n{t.loop_tree()}")


def draw_program(ch, rng: np.random.Generator, family: str | None = None) -> Drawn:
    """A program of `family` (default: a random one of FAMILIES); 'dot product' and 'full reduction'
    are scalars, 'big contraction' a matmul for the GPU's templates (the GPU runs only: the CPU
    takes seconds to run their schedules)."""
    builder = GpuBuilder(ch, rng)
    family = family or ch.choice(FAMILIES)
    if family == "contraction":
        term = builder.contraction()
    elif family == "big contraction":
        term = builder.big_contraction()
    elif family == "dot product":
        term = builder.contraction(dot=True)
    elif family == "reduction":
        term = builder.reduction(ch.int(1, MAX_DEPTH))
    elif family == "full reduction":
        term = builder.reduction(ch.int(1, MAX_DEPTH), full=True)
    elif family == "softmax":
        term = builder.softmax()
    elif family == "layernorm":
        term = builder.layernorm()
    else:
        builder.kinds = GpuBuilder.KINDS.get(family)
        term = builder.term(ch.int(1, MAX_DEPTH))
    drawn = Drawn(family, builder, term if family == "big contraction" else builder.rounded(term))
    assert tuple(str(d) for d in drawn.tensor.dims) == drawn.term.dims
    return drawn


# ------------------------------------------------------------------ random GPU schedules

class ChooserTrial:
    """The part of an optuna Trial that tuner.space.sample_gpu asks (suggest_categorical), answered by
    a chooser, so that hypothesis draws the tuner's GPU schedules (and replays a failing one)."""

    def __init__(self, ch):
        self.ch, self.params = ch, {}

    def suggest_categorical(self, name: str, choices):
        self.params[name] = self.ch.choice(choices)
        return self.params[name]


THREADS = (2, 4, 8, 16, 32, 64, 128, 256)


def random_binds(tree: lt.LoopTree, ch) -> tuple[lt.LoopTree, list]:
    """Bind loops of every stage not computed inside threads already: one loop's inner part (a
    pure dim, now and then a reduction, which threads then combine) to thread.x, sometimes another
    to thread.y; at the root, up to three pure loops to blocks, moved outermost with the thread
    loops after them. Stages placed inside a stage keep the loops they share with it. Raises
    Rejected where a transform refuses."""
    steps: list = []

    def apply(*new):
        nonlocal tree
        try:
            tree = apply_steps(tree, new)
        except lt.IllegalScheduleError:
            raise
        except ValueError as err:
            raise Rejected(f"{steps_text(steps + list(new))}: {err}") from None
        steps.extend(new)

    for stage in tree.program.stages:
        name, kw = stage.name, {"stage": stage.name}
        sched = tree.schedule
        own = sched.of(name)
        if any(lp.annotation.startswith("thread.") for lp in sched.effective_loops(name)[:own.at]):
            continue
        cut = max([sched.of(o).at - own.at for o in sched.placed_in(name)] + [0])
        free = own.loops[cut:]
        pure = [lp for lp in free if lp.dim not in stage.reduce_dims]
        summed = [lp for lp in free if lp.dim in stage.reduce_dims]
        candidates = summed if summed and (not pure or ch.chance(25)) else pure
        threads, budget = [], 1024
        for axis in ("thread.x", "thread.y"):
            left = [lp for lp in candidates if lp.name not in threads and f"{lp.name}.1" not in threads]
            if not left or not ch.chance(85 if axis == "thread.x" else 30):
                break
            lp = left[-1] if ch.chance(50) else ch.choice(left)
            count = ch.choice([t for t in THREADS if t <= budget] or [1])
            if count < lp.extent:
                apply(("split", lp.name, count, kw))
                threads.append(f"{lp.name}.1")
            else:
                threads.append(lp.name)
            budget //= max(count, 1)
        loops = tree.schedule.of(name).loops
        blocks: list[str] = []
        if own.consumer is None:
            if cut:        # loops a placed stage shares: the pure ones the stage starts with
                leading = itertools.takewhile(lambda lp: lp.dim not in stage.reduce_dims, loops[:cut])
                blocks = [lp.name for lp in leading][:ch.int(0, 3)]
            else:
                outer = [lp.name for lp in loops if lp.dim not in stage.reduce_dims and lp.name not in threads]
                blocks = ch.permutation(outer)[:ch.int(0, min(3, len(outer)))]
        free_names = [lp.name for lp in loops[cut:]]
        order = [b for b in blocks if b in free_names] + threads[::-1]
        order += [n for n in free_names if n not in order]
        if len(free_names) > 1 and order != free_names:
            apply(("reorder", *order, kw))
        for loop, axis in zip(blocks, ("block.x", "block.y", "block.z")):
            apply(("bind", loop, axis, kw))
        for loop, axis in zip(threads, ("thread.x", "thread.y")):
            apply(("bind", loop, axis, kw))
    return tree, steps


def random_gpu_tree(program: ir.Program, ch) -> tuple[lt.LoopTree, str]:
    """A random GPU schedule of `program` and how it was drawn: a draw of the tuner's GPU space, or
    random transform steps (no CPU `parallel`) then `random_binds`. Raises Rejected where a
    transform or the tuner's space refuses the draw (not yet checked for legality)."""
    tree = lt.LoopTree(program)
    if ch.chance(50):
        trial = ChooserTrial(ch)
        try:
            return space.sample_gpu(trial, tree), f"tuner.space.sample_gpu {trial.params}"
        except space.InvalidDraw as err:
            raise Rejected(f"tuner.space.sample_gpu {trial.params}: {err}") from None
    tree, steps = random_steps(tree, ch, max_steps=4)
    if any(step[0] == "parallel" for step in steps):
        steps = without(steps, "parallel")
        tree = apply_steps(lt.LoopTree(program), steps)
    tree, binds = random_binds(tree, ch)
    return tree, f"steps {steps_text(steps + binds)}"


# ------------------------------------------------------------------ running

def as_float64(array) -> np.ndarray:
    return np.asarray(array).astype(np.float64)


def poisoned_device_output(shape, dtype: str):
    """A NaN-filled device array for a kernel to write its output into."""
    cp = runtime_gpu.cupy()
    if dtype == "bfloat16":
        return runtime_gpu.BFloat16Array(cp.full(tuple(shape), BFLOAT16_NAN, dtype=cp.uint16))
    return cp.full(tuple(shape), np.nan, dtype=dtype)


def run_on_gpu(tree: lt.LoopTree, arrays: list) -> np.ndarray:
    """`tree` compiled for this GPU and run into a NaN-filled output, brought back as float64."""
    plan = tree.buffers[tree.program.output.name]
    out = poisoned_device_output(plan.shape, plan.dtype)
    got = runtime_gpu.kernel_for(tree)(arrays, out=out)
    assert got is out
    return as_float64(runtime_gpu.to_host(got))


def run_on_cpu(drawn: Drawn, tree: lt.LoopTree, arrays: list) -> np.ndarray:
    """`tree` compiled for the CPU (GPU-bound loops run as plain loops) into a NaN-filled output."""
    plan = tree.buffers[tree.program.output.name]
    out = np.full(tuple(plan.shape), np.nan, dtype=plan.dtype)
    got = drawn.tensor.compile(tree)(arrays, out=out)
    assert got is out
    return as_float64(got)


def run_exported(drawn: Drawn, arrays: list, stats) -> None:
    """Export for this GPU, load back, run into a NaN-filled output and through the loaded kernel's call."""
    with tempfile.TemporaryDirectory() as folder:
        loaded = lt.load(lt.export(drawn.tensor, Path(folder) / "kernel", device="gpu"))
        out = poisoned_device_output(loaded.output["shape"], loaded.output["dtype"])
        assert loaded.runner(list(arrays), out=out) is out
        check(as_float64(runtime_gpu.to_host(out)), drawn.term, drawn.rtol)
        check(as_float64(runtime_gpu.to_host(loaded(*arrays))), drawn.term, drawn.rtol)
    stats["exports"] += 1


def count_program(drawn: Drawn, stats):
    stats["programs"] += 1
    stats[f"family: {drawn.family}"] += 1
    stats["scalar results"] += drawn.scalar
    stats["half-precision inputs"] += drawn.builder.half is not None


def run_one_on_gpu(data, stats, family: str):
    ch = HypothesisChooser(data)
    rng = np.random.default_rng([data.draw(st.integers(0, 2**32 - 1), label="data seed"), FAMILY_SEEDS[family]])
    drawn = draw_program(ch, rng, family)
    note(drawn.describe())
    program, arrays = ir.lower(drawn.tensor.node)
    try:
        tree = runtime_gpu.automatic_tree(program)
        note(f"automatic GPU schedule\n{tree}")
        assert tree.check() == (True, "legal")
        got = run_on_gpu(tree, arrays)
    except (ValueError, NotImplementedError) as err:
        if (name := refusal(err, automatic=True)) is None:
            raise
        stats[f"refused: {name}"] += 1
        return
    check(got, drawn.term, drawn.rtol)
    check(as_float64(runtime_gpu.to_host(drawn.tensor.cuda())), drawn.term, drawn.rtol)
    if stats["programs"] % EXPORT_EVERY == 0:
        run_exported(drawn, arrays, stats)
    count_program(drawn, stats)
    for _ in range(RANDOM_SCHEDULES):
        try:
            tree, how = random_gpu_tree(program, ch)
        except Rejected:
            continue
        stats["random schedules drawn"] += 1
        if not tree.check()[0]:
            continue
        note(f"random GPU schedule: {how}\n{tree}")
        try:
            got = run_on_gpu(tree, arrays)
        except (ValueError, NotImplementedError) as err:
            if (name := refusal(err, automatic=False)) is None:
                raise
            stats[f"random schedule refused: {name}"] += 1
            continue
        check(got, drawn.term, drawn.rtol)
        stats["legal random schedules"] += 1


@pytest.fixture(scope="module", autouse=True)
def no_tuned_schedules():
    """`.cuda()` with no schedule runs the automatic one: no tuning database is looked in."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOOPTOOL_TUNING_DB", "")
        yield


STATS = collections.Counter()
SLOW_STATS = collections.Counter()


# No shrinking: each step of it compiles kernels again (on the CPU dry run, hypothesis gave up
# shrinking one failure after 5 minutes); the notes describe the failing program and schedule.
NO_SHRINKING = [Phase.explicit, Phase.reuse, Phase.generate]


def gpu_draws(family: str, examples: int, stats, derandomize: bool):
    """`examples` programs of `family` run on the GPU, counted in `stats`."""
    @settings(max_examples=examples, derandomize=derandomize, phases=NO_SHRINKING, **COMMON)
    @given(st.data())
    def draws(data):
        run_one_on_gpu(data, stats, family)
    return draws


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILY_DRAWS)
def test_random_programs_on_the_gpu(family):
    cupy_or_skip()
    gpu_draws(family, FAMILY_DRAWS[family][0], STATS, derandomize=True)()


def assert_meaningful(stats, programs: int):
    """Most draws ran (the others refused in plain words) and were checked, under random schedules
    too, some were exported; every family ran, scalars and half precision among them."""
    print(f"\nrandom GPU programs: {dict(sorted(stats.items()))}")
    assert stats["programs"] >= programs * 3 // 5, dict(stats)
    assert stats["legal random schedules"] >= stats["programs"] // 2, dict(stats)
    assert stats["exports"] >= stats["programs"] // EXPORT_EVERY, dict(stats)
    assert stats["scalar results"] > 0 and stats["half-precision inputs"] > 0, dict(stats)
    assert all(stats[f"family: {family}"] > 0 for family in FAMILY_DRAWS), dict(stats)


@pytest.mark.gpu
def test_random_programs_on_the_gpu_were_meaningful():
    """Runs after test_random_programs_on_the_gpu."""
    if not STATS["programs"]:
        pytest.skip("test_random_programs_on_the_gpu did not run in this session")
    assert_meaningful(STATS, CI_DRAWS)


def asked_for_slow(config) -> bool:
    """Whether -m names `slow`: `-m gpu` alone runs the default GPU draws, not the slow ones."""
    return "slow" in (config.getoption("markexpr") or "")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILY_DRAWS)
def test_many_random_programs_on_the_gpu(request, family):
    if not asked_for_slow(request.config):
        pytest.skip('the slow GPU draws run with -m "gpu and slow"')
    cupy_or_skip()
    gpu_draws(family, FAMILY_DRAWS[family][1], SLOW_STATS, derandomize=False)()


@pytest.mark.gpu
@pytest.mark.slow
def test_many_random_programs_on_the_gpu_were_meaningful():
    """Runs after test_many_random_programs_on_the_gpu."""
    if not SLOW_STATS["programs"]:
        pytest.skip("test_many_random_programs_on_the_gpu did not run in this session")
    assert_meaningful(SLOW_STATS, SLOW_DRAWS)


# ------------------------------------------------------------------ without a GPU

# (family, seed): every family, the scalar ones (issue 31) explicitly, some with half precision
CPU_PROGRAMS = [("dot product", 0), ("dot product", 1), ("full reduction", 2), ("contraction", 3),
                ("contraction", 4), ("contraction", 5), ("contraction", 6), ("expression", 7), ("expression", 8),
                ("reduction", 9), ("reduction", 10), ("pointwise", 11), ("pointwise", 12), ("views", 13),
                ("views", 14), ("softmax", 15), ("softmax", 16), ("layernorm", 17), ("layernorm", 18),
                (None, 19)]
CPU_STATS = collections.Counter()


@pytest.mark.parametrize("family, seed", CPU_PROGRAMS, ids=[f"{f or 'any'}-{s}" for f, s in CPU_PROGRAMS])
def test_automatic_gpu_schedule_on_the_cpu(family, seed):
    """The automatic GPU schedule of a random program, for sm_90 and sm_80: legal, right on the CPU,
    and its PTX generated; then a few random GPU schedules, where legal, likewise (for sm_80)."""
    ch = RandomChooser(seed)
    drawn = draw_program(ch, np.random.default_rng(seed), family)
    print(drawn.describe())
    program, arrays = ir.lower(drawn.tensor.node)
    for arch in ARCHS:
        tree = runtime_gpu.automatic_tree(program, arch)
        print(f"automatic GPU schedule for {arch}\n{tree}")
        assert tree.check() == (True, "legal")
        check(run_on_cpu(drawn, tree, arrays), drawn.term, drawn.rtol)
        try:
            module = codegen_gpu.generate(tree, arch)
        except (ValueError, NotImplementedError) as err:
            if (name := refusal(err, automatic=True)) is None:
                raise
            CPU_STATS[f"refused: {name}"] += 1
            continue
        assert module.launches and f".target {arch}" in module.ptx
        CPU_STATS["PTX generated"] += 1
    count_program(drawn, CPU_STATS)
    for _ in range(RANDOM_SCHEDULES):
        try:
            tree, how = random_gpu_tree(program, ch)
        except Rejected:
            continue
        if not tree.check()[0]:
            continue
        print(f"random GPU schedule: {how}\n{tree}")
        check(run_on_cpu(drawn, tree, arrays), drawn.term, drawn.rtol)
        try:
            codegen_gpu.generate(tree, ARCHS[-1])
        except (ValueError, NotImplementedError) as err:
            if refusal(err, automatic=False) is None:
                raise
        CPU_STATS["legal random schedules"] += 1


def test_automatic_gpu_schedules_on_the_cpu_were_meaningful():
    """Runs after test_automatic_gpu_schedule_on_the_cpu: most programs compiled to PTX."""
    if not CPU_STATS["programs"]:
        pytest.skip("test_automatic_gpu_schedule_on_the_cpu did not run in this session")
    print(f"\nGPU schedules on the CPU: {dict(sorted(CPU_STATS.items()))}")
    assert CPU_STATS["PTX generated"] >= CPU_STATS["programs"], dict(CPU_STATS)
    assert CPU_STATS["legal random schedules"] > 0 and CPU_STATS["half-precision inputs"] > 0, dict(CPU_STATS)
