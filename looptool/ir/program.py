"""The compute IR: stages of pointwise-plus-reduction statements over named dimensions.

A `Program` is a list of `Stage`s in dependence order.  Each stage writes one
buffer over its dimensions; a reduction stage also loops over reduction dims.
Pointwise work is inlined into the stage that uses it, so only reductions and the
final result own buffers: `(a * b).sum(k)` is one stage with no m×k×n temporary.
All values are frozen dataclasses, so a program is hashable and serves as the
structural part of the kernel cache key.

Dtypes: float16 and bfloat16 values come only from loads, casts, constants and selects,
and hold numbers those types represent exactly; arithmetic (`Unary`, `Binary`) and the
updates of a reduction run in float32 or float64 (the lowering inserts the casts). A
stage's buffer may hold a half type; its expression then has the dtype that computes it.
"""
from __future__ import annotations

from dataclasses import dataclass

# the value a reduction starts from, by its op
REDUCE_IDENTITY = {"sum": 0.0, "max": float("-inf"), "min": float("inf")}
# The size a dynamic dim is planned at (schedules are chosen, and costs modelled, there), unless its
# minimum is larger.
REPRESENTATIVE_SIZE = 256
# On a GPU, whose best tiles depend on how many blocks fill its SMs, a dynamic dim is planned at its
# size class instead: REPRESENTATIVE_SIZE times a power of SIZE_CLASS_RATIO (`size_class`).
SIZE_CLASS_RATIO = 4


def size_class(n: int) -> int:
    """The size class of a dynamic dim of size `n`: REPRESENTATIVE_SIZE times the largest power of
    SIZE_CLASS_RATIO not above n / REPRESENTATIVE_SIZE (REPRESENTATIVE_SIZE for smaller n). A kernel
    planned at a class runs every size; sizes of one class share it."""
    planned = REPRESENTATIVE_SIZE
    while planned * SIZE_CLASS_RATIO <= n:
        planned *= SIZE_CLASS_RATIO
    return planned


class Size(int):
    """An extent set at run time: ceil(n / divisor), where n is the size of the dynamic dim `dim`.

    As an int it is that extent at the dim's representative size (`REPRESENTATIVE_SIZE`), which is
    what the automatic scheduler and the cost model plan with; code that must hold for every size
    (loop bounds, tails, buffer shapes, the isl check, the generated code) tests `isinstance(x, Size)`
    and uses the dim instead. It prints as the dim's name in capitals (`B`, `ceil(B/16)`). Arithmetic
    on it gives plain ints."""

    def __new__(cls, dim: str, divisor: int = 1, representative: int = REPRESENTATIVE_SIZE):
        self = int.__new__(cls, -(-representative // divisor))
        self.dim, self.divisor, self.representative = dim, divisor, representative
        return self

    def __reduce__(self):
        return Size, (self.dim, self.divisor, self.representative)

    def divided(self, factor: int) -> "Size":
        """The extent of the outer loop of a split of this one by `factor`: ceil(n / (divisor * factor))."""
        return Size(self.dim, self.divisor * factor, self.representative)

    def whole(self) -> "Size":
        """The dim's own size n."""
        return Size(self.dim, 1, self.representative)

    def __str__(self):
        name = self.dim.upper()
        return name if self.divisor == 1 else f"ceil({name}/{self.divisor})"

    def __repr__(self):
        return f"Size({self})"


@dataclass(frozen=True)
class Affine:
    """sum(coeff * var) + const over named integer variables."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def var(name: str, coeff: int = 1) -> "Affine":
        return Affine(((name, coeff),), 0)

    @staticmethod
    def identity(dims: tuple[str, ...]) -> tuple["Affine", ...]:
        """The index of every element of an array over `dims`: one variable per dim."""
        return tuple(Affine.var(d) for d in dims)

    @staticmethod
    def of(coeffs: dict[str, int], const: int = 0) -> "Affine":
        return Affine(tuple(sorted((v, c) for v, c in coeffs.items() if c)), const)

    def coeffs(self) -> dict[str, int]:
        return dict(self.terms)

    def bare_dim(self) -> str | None:
        """The dim this index is, where it is one dim alone (coefficient 1, no constant), else None."""
        return self.terms[0][0] if len(self.terms) == 1 and self.terms[0][1] == 1 and not self.const else None

    def __add__(self, other: "Affine | int") -> "Affine":
        if isinstance(other, int):
            return Affine(self.terms, self.const + other)
        merged = self.coeffs()
        for v, c in other.terms:
            merged[v] = merged.get(v, 0) + c
        return Affine.of(merged, self.const + other.const)

    def scale(self, factor: int) -> "Affine":
        return Affine.of({v: c * factor for v, c in self.terms}, self.const * factor)

    def span(self, extents: dict[str, int]) -> tuple[int, int]:
        """The lowest and highest value over variables that run from 0 to their extents."""
        steps = [c * (extents[name] - 1) for name, c in self.terms]
        return self.const + sum(min(step, 0) for step in steps), self.const + sum(max(step, 0) for step in steps)

    def substitute(self, values: dict[str, "Affine"]) -> "Affine":
        out = Affine((), self.const)
        for v, c in self.terms:
            out = out + (values[v].scale(c) if v in values else Affine.var(v, c))
        return out

    def __str__(self):
        parts = [(v if c == 1 else f"{c}*{v}") for v, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts).replace("+ -", "- ")


@dataclass(frozen=True)
class Guard:
    """lo <= expr < hi."""

    expr: Affine
    lo: int
    hi: int

    def __str__(self):
        return f"{self.lo} <= {self.expr} < {self.hi}"


class Expr:
    """Base of the scalar expression tree computed by a statement."""

    dtype: str


@dataclass(frozen=True)
class Const(Expr):
    value: float
    dtype: str


@dataclass(frozen=True)
class Load(Expr):
    """buffer[index]; `clamped` loads clamp each index into bounds (they sit under a guard)."""

    buffer: str
    index: tuple[Affine, ...]
    dtype: str
    clamped: bool = False


@dataclass(frozen=True)
class Select(Expr):
    """`then` where every guard holds, else `otherwise`."""

    guards: tuple[Guard, ...]
    then: Expr
    otherwise: Expr

    @property
    def dtype(self):
        return self.then.dtype


@dataclass(frozen=True)
class Unary(Expr):
    op: str
    x: Expr

    @property
    def dtype(self):
        return self.x.dtype


@dataclass(frozen=True)
class Binary(Expr):
    op: str
    a: Expr
    b: Expr

    @property
    def dtype(self):
        return self.a.dtype


@dataclass(frozen=True)
class Cast(Expr):
    x: Expr
    dtype: str


@dataclass(frozen=True)
class Buffer:
    """An input array: its dims, shape, dtype and strides in elements."""

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...]


@dataclass(frozen=True)
class Stage:
    """buffer `name`[dims] = reduce_op over reduce_dims of `expr` (or just `expr`).

    `loop_dims` is every dim the statement iterates over, in the order the
    expression's dims appeared (the default loop order). `dtype` is the buffer's; `expr.dtype`
    is the one its values are computed in (float32 for a half-precision buffer of a reduction)."""

    name: str
    dims: tuple[str, ...]
    reduce_dims: tuple[str, ...]
    reduce_op: str | None
    expr: Expr
    dtype: str
    loop_dims: tuple[str, ...]


@dataclass(frozen=True)
class Program:
    """Input buffers, stages in dependence order (the last is the result) and dim sizes. `dynamic`
    names the dims whose size is a run-time parameter, each with its minimum: their sizes here are
    `Size`s."""

    inputs: tuple[Buffer, ...]
    stages: tuple[Stage, ...]
    sizes: tuple[tuple[str, int], ...]
    dynamic: tuple[tuple[str, int], ...] = ()

    def size(self, dim: str) -> int:
        return dict(self.sizes)[dim]

    @property
    def output(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        for st in self.stages:
            if st.name == name:
                return st
        raise KeyError(f"no stage named {name!r}; stages are {[s.name for s in self.stages]}")

    def fresh_dim(self, name: str) -> str:
        """`name`, or `name` with a number added where the program already has a dim of that name."""
        taken = {dim for dim, _ in self.sizes}
        fresh, number = name, 1
        while fresh in taken:
            fresh, number = f"{name}{number}", number + 1
        return fresh

    def buffer_shape(self, name: str) -> tuple[int, ...]:
        for buf in self.inputs:
            if buf.name == name:
                return buf.shape
        return tuple(self.size(d) for d in self.stage(name).dims)

    def buffer_dims(self, name: str) -> tuple[str, ...]:
        """The dims of an input or of a stage's result."""
        for buf in self.inputs:
            if buf.name == name:
                return buf.dims
        return self.stage(name).dims

    def readers(self, buffer: str) -> list[Stage]:
        """Stages whose expression loads `buffer`."""
        return [st for st in self.stages if buffer in loaded_buffers(st.expr)]


def loaded_buffers(expr: Expr) -> set[str]:
    """Names of all buffers an expression reads."""
    out: set[str] = set()
    for load in loads(expr):
        out.add(load.buffer)
    return out


def subexpressions(expr: Expr):
    """An expression and every expression inside it, each before its operands, in evaluation order."""
    yield expr
    if isinstance(expr, Select):
        yield from subexpressions(expr.then)
        yield from subexpressions(expr.otherwise)
    elif isinstance(expr, Unary | Cast):
        yield from subexpressions(expr.x)
    elif isinstance(expr, Binary):
        yield from subexpressions(expr.a)
        yield from subexpressions(expr.b)


def loads(expr: Expr):
    """Every Load in an expression, in evaluation order."""
    return (e for e in subexpressions(expr) if isinstance(e, Load))


def guards(expr: Expr):
    """Every Guard of the Selects in an expression."""
    return (g for e in subexpressions(expr) if isinstance(e, Select) for g in e.guards)


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The element strides of an array of `shape` laid out row-major (its last axis contiguous)."""
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def hoistable_factor(stage: "Stage") -> tuple[Expr, Expr] | None:
    """(the factor of a reduction's product that is computed and leaves out one of its loop dims, the
    other factor): what `Schedule.hoist` computes once and `weights_apart` computes apart; None where the
    stage is not a reduction of a product or neither factor is such."""
    expr = stage.expr
    if not stage.reduce_dims or not isinstance(expr, Binary) or expr.op != "mul":
        return None
    for factor, other in ((expr.a, expr.b), (expr.b, expr.a)):
        if not isinstance(factor, Load | Const) and index_vars(factor) < set(stage.loop_dims):
            return factor, other
    return None


def index_vars(expr: Expr) -> set[str]:
    """The index variables an expression's loads and guards use."""
    affines = [a for ld in loads(expr) for a in ld.index] + [g.expr for g in guards(expr)]
    return {v for a in affines for v, _ in a.terms}


def plain_dims(load: Load) -> tuple[str, ...] | None:
    """The dims a load reads its buffer at where each axis is a bare dim (`Affine.bare_dim`) and the load
    is not clamped, else None."""
    dims = tuple(index.bare_dim() for index in load.index)
    return None if load.clamped or None in dims else dims


def rewritten(expr: Expr, load, guard=lambda g: g) -> Expr:
    """`expr` with every Load replaced by `load(it)` and every Guard of its Selects by `guard(it)`."""
    if isinstance(expr, Load):
        return load(expr)
    if isinstance(expr, Select):
        return Select(tuple(guard(g) for g in expr.guards), rewritten(expr.then, load, guard),
                      rewritten(expr.otherwise, load, guard))
    if isinstance(expr, Unary):
        return Unary(expr.op, rewritten(expr.x, load, guard))
    if isinstance(expr, Cast):
        return Cast(rewritten(expr.x, load, guard), expr.dtype)
    if isinstance(expr, Binary):
        return Binary(expr.op, rewritten(expr.a, load, guard), rewritten(expr.b, load, guard))
    return expr


def substituted(expr: Expr, values: dict[str, Affine], clamp: bool = False) -> Expr:
    """`expr` with every index variable in `values` replaced by its affine expression, in loads and
    guards alike; with `clamp`, a load whose index changes is clamped (the caller guards it)."""
    def load(ld: Load) -> Load:
        index = tuple(a.substitute(values) for a in ld.index)
        return Load(ld.buffer, index, ld.dtype, ld.clamped or (clamp and index != ld.index))
    return rewritten(expr, load, lambda g: Guard(g.expr.substitute(values), g.lo, g.hi))
