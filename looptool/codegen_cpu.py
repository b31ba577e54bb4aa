"""LLVM CPU backend: a loop tree becomes an LLVM function built with llvmlite.ir.

The kernel is `void kernel(ptr buf0, ptr buf1, ...)`, one noalias pointer per
input, runtime-made temporary and output buffer (in `CpuKernelSource.params`
order).  All index arithmetic is 64-bit.  Loads under a padding/concat guard
clamp their indices into bounds, so no schedule reads outside a buffer.
"""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite import ir as llir

from . import ir
from .looptree import BufferPlan, Limit, LoopNode, LoopTree, StmtNode

I64 = llir.IntType(64)
I1 = llir.IntType(1)
PTR = llir.PointerType()
FLOAT = {"float32": llir.FloatType(), "float64": llir.DoubleType()}
FAST = ("reassoc", "contract", "nsz")
IDENTITY = {"sum": 0.0, "max": float("-inf"), "min": float("inf")}
INTRINSIC_UNARY = {"exp": "llvm.exp", "log": "llvm.log", "sqrt": "llvm.sqrt", "abs": "llvm.fabs"}
INTRINSIC_BINARY = {"maximum": "llvm.maximum", "minimum": "llvm.minimum"}
ARITH = {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv"}
REDUCE_BINARY = {"sum": "add", "max": "maximum", "min": "minimum"}


@dataclass
class CpuKernelSource:
    """The generated module and the buffer name of each kernel parameter."""

    module: llir.Module
    params: list[str]


def kernel_params(tree: LoopTree) -> list[str]:
    """Buffers passed to the kernel: inputs, runtime temporaries, then the output."""
    order = {"input": 0, "temp": 1, "output": 2}
    plans = [p for p in tree.buffers.values() if p.kind in order]
    return [p.name for p in sorted(plans, key=lambda p: order[p.kind])]


def generate(tree: LoopTree, triple: str) -> CpuKernelSource:
    """Build the LLVM module for a loop tree."""
    module = llir.Module(name="looptool")
    module.triple = triple
    params = kernel_params(tree)
    fn = llir.Function(module, llir.FunctionType(llir.VoidType(), [PTR] * len(params)), name="kernel")
    for arg, name in zip(fn.args, params):
        arg.name = name
        arg.add_attribute("noalias")
    _FunctionBuilder(tree, fn, dict(zip(params, fn.args))).build()
    return CpuKernelSource(module, params)


class _FunctionBuilder:
    def __init__(self, tree: LoopTree, fn: llir.Function, pointers: dict[str, llir.Value]):
        self.tree, self.fn, self.pointers = tree, fn, dict(pointers)
        self.entry = fn.append_basic_block("entry")
        self.builder = llir.IRBuilder(self.entry)

    def build(self):
        for plans in self.tree.local_buffers.values():
            for plan in plans:
                self.pointers[plan.name] = self.builder.alloca(
                    FLOAT[plan.dtype], size=llir.Constant(I64, plan.size), name=plan.name)
        self.body(self.tree.root, {})
        self.builder.ret_void()

    # Control flow -----------------------------------------------------------------
    def body(self, nodes: list, env: dict):
        for node in nodes:
            if isinstance(node, StmtNode):
                self.statement(node, env)
            else:
                self.loop(node, env)

    def loop(self, node: LoopNode, env: dict):
        lp = node.loop
        count = self.trip_count(node, env)
        if lp.annotation == "unroll":
            self.unrolled(node, env, count)
        else:
            self.counted_loop(count, lambda i: self.body(node.body, {**env, lp.name: i}), lp.name)

    def trip_count(self, node: LoopNode, env: dict) -> llir.Value:
        count: llir.Value = llir.Constant(I64, node.loop.extent)
        for lim in node.limits:
            count = self.smin(count, self.limit_count(lim, env))
        return count

    def limit_count(self, lim: Limit, env: dict) -> llir.Value:
        b = self.builder
        room = b.sub(llir.Constant(I64, lim.bound), self.affine(lim.rest, env))
        room = self.smax(room, llir.Constant(I64, 0))
        return b.sdiv(b.add(room, llir.Constant(I64, lim.coeff - 1)), llir.Constant(I64, lim.coeff))

    def counted_loop(self, count: llir.Value, emit_body, name: str):
        b = self.builder
        pre = b.block
        header = self.fn.append_basic_block(f"{name}.head")
        body = self.fn.append_basic_block(f"{name}.body")
        done = self.fn.append_basic_block(f"{name}.done")
        b.branch(header)
        b.position_at_end(header)
        i = b.phi(I64, name=name)
        i.add_incoming(llir.Constant(I64, 0), pre)
        b.cbranch(b.icmp_signed("<", i, count), body, done)
        b.position_at_end(body)
        emit_body(i)
        i.add_incoming(b.add(i, llir.Constant(I64, 1), flags=("nsw", "nuw")), b.block)
        b.branch(header)
        b.position_at_end(done)

    def unrolled(self, node: LoopNode, env: dict, count: llir.Value):
        """Full copies when the loop runs its whole extent; a rolled loop for a tail."""
        lp = node.loop
        if not node.limits:
            for k in range(lp.extent):
                self.body(node.body, {**env, lp.name: llir.Constant(I64, k)})
            return
        b = self.builder
        full = b.icmp_signed("==", count, llir.Constant(I64, lp.extent))
        with b.if_else(full) as (then, otherwise):
            with then:
                for k in range(lp.extent):
                    self.body(node.body, {**env, lp.name: llir.Constant(I64, k)})
            with otherwise:
                self.counted_loop(count, lambda i: self.body(node.body, {**env, lp.name: i}), lp.name)

    # Statements --------------------------------------------------------------------
    def statement(self, stmt: StmtNode, env: dict):
        stage = stmt.stage
        dims = {d: self.affine(a, env) for d, a in stmt.index.items()}
        target = self.address(self.tree.buffers[stage.name], [dims[d] for d in stage.dims], False, env)
        ty = FLOAT[stage.dtype]
        if stmt.kind == "init":
            self.builder.store(llir.Constant(ty, IDENTITY[stage.reduce_op]), target)
            return
        value = self.expr(stage.expr, dims, env)
        if stmt.kind == "update":
            old = self.builder.load(target, typ=ty)
            value = self.binary(REDUCE_BINARY[stage.reduce_op], old, value)
        self.builder.store(value, target)

    def address(self, plan: BufferPlan, index: list[llir.Value], clamp: bool, env: dict) -> llir.Value:
        """Pointer to element `index` (full coordinates) of a buffer."""
        b = self.builder
        offsets = dict(plan.offsets)
        linear: llir.Value = llir.Constant(I64, 0)
        for d, ix, n, stride in zip(plan.dims, index, plan.shape, plan.strides):
            if d in offsets:
                ix = b.sub(ix, self.affine(offsets[d], env))
            if clamp:
                ix = self.smin(self.smax(ix, llir.Constant(I64, 0)), llir.Constant(I64, n - 1))
            linear = b.add(linear, b.mul(ix, llir.Constant(I64, stride)))
        return b.gep(self.pointers[plan.name], [linear], source_etype=FLOAT[plan.dtype], inbounds=True)

    # Expressions -------------------------------------------------------------------
    def expr(self, e: ir.Expr, dims: dict[str, llir.Value], env: dict) -> llir.Value:
        b = self.builder
        ty = FLOAT[e.dtype]
        if isinstance(e, ir.Const):
            return llir.Constant(ty, e.value)
        if isinstance(e, ir.Load):
            index = [llir_affine(b, a, dims) for a in e.index]
            return b.load(self.address(self.tree.buffers[e.buffer], index, e.clamped, env), typ=ty)
        if isinstance(e, ir.Select):
            ok = llir.Constant(I1, 1)
            for g in e.guards:
                v = llir_affine(b, g.expr, dims)
                ok = b.and_(ok, b.and_(b.icmp_signed(">=", v, llir.Constant(I64, g.lo)),
                                       b.icmp_signed("<", v, llir.Constant(I64, g.hi))))
            return b.select(ok, self.expr(e.then, dims, env), self.expr(e.otherwise, dims, env))
        if isinstance(e, ir.Cast):
            x = self.expr(e.x, dims, env)
            return b.fpext(x, ty) if e.dtype == "float64" else b.fptrunc(x, ty)
        if isinstance(e, ir.Unary):
            return self.unary(e.op, self.expr(e.x, dims, env))
        return self.binary(e.op, self.expr(e.a, dims, env), self.expr(e.b, dims, env))

    def unary(self, op: str, x: llir.Value) -> llir.Value:
        b = self.builder
        if op == "neg":
            return b.fneg(x)
        if op == "reciprocal":
            return b.fdiv(llir.Constant(x.type, 1.0), x, flags=FAST)
        if op == "relu":
            return self.binary("maximum", x, llir.Constant(x.type, 0.0))
        return b.call(self.intrinsic(INTRINSIC_UNARY[op], x.type, 1), [x], fastmath=FAST)

    def binary(self, op: str, x: llir.Value, y: llir.Value) -> llir.Value:
        if op in ARITH:
            return getattr(self.builder, ARITH[op])(x, y, flags=FAST)
        return self.builder.call(self.intrinsic(INTRINSIC_BINARY[op], x.type, 2), [x, y])

    def intrinsic(self, name: str, ty: llir.Type, arity: int) -> llir.Function:
        suffix = "f32" if ty == FLOAT["float32"] else "f64"
        full = f"{name}.{suffix}"
        module = self.fn.module
        if full in module.globals:
            return module.globals[full]
        return llir.Function(module, llir.FunctionType(ty, [ty] * arity), name=full)

    # Integer helpers ------------------------------------------------------------------
    def affine(self, a: ir.Affine, env: dict) -> llir.Value:
        return llir_affine(self.builder, a, env)

    def smin(self, x, y):
        return self.builder.select(self.builder.icmp_signed("<", x, y), x, y)

    def smax(self, x, y):
        return self.builder.select(self.builder.icmp_signed(">", x, y), x, y)


def llir_affine(b: llir.IRBuilder, a: ir.Affine, values: dict[str, llir.Value]) -> llir.Value:
    """Emit sum(coeff * value) + const as i64 arithmetic."""
    out: llir.Value = llir.Constant(I64, a.const)
    for v, c in a.terms:
        term = values[v] if c == 1 else b.mul(values[v], llir.Constant(I64, c), flags=("nsw",))
        out = b.add(out, term, flags=("nsw",))
    return out


class HostTarget:
    """The JIT target for this CPU: name, features and an O3 target machine."""

    _instance = None

    def __init__(self):
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        self.triple = llvm.get_process_triple()
        self.cpu = llvm.get_host_cpu_name()
        self.features = llvm.get_host_cpu_features().flatten()
        target = llvm.Target.from_triple(self.triple)
        self.machine = target.create_target_machine(cpu=self.cpu, features=self.features, opt=3,
                                                    codemodel="jitdefault", jit=True)

    @classmethod
    def get(cls) -> "HostTarget":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def optimize(self, text: str) -> llvm.ModuleRef:
        """Parse, verify and optimize LLVM IR with the new pass manager at O3."""
        mod = llvm.parse_assembly(text)
        mod.triple = self.triple
        mod.data_layout = str(self.machine.target_data)
        mod.verify()
        options = llvm.create_pipeline_tuning_options(speed_level=3)
        options.loop_vectorization = True
        options.slp_vectorization = True
        options.loop_unrolling = True
        builder = llvm.create_pass_builder(self.machine, options)
        builder.getModulePassManager().run(mod, builder)
        return mod
