"""A brute-force legality oracle: run a loop tree symbolically, one statement instance at a time.

Every instance of the original program (the default schedule) and of the scheduled tree is
executed in order on symbolic values: an input element is the name of that element; a pure
stage's element is the stage, its coordinates and the values its loads returned; a reduction's
element is its initialization plus the multiset (a set for max and min) of its contributions,
each the reduction coordinates and the values loaded, so sum, max and min may be reassociated
freely but not lose or repeat a contribution.  Memory is the memory the code generator makes:
a placed stage's buffer is shrunk to its tile (offsets subtracted, out-of-tile accesses are
errors) and is allocated afresh, empty, each time the loop it is placed in starts (for a
parallel loop: in each iteration, as each thread allocates its own), so a stale value is
never read by accident.

A schedule is legal for the oracle when
  - the scheduled tree leaves every element of the output with the same symbolic value as
    the original program (every flow dependence is met; an anti or output dependence that is
    broken shows up as a clobbered or stale value), and every access stays inside its tile;
  - no two iterations of one run of a parallel loop touch one memory cell with at least one
    write (a race: each iteration's threads see their own cells only where the buffer is
    allocated inside the loop);
  - no two iterations (lanes) of one run of a vectorized loop touch one cell with at least one
    write, except updates of one reduction (the lanes are combined).
Those are the rules legality.py documents, decided here by enumeration instead of by isl.
GPU-bound loops are outside this oracle (their trees are not drawn).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from looptool import ir
from looptool.schedule import LoopNode, LoopTree, StmtNode

UNDEFINED = ("undefined",)


class Values:
    """Hash-consing of symbolic values: equal values get equal small ints."""

    def __init__(self):
        self.ids: dict[tuple, int] = {}
        self.terms: list[tuple] = []

    def of(self, term: tuple) -> int:
        found = self.ids.get(term)
        if found is None:
            found = self.ids[term] = len(self.terms)
            self.terms.append(term)
        return found


@dataclass
class Lanes:
    """The accesses made so far in one run of a parallel or vectorized loop, by iteration."""

    loop: str
    vector: bool
    iteration: int = 0
    cells: dict = field(default_factory=dict)

    def conflict(self, cell, write: bool, reduction: str | None) -> bool:
        """Record an access of the current iteration; True when it races with another iteration's."""
        seen = self.cells.setdefault(cell, set())
        mine = (self.iteration, write, reduction)
        for other in seen:
            if other[0] == self.iteration or not (write or other[1]):
                continue
            if self.vector and reduction is not None and other[2] == reduction:
                continue  # lanes of one reduction are combined
            return True
        seen.add(mine)
        return False


class Run:
    """One symbolic execution of a loop tree; `problems` lists what went wrong, in words."""

    def __init__(self, tree: LoopTree, values: Values):
        self.tree, self.values = tree, values
        self.cells: dict = {}
        self.allocation = {name: 0 for name in tree.buffers}
        self.fresh = itertools.count(1)
        self.active: list[Lanes] = []
        self.problems: list[str] = []
        self.run(tree.root, {})

    def output(self) -> dict:
        """Symbolic value of every output element, by coordinates."""
        plan = self.tree.buffers[self.tree.program.output.name]
        return {elem: self.cells.get((plan.name, 0, elem), self.values.of(UNDEFINED))
                for elem in itertools.product(*(range(n) for n in plan.shape))}

    # walking -----------------------------------------------------------------------
    def run(self, body: list, env: dict):
        for node in body:
            if isinstance(node, StmtNode):
                self.statement(node, env)
            else:
                self.loop(node, env)

    def loop(self, node: LoopNode, env: dict):
        annotation = node.loop.annotation
        if annotation != "parallel":
            self.allocate(node)
        lanes = Lanes(node.loop.name, annotation == "vectorize") if annotation in ("parallel", "vectorize") else None
        if lanes:
            self.active.append(lanes)
        count = min([node.loop.extent] + [lim.count(env) for lim in node.limits])
        for value in range(count):
            if lanes:
                lanes.iteration = value
            if annotation == "parallel":
                self.allocate(node)  # each thread has its own copy
            self.run(node.body, {**env, node.loop.name: value})
        if lanes:
            self.active.pop()

    def allocate(self, node: LoopNode):
        """New, empty cells for the buffers placed at `node`."""
        for plan in self.tree.local_buffers.get(id(node), []):
            self.allocation[plan.name] = next(self.fresh)

    # statements ----------------------------------------------------------------------
    def statement(self, stmt: StmtNode, env: dict):
        stage = stmt.stage
        dims = {d: evaluate(a, env) for d, a in stmt.index.items()}
        own = tuple(dims[d] for d in stage.dims)
        reduction = stage.name if stmt.kind == "update" else None
        if stmt.kind == "init":
            value = self.values.of(("init", stage.name, own))
        else:
            loaded = tuple(self.loads(stage.expr, dims, env))
            if stmt.kind == "assign":
                value = self.values.of(("assign", stage.name, own, loaded))
            else:
                old = self.access(stage.name, own, env, False, reduction)
                contribution = (tuple(dims[d] for d in stage.reduce_dims), loaded)
                value = self.accumulate(old, stage, own, contribution)
        self.access(stage.name, own, env, False, reduction, value)

    def accumulate(self, old: int, stage: ir.Stage, own: tuple, contribution: tuple) -> int:
        term = self.values.terms[old]
        if term[:3] == ("init", stage.name, own):
            parts = ()
        elif term[:3] == ("reduce", stage.name, own):
            parts = term[3]
        else:  # into another value: wrong, unless overwritten later
            return self.values.of(("wrong", next(self.fresh)))
        parts = parts + (contribution,)
        parts = tuple(sorted(parts if stage.reduce_op == "sum" else set(parts)))
        return self.values.of(("reduce", stage.name, own, parts))

    def loads(self, e: ir.Expr, dims: dict, env: dict):
        """Values of the loads an expression really uses (only the taken side of a select)."""
        if isinstance(e, ir.Load):
            full = tuple(evaluate(ix, dims) for ix in e.index)
            yield self.access(e.buffer, full, env, e.clamped, None)
        elif isinstance(e, ir.Select):
            taken = all(g.lo <= evaluate(g.expr, dims) < g.hi for g in e.guards)
            yield from self.loads(e.then if taken else e.otherwise, dims, env)
        elif isinstance(e, ir.Unary | ir.Cast):
            yield from self.loads(e.x, dims, env)
        elif isinstance(e, ir.Binary):
            yield from self.loads(e.a, dims, env)
            yield from self.loads(e.b, dims, env)

    # memory ---------------------------------------------------------------------------
    def access(self, buffer: str, full: tuple, env: dict, clamped: bool, reduction: str | None,
               write: int | None = None) -> int:
        """Read (write=None) or write the element at full coordinates `full` of `buffer`."""
        plan = self.tree.buffers[buffer]
        offsets = dict(plan.offsets)
        elem = tuple(x - evaluate(offsets[d], env) if d in offsets else x for d, x in zip(plan.dims, full))
        if clamped:
            elem = tuple(min(max(x, 0), n - 1) for x, n in zip(elem, plan.shape))
        if not all(0 <= x < n for x, n in zip(elem, plan.shape)):
            self.problems.append(f"access to {buffer}{list(full)} falls outside its "
                                 f"{'tile' if plan.kind == 'local' else 'buffer'} {list(plan.shape)}")
            return self.values.of(("wrong", next(self.fresh)))
        if plan.kind == "input":
            return self.values.of(("input", buffer, elem))
        cell = (buffer, self.allocation[buffer], elem)
        for lanes in self.active:
            if lanes.conflict(cell, write is not None, reduction):
                kind = "vectorized" if lanes.vector else "parallel"
                self.problems.append(f"iterations of the {kind} loop '{lanes.loop}' both touch "
                                     f"{buffer}{list(elem)}, one writing")
        if write is None:
            return self.cells.get(cell, self.values.of(UNDEFINED))
        self.cells[cell] = write
        return write


def evaluate(a: ir.Affine, values: dict) -> int:
    return a.const + sum(c * values[v] for v, c in a.terms)


def verdict(tree: LoopTree) -> tuple[bool, str]:
    """(True, "legal") or (False, the first problem) by brute force, for a CPU loop tree."""
    values = Values()
    original = Run(LoopTree(tree.program), values)
    assert not original.problems, original.problems
    scheduled = Run(tree, values)
    if scheduled.problems:
        return False, scheduled.problems[0]
    want, got = original.output(), scheduled.output()
    for elem, value in want.items():
        if got[elem] != value:
            return False, f"output element {list(elem)} is wrong: {difference(values, got[elem], value)}"
    return True, "legal"


def difference(values: Values, got: int, want: int) -> str:
    """Where two symbolic values first differ, followed down through the values they loaded."""
    g, w = values.terms[got], values.terms[want]
    if g[:3] == w[:3] and g[0] == "assign":
        return first_difference(values, g[3], w[3])
    if g[:3] == w[:3] and g[0] == "reduce" and len(g[3]) == len(w[3]):
        for (g_at, g_loaded), (w_at, w_loaded) in zip(g[3], w[3]):
            if g_at != w_at:
                break
            if g_loaded != w_loaded:
                return first_difference(values, g_loaded, w_loaded)
    return f"{describe(values, got)} where {describe(values, want)} was due"


def first_difference(values: Values, got: tuple, want: tuple) -> str:
    return next(difference(values, a, b) for a, b in zip(got, want) if a != b)


def describe(values: Values, value: int) -> str:
    """A short text of a symbolic value (its outer term only)."""
    term = values.terms[value]
    if term[0] == "reduce":
        return f"{term[1]}{list(term[2])} reduced over {len(term[3])} contribution(s)"
    if term[0] in ("assign", "init"):
        return f"{term[0]} of {term[1]}{list(term[2])}"
    return term[0]
