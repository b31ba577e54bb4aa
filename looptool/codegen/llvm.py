"""The LLVM function builder shared by the CPU and GPU backends, with its types and helpers.

`FunctionBuilder` walks a loop tree and emits it into one LLVM function through
llvmlite.ir: counted loops (tails as trip-count limits, hoisted checks with tail-free
copies), unrolled and vectorized loops, statements with fused multiply-adds, and
clamped loads under padding guards so no schedule reads outside a buffer (with a
guard-free copy of a loop's body where one test shows its guards hold throughout).  A backend
subclasses it for what differs: parallel loops on the CPU, bound loops on the GPU.
All index arithmetic is 64-bit.
"""
from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir as llir

from .. import ir
from ..frontend.dtypes import ITEM_BYTES
from ..memo import BoundedMemo
from ..schedule import BufferPlan, Limit, LoopNode, LoopTree, StmtNode, walk

CONSTANT_LIMIT = 1 << 14
_CONSTANTS = BoundedMemo(CONSTANT_LIMIT)


def constant(ty: llir.Type, value) -> llir.Constant:
    """The constant `value` of type `ty` (a list for a vector), one shared object per process: llvmlite
    formats each constant object's text once, so a constant used in many places is formatted once."""
    return _CONSTANTS.get((str(ty), repr(value)), lambda: llir.Constant(ty, value))


I64 = llir.IntType(64)
ZERO = constant(I64, 0)
STACK_LIMIT = 128 * 1024
ONE = constant(I64, 1)
I1 = llir.IntType(1)
PTR = llir.PointerType()
F32, F64, I16, I32 = llir.FloatType(), llir.DoubleType(), llir.IntType(16), llir.IntType(32)
# Each dtype's element in memory, and the type its values are computed in. The half types are
# storage formats: widened to float32 on load, rounded back on store. bfloat16 sits in memory as
# its raw 16 bits (llvmlite has no bfloat type): the upper half of a float32.
MEMORY_TYPE = {"float16": llir.HalfType(), "bfloat16": I16, "float32": F32, "float64": F64}
VALUE_TYPE = {"float16": F32, "bfloat16": F32, "float32": F32, "float64": F64}
# Neither 'contract' nor 'reassoc': products feeding sums become explicit fma calls and sums
# keep the order the loop tree gives them, so a schedule rounds the same way however LLVM
# optimizes it (serial or parallel, hoisted tails or not). The only reassociation is the one
# the schedule asks for: the horizontal sum of a vectorized reduction loop.
FAST = ("nsz",)
# x / y as x * (1 / y) (within 1.5 ulp): a divisor fixed along a loop (a softmax's sum) is inverted once
# instead of an IEEE division an element (GPU since session 24: rcp.rn, not div.rn.f32's dozen instructions;
# CPU since session 26, Xeon, one thread: softmax of 128x1024 1.27x faster in AVX-512 code, 1.21x in AVX2,
# 4096x1024 1.02x / 1.10x, attention 512x64 1.03-1.06x)
DIVISION = FAST + ("arcp",)
REASSOCIATE = ("reassoc", "nsz")
IDENTITY = ir.REDUCE_IDENTITY
INTRINSIC_UNARY = {"exp": "llvm.exp", "log": "llvm.log", "tanh": "llvm.tanh", "sqrt": "llvm.sqrt", "abs": "llvm.fabs"}
# exp, log, tanh and erf of float32 are inline polynomials (below), so loops that use them stay in
# vector registers on the CPU and need no libm on the GPU; docs/frontend.md gives their accuracy.
INLINE_F32 = ("exp", "log", "tanh", "erf")
LIBM_ONLY = ("erf",)   # float64 ops with no LLVM intrinsic: a libm call per lane
# Polynomial coefficients, highest degree first. exp, log and tanh: Cephes' expf, logf and tanhf;
# erf: least-squares fits in float64, rounded to float32 (x + x*P(x*x) below ERF_SPLIT, and
# log(erfc(t)) as a polynomial in t = |x| from there to ERF_ONE, past which erf rounds to 1).
EXP_COEFFS = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
              5.0000001201e-1)
LOG_COEFFS = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
              -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)
TANH_COEFFS = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1)
LOG2_E = 1.44269504088896341
EXP_LOW, EXP_HIGH = -104.0, 88.72284   # exp(-104) rounds to 0; exp(88.72284) is float32's largest finite
TANH_SPLIT = 0.625
TANH_ONE = 9.5          # 1 - tanh(x) < 2**-25 (half an ulp below 1) from about x = 9.1: tanh rounds to 1
ERF_SMALL = (8.47742339828983e-05, -0.0008168499916791916, 0.005203345324844122, -0.026860348880290985,
             0.11283712834119797, -0.37612634897232056, 0.12837916612625122)
ERF_LARGE = (1.6293822682200698e-06, -4.588020237861201e-05, 0.0005950948689132929, -0.004750560037791729,
             0.026392484083771706, -0.11002429574728012, -0.631891131401062, -1.1301919221878052,
             0.0003090462414547801)
ERF_SPLIT, ERF_ONE = 0.921875, 4.0
MIN_NORMAL_F32 = 1.17549435e-38
INTRINSIC_BINARY = {"maximum": "llvm.maximum", "minimum": "llvm.minimum"}
ARITH = {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv"}
REDUCE_BINARY = {"sum": "add", "max": "maximum", "min": "minimum"}


def size_variable(dim: str) -> str:
    """The name under which a dynamic dim's size (an i64 argument of the kernel) is found among the loop
    values a builder carries (no loop has this name: loop names are dims with .0/.1 suffixes)."""
    return f"#{dim}"


def kernel_params(tree: LoopTree) -> list[str]:
    """Buffers passed to the kernel: inputs, runtime temporaries, then the output."""
    order = {"input": 0, "temp": 1, "output": 2}
    plans = [p for p in tree.buffers.values() if p.kind in order]
    return [p.name for p in sorted(plans, key=lambda p: order[p.kind])]


class FunctionBuilder:
    """Emits loop-tree nodes into one LLVM function (the kernel or an outlined parallel body)."""

    def __init__(self, tree: LoopTree, fn: llir.Function, pointers: dict[str, llir.Value], threads: int):
        self.tree, self.fn, self.pointers, self.threads = tree, fn, dict(pointers), threads
        entry = fn.append_basic_block("entry")
        start = fn.append_basic_block("start")
        self.allocas = llir.IRBuilder(entry)
        self.allocas.branch(start)
        self.allocas.position_at_start(entry)
        self.builder = llir.IRBuilder(start)
        self.heap: list[llir.Value] = []
        self.hoisted = hoisted_tail_checks(tree)
        self.guard_checks = hoisted_guard_checks(tree)
        self.full: set[int] = set()
        self.proven: set[int] = set()          # tail limits known to hold in this copy of the code
        self.holding: set[tuple[int, ir.Guard]] = set()
        self.offsets: dict = {}
        self.memo_block, self.memo = None, {}

    def finish(self):
        """Free heap buffers and return."""
        for pointer in self.heap:
            self.builder.call(self.declare("free", llir.VoidType(), [PTR]), [pointer])
        self.builder.ret_void()

    def allocate(self, plan: BufferPlan) -> llir.Value:
        """A local buffer: on the stack when small, else on the heap (freed on return); 64-byte aligned."""
        if any(isinstance(n, ir.Size) for n in plan.shape):
            raise NotImplementedError(f"buffer {plan.name} is placed inside loops but holds a whole dynamic dim "
                                      f"(shape [{', '.join(map(str, plan.shape))}]); the legality check refuses "
                                      f"such schedules")
        size = plan.size * ITEM_BYTES[plan.dtype]
        if size <= STACK_LIMIT:
            buffer = self.allocas.alloca(MEMORY_TYPE[plan.dtype], size=constant(I64, plan.size), name=plan.name)
            buffer.align = 64
            return buffer
        aligned_alloc = self.declare("aligned_alloc", PTR, [I64, I64])
        pointer = self.allocas.call(aligned_alloc, [constant(I64, 64), constant(I64, -(-size // 64) * 64)])
        self.heap.append(pointer)
        return pointer

    # Control flow -----------------------------------------------------------------
    def body(self, nodes: list, env: dict):
        for node in nodes:
            if isinstance(node, StmtNode):
                self.statement(node, env)
            else:
                self.loop(node, env)

    def allocate_placed(self, node: LoopNode):
        """Allocate the local buffers placed at this loop."""
        for plan in self.tree.local_buffers.get(id(node), []):
            self.pointers[plan.name] = self.allocate(plan)

    def loop(self, node: LoopNode, env: dict):
        lp = node.loop
        if lp.annotation != "parallel":  # a parallel loop allocates its buffers in each thread
            self.allocate_placed(node)
        count = constant(I64, lp.extent) if id(node) in self.full else self.trip_count(node, env)
        emit = {"unroll": self.unrolled, "vectorize": self.vectorized, "parallel": self.parallel}.get(lp.annotation,
                                                                                                     self.plain_loop)
        emit(node, env, count)

    def plain_loop(self, node: LoopNode, env: dict, count: llir.Value):
        """A loop with no annotation: a vector reduction's partial results kept across it, or a counted loop."""
        if self.is_vector_reduction(node):
            self.vector_reduction(node, env, count)
        else:
            self.counted_loop(ZERO, count, lambda i: self.loop_body(node, {**env, node.loop.name: i}), node.loop.name,
                              self.around_register_tile(node))

    def is_vector_reduction(self, node: LoopNode) -> bool:
        """A loop whose whole body is a vectorized loop of reduction updates into one element each."""
        if len(node.body) != 1 or not isinstance(node.body[0], LoopNode):
            return False
        inner = node.body[0]
        if inner.loop.annotation != "vectorize" or not inner.body:
            return False
        for stmt in inner.body:
            if not isinstance(stmt, StmtNode) or stmt.kind != "update":
                return False
            own = ir.Affine.identity(stmt.stage.dims)
            linear = self.linear_offset(stmt.stage.name, own, stmt)
            if linear.coeffs().get(node.loop.name, 0) or linear.coeffs().get(inner.loop.name, 0):
                return False
        return True

    def vector_reduction(self, node: LoopNode, env: dict, count: llir.Value):
        """Keep one vector of partial results per statement across `node`; reduce the lanes once at
        the end. Tail iterations (fewer lanes than the vector) add straight into the accumulator."""
        b = self.builder
        inner = node.body[0]
        lanes = Lanes(inner.loop.name, inner.loop.extent)
        slots = {}
        for stmt in inner.body:
            vty = llir.VectorType(VALUE_TYPE[stmt.stage.dtype], lanes.width)
            slots[id(stmt)] = self.allocas.alloca(vty)
            b.store(constant(vty, [IDENTITY[stmt.stage.reduce_op]] * lanes.width), slots[id(stmt)])

        def step(i):
            here = {**env, node.loop.name: i}
            inner_count = self.trip_count(inner, here)

            def full():
                for stmt in inner.body:
                    vty = llir.VectorType(VALUE_TYPE[stmt.stage.dtype], lanes.width)
                    evaluate = lambda e, stmt=stmt: self.vector_expr(e, stmt, here, lanes)  # noqa: E731
                    partial = self.accumulate(stmt.stage.reduce_op, b.load(slots[id(stmt)], typ=vty),
                                              stmt.stage.expr, evaluate)
                    b.store(partial, slots[id(stmt)])
            self.full_or_tail(inner, here, inner_count, full)
        self.counted_loop(ZERO, count, step, node.loop.name)
        for stmt in inner.body:
            stage = stmt.stage
            vty = llir.VectorType(VALUE_TYPE[stage.dtype], lanes.width)
            target = self.access(stage.name, ir.Affine.identity(stage.dims), False, stmt,
                                 {**env, node.loop.name: ZERO, lanes.name: ZERO})
            total = self.horizontal(stage.reduce_op, b.load(slots[id(stmt)], typ=vty))
            old = self.load_value(target, stage.dtype)
            self.store_value(self.binary(REDUCE_BINARY[stage.reduce_op], old, total), target, stage.dtype)

    def versioned(self, node: LoopNode) -> bool:
        """Whether the loop's body is emitted twice: a copy free of tail checks or guards, and the rest."""
        return id(node) in self.hoisted or id(node) in self.guard_checks

    def loop_body(self, node: LoopNode, env: dict):
        """A plain loop's body; where tails of unrolled or vectorized loops below depend on this loop
        last, or padding guards below move little with the loops inside it (`hoisted_guard_checks`),
        test once here whether the tails are all full and the guards hold throughout, and emit a copy
        free of those checks."""
        tails, guards = self.hoisted.get(id(node), []), self.guard_checks.get(id(node), [])
        if not tails and not guards:
            self.body(node.body, env)
            return
        self.guard_free_copy(tails, guards, env, lambda: self.body(node.body, env))

    def guard_free_copy(self, tails: list, guards: list, env: dict, emit):
        """Test once whether the `tails` are all full and the `guards` hold throughout, and `emit` the
        code twice: free of those checks where they are, as it is otherwise."""
        b = self.builder
        fast = constant(I1, 1)
        for limited, lim, spans in tails:
            top = b.add(self.affine(lim.rest, {**env, **{name: constant(I64, span) for name, span in spans}}),
                        constant(I64, lim.coeff * (limited.loop.extent - 1)))
            fast = b.and_(fast, b.icmp_signed("<", top, self.extent(lim.bound, env)))
        for check in guards:
            fast = b.and_(fast, self.holds_throughout(check, env))
        with b.if_else(fast) as (then, otherwise):
            with then:
                saved = set(self.full), set(self.holding), set(self.proven)
                self.proven |= {id(lim) for _, lim, _ in tails}
                self.full |= {id(limited) for limited, _, _ in tails     # a loop whose limits are all proven:
                              if all(id(lim) in self.proven for lim in limited.limits)}     # others are tested
                self.holding |= {(check.stmt, check.guard) for check in guards}             # at other loops
                emit()
                self.full, self.holding, self.proven = saved
            with otherwise:
                emit()

    def holds_throughout(self, check: "GuardCheck", env: dict) -> llir.Value:
        """An i1: the guard holds for every value of the loops inside the one testing it."""
        b = self.builder
        coeffs = check.expr.coeffs()
        lowest = {name: constant(I64, 0 if coeffs[name] > 0 else extent - 1) for name, extent in check.inner}
        highest = {name: constant(I64, extent - 1 if coeffs[name] > 0 else 0) for name, extent in check.inner}
        low, high = self.affine(check.expr, {**env, **lowest}), self.affine(check.expr, {**env, **highest})
        return b.and_(b.icmp_signed(">=", low, constant(I64, check.guard.lo)),
                      b.icmp_signed("<", high, constant(I64, check.guard.hi)))

    def known_to_hold(self, guards, stmt: StmtNode) -> bool:
        """Whether this copy of the code runs only where every one of a statement's `guards` holds."""
        return all((id(stmt), g) in self.holding for g in guards)

    def trip_count(self, node: LoopNode, env: dict) -> llir.Value:
        count: llir.Value = self.extent(node.loop.extent, env)
        for lim in node.limits:
            count = self.smin(count, self.limit_count(lim, env))
        return count

    def extent(self, value: int, env: dict) -> llir.Value:
        """A loop's extent or a tail's bound as an i64: a constant, or for a dynamic `ir.Size` ceil(n / d),
        n being the dim's size that the kernel takes as an argument."""
        if not isinstance(value, ir.Size):
            return constant(I64, value)
        size = env[size_variable(value.dim)]
        if value.divisor == 1:
            return size
        return self.once(("ceil", id(size), value.divisor), lambda: self.builder.udiv(
            self.builder.add(size, constant(I64, value.divisor - 1)), constant(I64, value.divisor)))

    def limit_count(self, lim: Limit, env: dict) -> llir.Value:
        b = self.builder
        room = b.sub(self.extent(lim.bound, env), self.affine(lim.rest, env))
        room = self.smax(room, ZERO)
        return b.sdiv(b.add(room, constant(I64, lim.coeff - 1)), constant(I64, lim.coeff))

    def around_register_tile(self, node: LoopNode) -> bool:
        """Whether the schedule unrolls a loop inside this one, under no guard left to test: it has
        chosen the register tile, and LLVM unrolling the loops around it (a 3x3 window's loops) would
        share the tile's loads between copies and keep more values live than there are registers.
        Where guards are tested, unrolling makes the window offsets constants that fold them."""
        inside = list(walk(node.body))
        return any(isinstance(inner, LoopNode) and inner.loop.annotation == "unroll" for inner, _ in inside) and \
            all(self.known_to_hold(tuple(ir.guards(stmt.stage.expr)), stmt) for stmt, _ in inside
                if isinstance(stmt, StmtNode) and stmt.kind != "init")

    def llvm_unrolls(self, node: LoopNode) -> bool:
        """Whether an unrolled loop is emitted as a loop that LLVM unrolls whole (a target's choice)
        instead of one copy of its body an iteration."""
        return False

    def counted_loop(self, start: llir.Value, end: llir.Value, emit_body, name: str, rolled: bool = False,
                     unroll_full: bool = False):
        """Loop `name` from `start` to `end`; a `rolled` loop asks LLVM not to unroll it."""
        b = self.builder
        pre = b.block
        header = self.fn.append_basic_block(f"{name}.head")
        body = self.fn.append_basic_block(f"{name}.body")
        done = self.fn.append_basic_block(f"{name}.done")
        b.branch(header)
        b.position_at_end(header)
        i = b.phi(I64, name=name)
        i.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", i, end), body, done)
        b.position_at_end(body)
        emit_body(i)
        i.add_incoming(b.add(i, ONE, flags=("nsw", "nuw")), b.block)
        back = b.branch(header)
        if rolled:
            back.set_metadata("llvm.loop", not_unrolled(self.fn.module))
        elif unroll_full:
            back.set_metadata("llvm.loop", loop_hint(self.fn.module, "llvm.loop.unroll.full"))
        b.position_at_end(done)

    def full_or_tail(self, node: LoopNode, env: dict, count: llir.Value, emit_full):
        """emit_full() when the loop runs its whole extent; a plain rolled loop for a tail."""
        lp = node.loop
        if not node.limits or id(node) in self.full:
            emit_full()
            return
        b = self.builder
        with b.if_else(b.icmp_signed("==", count, constant(I64, lp.extent))) as (then, otherwise):
            with then:
                emit_full()
            with otherwise:
                self.counted_loop(ZERO, count, lambda i: self.body(node.body, {**env, lp.name: i}), lp.name)

    def unrolled(self, node: LoopNode, env: dict, count: llir.Value):
        lp = node.loop
        if self.llvm_unrolls(node):
            def rolled():
                self.counted_loop(ZERO, constant(I64, lp.extent), lambda i: self.body(node.body, {**env, lp.name: i}),
                                  lp.name, unroll_full=True)
            self.full_or_tail(node, env, count, rolled)
            return

        def copies():
            for k in range(lp.extent):
                self.body(node.body, {**env, lp.name: constant(I64, k)})
        self.full_or_tail(node, env, count, copies)

    def vectorized(self, node: LoopNode, env: dict, count: llir.Value):
        lanes = Lanes(node.loop.name, node.loop.extent)

        def vector_body():
            for stmt in node.body:
                self.vector_statement(stmt, env, lanes)
        self.full_or_tail(node, env, count, vector_body)

    def parallel(self, node: LoopNode, env: dict, count: llir.Value):
        """A loop run on several threads: each backend says how (the CPU outlines it onto a pool)."""
        raise NotImplementedError(f"loop '{node.loop.name}' is marked parallel, which this backend cannot run")

    # Statements --------------------------------------------------------------------
    def statement(self, stmt: StmtNode, env: dict):
        stage = stmt.stage
        target = self.access(stage.name, ir.Affine.identity(stage.dims), False, stmt, env)
        align = self.alignment(stage.name, ir.Affine.identity(stage.dims), stmt, env)
        old = self.load_value(target, stage.dtype, align) if stmt.kind == "update" else None
        value = self.stored_value(stmt, stage.expr, old, lambda e: self.expr(e, stmt, env))
        self.store_value(value, target, stage.dtype, align)

    def stored_value(self, stmt: StmtNode, expr: ir.Expr, old: llir.Value | None, evaluate,
                     width: int | None = None) -> llir.Value:
        """What a statement stores: the identity (an init; `width` lanes of it), `old` combined with
        `expr` (an update) or `expr` (its stage's expression, or a variant of it), each subexpression
        computed by `evaluate`."""
        stage = stmt.stage
        if stmt.kind == "init":
            return constant_like(shaped(VALUE_TYPE[stage.dtype], width), IDENTITY[stage.reduce_op])
        if stmt.kind == "update":
            return self.accumulate(stage.reduce_op, old, expr, evaluate)
        return self.before_store(expr, stage.dtype, evaluate)

    def before_store(self, expr: ir.Expr, dtype: str, evaluate) -> llir.Value:
        """`expr` computed by `evaluate` for a store into a `dtype` buffer: a cast to `dtype` at its root is left
        to the store, which rounds the same way (a bfloat16 result rounded once, not rounded, widened and
        rounded again)."""
        if isinstance(expr, ir.Cast) and expr.dtype == dtype:
            inner = evaluate(expr.x)
            return inner if element_type(inner.type) == VALUE_TYPE[dtype] else self.convert(inner, dtype)
        return evaluate(expr)

    def access(self, buffer: str, index: tuple[ir.Affine, ...], clamp: bool, stmt: StmtNode,
               env: dict) -> llir.Value:
        """Pointer to the element of `buffer` at `index` (full coordinates over the statement's dims);
        a clamped access has each axis clamped into the buffer."""
        plan = self.tree.buffers[buffer]
        if not clamp:
            offset = self.affine(self.linear_offset(buffer, index, stmt), env)
        else:
            b = self.builder
            offset = ZERO
            for d, ix, n, stride in zip(plan.dims, plan.element_index(tuple(ix.substitute(stmt.index) for ix in index)),
                                        plan.shape, plan.strides):
                at = self.affine(ix, env)
                if isinstance(n, ir.Size) or not self.known_within(ix, n, stmt):     # a dynamic axis: its run-time size
                    at = self.smin(self.smax(at, ZERO), self.builder.sub(self.extent(n, env), constant(I64, 1)))
                if plan.block and d == plan.block[0]:          # its block, then its place in it
                    size = constant(I64, plan.block[1])
                    offset = b.add(offset, b.mul(b.udiv(at, size), constant(I64, plan.block[2])))
                    at = b.urem(at, size)
                offset = b.add(offset, b.mul(at, constant(I64, stride)))
        return self.element(self.pointers[buffer], offset, plan.dtype)

    def known_within(self, index: ir.Affine, size: int, stmt: StmtNode) -> bool:
        """Whether a guard known to hold here keeps `index` (over loop variables) in [0, size)."""
        return any(stmt_id == id(stmt) and 0 <= g.lo and g.hi <= size and g.expr.substitute(stmt.index) == index
                   for stmt_id, g in self.holding)

    # Vector statements -----------------------------------------------------------------
    def vector_statement(self, stmt: StmtNode, env: dict, lanes: "Lanes"):
        """One statement for all lanes of a vectorized loop: packed where addresses are contiguous."""
        stage = stmt.stage
        b = self.builder
        vty = llir.VectorType(VALUE_TYPE[stage.dtype], lanes.width)
        own = ir.Affine.identity(stage.dims)
        base, step, align = self.linear_address(stage.name, own, stmt, env, lanes)
        evaluate = lambda e: self.vector_expr(e, stmt, env, lanes)  # noqa: E731
        if step == 1:
            old = self.load_value(base, stage.dtype, align, lanes.width) if stmt.kind == "update" else None
            self.store_value(self.stored_value(stmt, stage.expr, old, evaluate, lanes.width), base, stage.dtype, align)
            return
        if stmt.kind == "init":
            value = constant(vty, [IDENTITY[stage.reduce_op]] * lanes.width)
        else:
            value = self.before_store(stage.expr, stage.dtype, evaluate)
        if step == 0 and stmt.kind == "update":
            old = self.load_value(base, stage.dtype, align)
            total = self.binary(REDUCE_BINARY[stage.reduce_op], old, self.horizontal(stage.reduce_op, value))
            self.store_value(total, base, stage.dtype)
        elif step == 0:
            self.store_value(b.extract_element(value, constant(I64, lanes.width - 1)), base, stage.dtype)
        else:
            for k in range(lanes.width):
                lane_env = {**env, lanes.name: constant(I64, k)}
                target = self.access(stage.name, ir.Affine.identity(stage.dims), False, stmt, lane_env)
                lane_value = b.extract_element(value, constant(I64, k))
                if stmt.kind == "update":
                    lane_value = self.binary(REDUCE_BINARY[stage.reduce_op], self.load_value(target, stage.dtype),
                                             lane_value)
                self.store_value(lane_value, target, stage.dtype)

    def linear_address(self, buffer: str, index: tuple[ir.Affine, ...], stmt: StmtNode, env: dict,
                       lanes: "Lanes") -> tuple[llir.Value, int, int]:
        """(pointer at lane 0, element step per lane, alignment in bytes of a packed access)."""
        step = self.linear_offset(buffer, index, stmt).coeffs().get(lanes.name, 0)
        first = {**env, lanes.name: ZERO}
        pointer = self.access(buffer, index, False, stmt, first)
        return pointer, step, self.alignment(buffer, index, stmt, first, lanes if step == 1 else None)

    def alignment(self, buffer: str, index: tuple[ir.Affine, ...], stmt: StmtNode, env: dict,
                  lanes: "Lanes | None" = None) -> int:
        """Bytes an access (packed across `lanes`, if given) may assume aligned: one element here,
        since CPUs load unaligned vectors at full speed."""
        return ITEM_BYTES[self.tree.buffers[buffer].dtype]

    def linear_offset(self, buffer: str, index: tuple[ir.Affine, ...], stmt: StmtNode) -> ir.Affine:
        """The element offset of an access, as an affine function of loop variables (worked out once per
        access and statement: unrolled copies ask again for each copy)."""
        key = (buffer, index, id(stmt))
        offset = self.offsets.get(key)
        if offset is None:
            offset = self.tree.buffers[buffer].linear_offset(tuple(ix.substitute(stmt.index) for ix in index))
            self.offsets[key] = offset
        return offset

    def vector_expr(self, e: ir.Expr, stmt: StmtNode, env: dict, lanes: "Lanes") -> llir.Value:
        if isinstance(e, ir.Const):
            return constant(llir.VectorType(VALUE_TYPE[e.dtype], lanes.width), [e.value] * lanes.width)
        if isinstance(e, ir.Load) and not e.clamped:
            base, step, align = self.linear_address(e.buffer, e.index, stmt, env, lanes)
            dtype = self.tree.buffers[e.buffer].dtype
            if step == 1:
                # Masked even in a local buffer, whose lanes past a tail hold stale or never-written
                # words: as floats those can be subnormal, and each FMA on one costs an Intel core a
                # microcode assist (0.4 ms calls took 3-5 ms on a Xeon).
                return self.load_value(base, dtype, align, lanes.width, lanes.mask)
            if step == 0:
                return self.splat(self.load_value(base, dtype, align), lanes.width)
        if isinstance(e, ir.Select) and self.known_to_hold(e.guards, stmt):
            return self.vector_expr(e.then, stmt, env, lanes)
        if isinstance(e, ir.Load | ir.Select) and self.lane_invariant(e, stmt, lanes):
            return self.invariant_vector(e, stmt, env, lanes)
        if isinstance(e, ir.Load | ir.Select):
            return self.per_lane(e, stmt, env, lanes)
        if isinstance(e, ir.Cast):
            return self.convert(self.vector_expr(e.x, stmt, env, lanes), e.dtype)
        if isinstance(e, ir.Unary):
            return self.unary(e.op, self.vector_expr(e.x, stmt, env, lanes))
        return self.combine(e, lambda sub: self.vector_expr(sub, stmt, env, lanes))

    def lane_invariant(self, e: ir.Expr, stmt: StmtNode, lanes: "Lanes") -> bool:
        """Whether no address or guard in `e` moves with the vectorized loop (one value for all lanes)."""
        if isinstance(e, ir.Select):
            return all(not g.expr.substitute(stmt.index).coeffs().get(lanes.name, 0) for g in e.guards) and \
                self.lane_invariant(e.then, stmt, lanes) and self.lane_invariant(e.otherwise, stmt, lanes)
        return all(not self.linear_offset(ld.buffer, ld.index, stmt).coeffs().get(lanes.name, 0)
                   for ld in ir.loads(e))

    def invariant_vector(self, e: ir.Load | ir.Select, stmt: StmtNode, env: dict, lanes: "Lanes") -> llir.Value:
        """A guarded value or clamped load that is the same in every lane: computed once and broadcast, its
        guards choosing between vectors (a blend).  A scalar float select would become a branch on x86."""
        if isinstance(e, ir.Load):
            return self.splat(self.expr(e, stmt, env), lanes.width)
        ok = self.splat(self.guards_hold(e.guards, stmt, env), lanes.width)
        return self.builder.select(ok, self.vector_expr(e.then, stmt, env, lanes),
                                   self.vector_expr(e.otherwise, stmt, env, lanes))

    def guards_hold(self, guards, stmt: StmtNode, env: dict) -> llir.Value:
        """An i1: every guard's affine expression lies in its range."""
        b = self.builder
        ok = constant(I1, 1)
        for g in guards:
            v = self.affine(g.expr.substitute(stmt.index), env)
            ok = b.and_(ok, b.and_(b.icmp_signed(">=", v, constant(I64, g.lo)),
                                   b.icmp_signed("<", v, constant(I64, g.hi))))
        return ok

    def per_lane(self, e: ir.Expr, stmt: StmtNode, env: dict, lanes: "Lanes") -> llir.Value:
        """Gathered loads and guarded selects: each lane computed as a scalar, then packed."""
        return self.packed([self.expr(e, stmt, {**env, lanes.name: constant(I64, k)}) for k in range(lanes.width)])

    def packed(self, values: list) -> llir.Value:
        """Scalars of one type as a vector, in order."""
        vector = constant(llir.VectorType(values[0].type, len(values)), None)
        for index, value in enumerate(values):
            vector = self.builder.insert_element(vector, value, constant(I64, index))
        return vector

    def splat(self, scalar: llir.Value, width: int) -> llir.Value:
        """`width` lanes of `scalar` (emitted once per basic block)."""
        return self.once(("splat", id(scalar), width), lambda: self.broadcast(scalar, width))

    def broadcast(self, scalar: llir.Value, width: int) -> llir.Value:
        """A vector of `width` copies of `scalar`, built here."""
        b = self.builder
        vty = llir.VectorType(scalar.type, width)
        one = b.insert_element(constant(vty, None), scalar, ZERO)
        return b.shuffle_vector(one, constant(vty, None), constant(llir.VectorType(llir.IntType(32), width),
                                                                             [0] * width))

    def horizontal(self, op: str, vector: llir.Value) -> llir.Value:
        ty = vector.type.element
        if op == "sum":
            fn = self.declare(f"llvm.vector.reduce.fadd.{type_suffix(vector.type)}", ty, [ty, vector.type])
            return self.builder.call(fn, [constant(ty, 0.0), vector], fastmath=REASSOCIATE)
        name = {"max": "fmaximum", "min": "fminimum"}[op]
        fn = self.declare(f"llvm.vector.reduce.{name}.{type_suffix(vector.type)}", ty, [vector.type])
        return self.builder.call(fn, [vector])

    # Expressions -------------------------------------------------------------------
    def expr(self, e: ir.Expr, stmt: StmtNode, env: dict) -> llir.Value:
        """The scalar value of `e` (over the statement's dims) at the loop values in `env`."""
        b = self.builder
        if isinstance(e, ir.Const):
            return constant(VALUE_TYPE[e.dtype], e.value)
        if isinstance(e, ir.Load):
            dtype = self.tree.buffers[e.buffer].dtype
            align = ITEM_BYTES[dtype] if e.clamped else self.alignment(e.buffer, e.index, stmt, env)
            return self.load_value(self.access(e.buffer, e.index, e.clamped, stmt, env), dtype, align)
        if isinstance(e, ir.Select) and self.known_to_hold(e.guards, stmt):
            return self.expr(e.then, stmt, env)
        if isinstance(e, ir.Select):
            return b.select(self.guards_hold(e.guards, stmt, env), self.expr(e.then, stmt, env),
                            self.expr(e.otherwise, stmt, env))
        if isinstance(e, ir.Cast):
            return self.convert(self.expr(e.x, stmt, env), e.dtype)
        if isinstance(e, ir.Unary):
            return self.unary(e.op, self.expr(e.x, stmt, env))
        return self.combine(e, lambda sub: self.expr(sub, stmt, env))

    def combine(self, e: ir.Binary, evaluate) -> llir.Value:
        """A binary operation; a product feeding an add or subtract becomes one fused multiply-add."""
        b = self.builder
        if e.op in ("add", "sub"):
            if is_product(e.a):
                addend = evaluate(e.b)
                return self.fma(evaluate(e.a.a), evaluate(e.a.b), addend if e.op == "add" else b.fneg(addend))
            if is_product(e.b):
                x = evaluate(e.b.a)
                return self.fma(x if e.op == "add" else b.fneg(x), evaluate(e.b.b), evaluate(e.a))
        return self.binary(e.op, evaluate(e.a), evaluate(e.b))

    def accumulate(self, op: str, old: llir.Value, e: ir.Expr, evaluate) -> llir.Value:
        """old (+, max, min) e; a product summed into `old` is one fused multiply-add."""
        if op == "sum" and is_product(e):
            return self.fma(evaluate(e.a), evaluate(e.b), old)
        return self.binary(REDUCE_BINARY[op], old, evaluate(e))

    def fma(self, x: llir.Value, y: llir.Value, z: llir.Value) -> llir.Value:
        return self.builder.call(self.intrinsic("llvm.fma", x.type, 3), [x, y, z], fastmath=FAST)

    def unary(self, op: str, x: llir.Value) -> llir.Value:
        """`op` of a scalar or vector value: inline for float32's transcendental functions."""
        b = self.builder
        if op == "neg":
            return b.fneg(x)
        if op == "reciprocal":
            return b.fdiv(constant_like(x.type, 1.0), x, flags=FAST)
        if op == "relu":
            return self.binary("maximum", x, constant_like(x.type, 0.0))
        if op in INLINE_F32 and element_type(x.type) == F32:
            return getattr(self, f"{op}_f32")(x)
        if op in LIBM_ONLY:
            return self.libm_lanes(op, x)
        return b.call(self.intrinsic(INTRINSIC_UNARY[op], x.type, 1), [x], fastmath=FAST)

    def libm_lanes(self, name: str, x: llir.Value) -> llir.Value:
        """libm's function `name` of a float64 scalar, or of each lane of a vector in turn."""
        ty = element_type(x.type)
        return self.lane_by_lane(self.declare(name, ty, [ty]), x, ty)

    def lane_by_lane(self, fn: llir.Function, x: llir.Value, ty: llir.Type) -> llir.Value:
        """fn (scalar to scalar of type `ty`) of x, or of each lane of a vector x in turn."""
        b, width = self.builder, lane_count(x.type)
        if width is None:
            return b.call(fn, [x])
        result = constant(llir.VectorType(ty, width), None)
        for lane in range(width):
            index = constant(I32, lane)
            result = b.insert_element(result, b.call(fn, [b.extract_element(x, index)]), index)
        return result

    def horner(self, x: llir.Value, coeffs) -> llir.Value:
        """The polynomial with `coeffs` (highest degree first) at x, by fused multiply-adds."""
        result = constant_like(x.type, coeffs[0])
        for coeff in coeffs[1:]:
            result = self.fma(result, x, constant_like(x.type, coeff))
        return result

    def exp_f32(self, x: llir.Value) -> llir.Value:
        """e**x for float32 scalars or vectors, inline: Cephes' range reduction and polynomial.

        Results below float32's least normal number are subnormal (2**n applied in two halves, so only
        the last product rounds); below -104 it gives 0, above 88.7 inf, and NaN stays NaN."""
        b, ty = self.builder, x.type

        def c(v):
            return constant_like(ty, v)
        y = self.exp_core(self.binary("minimum", self.binary("maximum", x, c(EXP_LOW)), c(EXP_HIGH)), halves=True)
        result = b.select(b.fcmp_ordered("<", x, c(EXP_LOW)), c(0.0), y)
        result = b.select(b.fcmp_ordered(">", x, c(EXP_HIGH)), c(float("inf")), result)
        return b.select(b.fcmp_unordered("uno", x, x), x, result)

    def exp_core(self, x: llir.Value, halves: bool) -> llir.Value:
        """e**x for x already inside [EXP_LOW, EXP_HIGH], with no test of the range: x = n ln 2 + r
        (ln 2 in two parts, by fused multiply-adds), e**r by Cephes' polynomial, times 2**n built in the
        exponent bits: in two `halves` where the result may be subnormal, at once where it is normal."""
        b, ty = self.builder, x.type

        def c(v):
            return constant_like(ty, v)
        n = b.call(self.intrinsic("llvm.rint", ty, 1), [b.fmul(x, c(LOG2_E))])
        r = self.fma(n, c(2.12194440e-4), self.fma(n, c(-0.693359375), x))
        y = b.fadd(self.fma(self.horner(r, EXP_COEFFS), b.fmul(r, r), r), c(1.0))
        return self.times_power_of_two(y, b.fptosi(n, int_like(ty)), halves)

    def times_power_of_two(self, y: llir.Value, whole: llir.Value, halves: bool) -> llir.Value:
        """y * 2**whole (an integer), through the exponent bits: in two `halves` where the result may be
        subnormal (only the last product rounds), at once where it is normal."""
        b, ty = self.builder, y.type
        ity = whole.type
        if halves:
            half = b.ashr(whole, constant_like(ity, 1))
            parts = (half, b.sub(whole, half))
        else:
            parts = (whole,)
        for part in parts:
            y = b.fmul(y, b.bitcast(b.shl(b.add(part, constant_like(ity, 127)), constant_like(ity, 23)), ty))
        return y

    def log_f32(self, x: llir.Value) -> llir.Value:
        """Natural log of float32 scalars or vectors, inline: x = m * 2**e with m in [sqrt(1/2), sqrt(2)),
        Cephes' polynomial in m - 1, plus e*ln 2 in two parts. Subnormals are scaled up first;
        log(0) is -inf, log(inf) inf, and negative numbers and NaN give NaN."""
        b, ty, ity = self.builder, x.type, int_like(x.type)
        tiny = b.fcmp_ordered("<", x, constant_like(ty, MIN_NORMAL_F32))
        bits = b.bitcast(b.select(tiny, b.fmul(x, constant_like(ty, 2.0 ** 23)), x), ity)
        bias = b.select(tiny, constant_like(ity, 126 + 23), constant_like(ity, 126))
        m = b.bitcast(b.or_(b.and_(bits, constant_like(ity, 0x007FFFFF)), constant_like(ity, 0x3F000000)), ty)
        low = b.fcmp_ordered("<", m, constant_like(ty, 0.707106781186547524))
        e = b.sitofp(b.sub(b.sub(b.lshr(bits, constant_like(ity, 23)), bias), b.zext(low, ity)), ty)
        f = b.fsub(b.select(low, b.fadd(m, m), m), constant_like(ty, 1.0))
        z = b.fmul(f, f)
        y = self.fma(e, constant_like(ty, -2.12194440e-4), b.fmul(b.fmul(f, z), self.horner(f, LOG_COEFFS)))
        result = self.fma(e, constant_like(ty, 0.693359375), b.fadd(f, self.fma(z, constant_like(ty, -0.5), y)))
        result = b.select(b.fcmp_ordered("==", x, constant_like(ty, 0.0)), constant_like(ty, float("-inf")), result)
        result = b.select(b.fcmp_ordered("==", x, constant_like(ty, float("inf"))), x, result)
        return b.select(b.fcmp_unordered("<", x, constant_like(ty, 0.0)), constant_like(ty, float("nan")), result)

    def tanh_f32(self, x: llir.Value) -> llir.Value:
        """tanh of float32 scalars or vectors, inline: Cephes' odd polynomial below |x| = 0.625, else
        1 - 2/(exp(2|x|) + 1) with the sign of x (±1 at ±inf; NaN stays NaN). |x| is held to TANH_ONE,
        past which that rounds to 1, so exp's argument is in range and its result normal: `exp_core`,
        without exp's range tests (a quarter fewer instructions; on AVX2 the GELU's tanh took 1.7x XLA's)."""
        b, ty = self.builder, x.type
        size = b.call(self.intrinsic("llvm.fabs", ty, 1), [x])
        square = b.fmul(x, x)
        small = self.fma(b.fmul(self.horner(square, TANH_COEFFS), square), x, x)
        held = self.binary("minimum", size, constant_like(ty, TANH_ONE))
        grown = b.fadd(self.exp_core(b.fadd(held, held), halves=False), constant_like(ty, 1.0))
        large = b.fsub(constant_like(ty, 1.0), b.fdiv(constant_like(ty, 2.0), grown))
        result = self.odd(x, b.select(b.fcmp_ordered("<", size, constant_like(ty, TANH_SPLIT)), small, large))
        return b.select(b.fcmp_unordered("uno", x, x), x, result)

    def erf_f32(self, x: llir.Value) -> llir.Value:
        """erf of float32 scalars or vectors, inline: x + x*P(x*x) below |x| = ERF_SPLIT, else
        1 - exp(Q(|x|)) with the sign of x, where Q fits log(erfc) up to ERF_ONE (±1 beyond; NaN stays NaN).
        Q over [0, ERF_ONE] stays within [-18, 0.0004], so its exp is normal: `exp_core`, without exp's range
        tests, gives the same bits."""
        b, ty = self.builder, x.type
        small = self.fma(self.horner(b.fmul(x, x), ERF_SMALL), x, x)
        size = b.call(self.intrinsic("llvm.fabs", ty, 1), [x])
        tail = self.exp_core(self.horner(self.binary("minimum", size, constant_like(ty, ERF_ONE)), ERF_LARGE),
                             halves=False)
        large = b.fsub(constant_like(ty, 1.0), tail)
        result = self.odd(x, b.select(b.fcmp_ordered("<", size, constant_like(ty, ERF_SPLIT)), small, large))
        return b.select(b.fcmp_unordered("uno", x, x), x, result)

    def odd(self, x: llir.Value, value: llir.Value) -> llir.Value:
        """`value` with the sign of x: an odd function's result from its value at |x| (tanh(-0) is -0)."""
        return self.builder.call(self.intrinsic("llvm.copysign", x.type, 2), [value, x])

    def binary(self, op: str, x: llir.Value, y: llir.Value) -> llir.Value:
        if op in ARITH:
            return getattr(self.builder, ARITH[op])(x, y, flags=DIVISION if op == "div" else FAST)
        return self.builder.call(self.intrinsic(INTRINSIC_BINARY[op], x.type, 2), [x, y])

    def intrinsic(self, name: str, ty: llir.Type, arity: int) -> llir.Function:
        return self.declare(f"{name}.{type_suffix(ty)}", ty, [ty] * arity)

    def declare(self, name: str, ret: llir.Type, args: list[llir.Type]) -> llir.Function:
        module = self.fn.module
        if name in module.globals:
            return module.globals[name]
        return llir.Function(module, llir.FunctionType(ret, args), name=name)

    # Memory and dtypes ---------------------------------------------------------------
    def load_value(self, pointer: llir.Value, dtype: str, align: int | None = None,
                   width: int | None = None, mask: llir.Value | None = None) -> llir.Value:
        """Load one element of a `dtype` buffer (or `width` packed ones, only the lanes `mask` holds
        true for, the others zero) as computed values."""
        ty = shaped(MEMORY_TYPE[dtype], width)
        align = align or ITEM_BYTES[dtype]
        if mask is None:
            stored = self.builder.load(self.typed(pointer, ty), typ=ty, align=align)
        else:
            masked = self.declare(f"llvm.masked.load.{masked_suffix(ty)}", ty, [PTR, I32, mask.type, ty])
            stored = self.builder.call(masked, [pointer, constant(I32, align), mask, constant(ty, None)])
        return self.widen(stored, dtype)

    def store_value(self, value: llir.Value, pointer: llir.Value, dtype: str, align: int | None = None,
                    mask: llir.Value | None = None):
        """Store computed values (a scalar or a packed vector, only the lanes `mask` holds true for)
        into a `dtype` buffer."""
        stored = self.narrow(value, dtype)
        align = align or ITEM_BYTES[dtype]
        if mask is None:
            self.builder.store(stored, self.typed(pointer, stored.type), align=align)
            return
        masked = self.declare(f"llvm.masked.store.{masked_suffix(stored.type)}", llir.VoidType(),
                              [stored.type, PTR, I32, mask.type])
        self.builder.call(masked, [stored, pointer, constant(I32, align), mask])

    def typed(self, pointer: llir.Value, ty: llir.Type) -> llir.Value:
        """`pointer` as a pointer to `ty` where llvmlite typed it otherwise (allocas point to elements)."""
        if pointer.type.is_opaque or pointer.type.pointee == ty:
            return pointer
        return self.once(("bitcast", id(pointer), str(ty)), lambda: self.builder.bitcast(pointer, ty.as_pointer()))

    def widen(self, stored: llir.Value, dtype: str) -> llir.Value:
        """Elements as stored in memory -> the values they compute with (exact)."""
        b, width = self.builder, lane_count(stored.type)
        if dtype == "float16":
            return b.fpext(stored, shaped(F32, width))
        if dtype == "bfloat16":
            bits = b.shl(b.zext(stored, shaped(I32, width)), constant_like(shaped(I32, width), 16))
            return b.bitcast(bits, shaped(F32, width))
        return stored

    def narrow(self, value: llir.Value, dtype: str) -> llir.Value:
        """Computed values -> elements as stored in memory, rounded to nearest even."""
        if dtype == "float16":
            return self.builder.fptrunc(value, shaped(MEMORY_TYPE[dtype], lane_count(value.type)))
        if dtype == "bfloat16":
            return self.bfloat16_bits(value)
        return value

    def bfloat16_bits(self, value: llir.Value) -> llir.Value:
        """float32 values -> bfloat16 bits, rounded to nearest even (ties to the even upper half, as
        ml_dtypes does); a NaN stays a NaN, quieted."""
        b = self.builder
        ity = shaped(I32, lane_count(value.type))
        bits = b.bitcast(value, ity)
        upper = b.lshr(bits, constant_like(ity, 16))
        odd = b.and_(upper, constant_like(ity, 1))
        rounded = b.lshr(b.add(b.add(bits, constant_like(ity, 0x7FFF)), odd), constant_like(ity, 16))
        quiet_nan = b.or_(upper, constant_like(ity, 0x40))
        chosen = b.select(b.fcmp_unordered("uno", value, value), quiet_nan, rounded)
        return b.trunc(chosen, shaped(I16, lane_count(value.type)))

    def convert(self, value: llir.Value, dtype: str) -> llir.Value:
        """Values cast to `dtype`: float32 and float64 widen or round; a half type rounds the float32
        value to it (from float64 through float32, as ml_dtypes does for bfloat16)."""
        b, width = self.builder, lane_count(value.type)
        target = shaped(VALUE_TYPE[dtype], width)
        if value.type != target:
            value = b.fpext(value, target) if VALUE_TYPE[dtype] == F64 else b.fptrunc(value, target)
        if MEMORY_TYPE[dtype] != VALUE_TYPE[dtype]:
            value = self.widen(self.narrow(value, dtype), dtype)
        return value

    # Integer helpers ------------------------------------------------------------------
    def affine(self, a: ir.Affine, env: dict) -> llir.Value:
        """sum(coeff * value) + const as i64 arithmetic. Terms whose value is a constant (an unrolled
        copy's) are folded here, and the constant is added where LLVM's folding would leave it, so
        unrolled code is built with few instructions that optimize as before."""
        pending, out = a.const, None
        for v, c in a.terms:
            value = env[v]
            if isinstance(value, llir.Constant):
                pending += c * value.constant
                continue
            term = value if c == 1 else self.integer("mul", value, constant(I64, c))
            if out is not None and pending:
                out, pending = self.integer("add", out, constant(I64, pending)), 0
            out = term if out is None else self.integer("add", out, term)
        if out is None:
            return constant(I64, pending)
        return self.integer("add", out, constant(I64, pending)) if pending else out

    def integer(self, op: str, x: llir.Value, y: llir.Value) -> llir.Value:
        """x `op` y (add or mul, no signed wrap) on i64 index values, emitted once per basic block."""
        return self.once((op, id(x), id(y)), lambda: getattr(self.builder, op)(x, y, flags=("nsw",)))

    def once(self, key: tuple, make) -> llir.Value:
        """A pure value (no memory access, no side effect) emitted once per basic block: the one made
        earlier in the current block for `key` (its operation and its operands' identities), else
        make(). The builder only appends to its current block, so an earlier value there dominates
        this use; sparing LLVM's CSE the copies of unrolled code spares building and printing them."""
        block = self.builder.block
        if block is not self.memo_block:
            self.memo_block, self.memo = block, {}
        value = self.memo.get(key)
        if value is None:
            value = self.memo[key] = make()
        return value

    def element(self, pointer: llir.Value, offset: llir.Value, dtype: str) -> llir.Value:
        """The address of element `offset` of a `dtype` buffer at `pointer` (an inbounds GEP, emitted
        once per basic block)."""
        return self.once(("gep", id(pointer), id(offset)), lambda: self.builder.gep(
            pointer, [offset], source_etype=MEMORY_TYPE[dtype], inbounds=True))

    def smin(self, x, y):
        return self.builder.select(self.builder.icmp_signed("<", x, y), x, y)

    def smax(self, x, y):
        return self.builder.select(self.builder.icmp_signed(">", x, y), x, y)


def loop_hint(module: llir.Module, hint: str) -> llir.MDValue:
    """A new loop ID (distinct, its first operand itself) carrying one hint, e.g. "llvm.loop.unroll.full"."""
    hinted = module.add_metadata([llir.MetaDataString(module, hint)])
    loop_id = llir.MDValue(module, [hinted], name=str(len(module.metadata)))
    loop_id.operands = (loop_id, hinted)
    return loop_id


def not_unrolled(module: llir.Module) -> llir.MDValue:
    """A new loop ID saying "do not unroll"."""
    return loop_hint(module, "llvm.loop.unroll.disable")


def hoisted_tail_checks(tree: LoopTree, host=None) -> dict[int, list]:
    """For each tail limit of an unrolled or vectorized loop: the loop that tests it, at depth
    `host(node, limit, path)` of its path (by default `dependent_host`), with the largest value each
    loop in between can add."""
    host = host or dependent_host
    hoisted: dict[int, list] = {}
    for node, path in tree.walk():
        if not isinstance(node, LoopNode) or node.loop.annotation not in ("unroll", "vectorize"):
            continue
        for lim in node.limits:
            depth = host(node, lim, path)
            if depth is None:
                continue
            coeffs = lim.rest.coeffs()
            spans = [(p.loop.name, (p.loop.extent - 1) if coeffs[p.loop.name] > 0 else 0)
                     for p in path[depth + 1:] if p.loop.name in coeffs]
            hoisted.setdefault(id(path[depth]), []).append((node, lim, spans))
    return hoisted


def dependent_host(node: LoopNode, lim: Limit, path: list[LoopNode]) -> int | None:
    """The depth of the deepest loop in `path` that a tail limit depends on and that is neither
    unrolled nor vectorized (None if there is none)."""
    names = {v for v, _ in lim.rest.terms}
    depths = [depth for depth, p in enumerate(path)
              if p.loop.name in names and p.loop.annotation not in ("unroll", "vectorize")]
    return depths[-1] if depths else None


# A padding guard is tested once at the outermost plain loop over whose body its expression moves by
# at most 1/GUARD_SPAN of the guard's range: most of that loop's iterations then run a copy without it.
GUARD_SPAN = 4


@dataclass(frozen=True)
class GuardCheck:
    """A statement's guard tested once at a loop's body: its expression over loop variables and the
    loops inside that loop it moves with, with their extents."""

    stmt: int
    guard: ir.Guard
    expr: ir.Affine
    inner: tuple[tuple[str, int], ...]


def hoisted_guard_checks(tree: LoopTree) -> dict[int, list[GuardCheck]]:
    """For each statement under padding guards: the loop that tests all of them once (the deepest of
    the loops each guard alone would be tested at, so a statement's body is copied once)."""
    checks: dict[int, list[GuardCheck]] = {}
    for node, path in tree.walk():
        if not isinstance(node, StmtNode) or node.kind == "init":      # an init does not read the expression
            continue
        found = {g: g.expr.substitute(node.index) for g in ir.guards(node.stage.expr)}
        depths = [guard_host(expr, g, path) for g, expr in found.items()]
        if not found or None in depths:
            continue
        depth = max(depths)
        inner = {p.loop.name: p.loop.extent for p in path[depth + 1:]}
        for g, expr in found.items():
            moving = tuple((name, extent) for name, extent in inner.items() if expr.coeffs().get(name))
            checks.setdefault(id(path[depth]), []).append(GuardCheck(id(node), g, expr, moving))
    return checks


def guard_host(expr: ir.Affine, guard: ir.Guard, path: list[LoopNode]) -> int | None:
    """The depth in `path` of the outermost plain loop over whose body `expr` moves by at most
    1/GUARD_SPAN of the guard's range (None if there is none)."""
    coeffs = expr.coeffs()
    for depth, node in enumerate(path):
        if node.loop.annotation:
            continue
        span = sum(abs(coeffs.get(p.loop.name, 0)) * (p.loop.extent - 1) for p in path[depth + 1:])
        if span * GUARD_SPAN <= guard.hi - guard.lo:
            return depth
    return None


@dataclass(frozen=True)
class Lanes:
    """The vectorized loop: its name and width (its extent); in a masked tail, the <width x i1> of
    the lanes that run."""

    name: str
    width: int
    mask: llir.Value | None = None


def type_suffix(ty: llir.Type) -> str:
    """An intrinsic's overload suffix for values of `ty` (f32, f64, i16, f16, or vectors of them)."""
    if isinstance(ty, llir.VectorType):
        return f"v{ty.count}{type_suffix(ty.element)}"
    return {F32: "f32", I16: "i16", llir.HalfType(): "f16"}.get(ty, "f64")


def masked_suffix(ty: llir.VectorType) -> str:
    """The overload suffix of llvm.masked.load/store for vectors of `ty` through an opaque pointer."""
    return f"{type_suffix(ty)}.p0"


def shaped(element: llir.Type, width: int | None) -> llir.Type:
    """`element`, or a vector of `width` of them."""
    return element if width is None else llir.VectorType(element, width)


def lane_count(ty: llir.Type) -> int | None:
    """The lanes of a vector type; None for a scalar."""
    return ty.count if isinstance(ty, llir.VectorType) else None


def is_product(e: ir.Expr) -> bool:
    return isinstance(e, ir.Binary) and e.op == "mul"


def element_type(ty: llir.Type) -> llir.Type:
    return ty.element if isinstance(ty, llir.VectorType) else ty


def int_like(ty: llir.Type) -> llir.Type:
    """The 32-bit integer type of a float32 scalar or vector's shape (for bit manipulation)."""
    return llir.VectorType(I32, ty.count) if isinstance(ty, llir.VectorType) else I32


def constant_like(ty: llir.Type, value: float | int) -> llir.Constant:
    if isinstance(ty, llir.VectorType):
        return constant(ty, [value] * ty.count)
    return constant(ty, value)


class TypedCallee:
    """Lets llvmlite call through an opaque pointer: it needs the callee's function type."""

    def __init__(self, ptr: llir.Value, fnty: llir.FunctionType):
        self.ptr, self.function_type = ptr, fnty
        self.type = llir.PointerType()

    def get_reference(self):
        return self.ptr.get_reference()
