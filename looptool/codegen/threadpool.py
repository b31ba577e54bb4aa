"""A persistent pool of POSIX threads for parallel loops, written in LLVM IR.

`looptool_parallel_for(body, ctx, count, threads)` runs `body(ctx, start, end)` over
[0, count) cut into `threads` chunks: the caller runs the first chunk, pool workers
the others.  Workers start on first use (more are added when more threads are asked
for) and then sleep on a condition variable, so a parallel loop costs a wake-up,
not a thread start.  One caller uses the pool at a time: a concurrent or nested
caller runs its whole range itself, which gives the same result bit for bit
(a parallel loop carries no dependence).  A forked child starts with an empty pool.

Kernels only declare the function.  The JIT runtime compiles `pool_module` once per
process and publishes its address; an exported shared library links its own copy.
Mutexes and condition variables are zero-filled static storage, which is their
static initializer on Linux (glibc and musl).
"""
from __future__ import annotations

from llvmlite import ir as llir

from .llvm import I32, I64, ONE, PTR, ZERO, TypedCallee

ENTRY = "looptool_parallel_for"
VOID = llir.VoidType()
BODY_TYPE = llir.FunctionType(VOID, [PTR, I64, I64])
ENTRY_TYPE = llir.FunctionType(VOID, [PTR, PTR, I64, I64])
SYNC_BYTES = 128            # room for a pthread mutex or condition variable on any Linux ABI
INDEX_BITS = 16             # a worker's start argument packs (generation << 16) | index


def declare_parallel_for(module: llir.Module) -> llir.Function:
    """The pool's entry point, declared in a kernel module (defined by `pool_module`)."""
    return module.globals.get(ENTRY) or llir.Function(module, ENTRY_TYPE, name=ENTRY)


def pool_module(triple: str) -> llir.Module:
    """A module defining `looptool_parallel_for` and the pool's state."""
    module = llir.Module(name="looptool_pool")
    module.triple = triple
    _PoolBuilder(module).define()
    return module


class _PoolBuilder:
    """Emits the pool's globals, its worker loop, the fork handler and the entry point."""

    def __init__(self, module: llir.Module):
        self.module = module
        self.sync = {name: self.global_bytes(name) for name in ("mutex", "work", "done", "busy")}
        self.word = {name: self.global_word(name) for name in
                     ("workers", "generation", "pending", "count", "chunk", "threads", "owner")}
        self.pointer = {name: self.global_pointer(name) for name in ("body", "ctx")}
        self.libc = {
            "lock": self.extern("pthread_mutex_lock", I32, [PTR]),
            "unlock": self.extern("pthread_mutex_unlock", I32, [PTR]),
            "trylock": self.extern("pthread_mutex_trylock", I32, [PTR]),
            "wait": self.extern("pthread_cond_wait", I32, [PTR, PTR]),
            "broadcast": self.extern("pthread_cond_broadcast", I32, [PTR]),
            "signal": self.extern("pthread_cond_signal", I32, [PTR]),
            "create": self.extern("pthread_create", I32, [PTR, PTR, PTR, PTR]),
            "detach": self.extern("pthread_detach", I32, [I64]),
            "getpid": self.extern("getpid", I32, []),
        }

    # Declarations ---------------------------------------------------------------------------
    def global_bytes(self, name: str) -> llir.GlobalVariable:
        var = llir.GlobalVariable(self.module, llir.ArrayType(llir.IntType(8), SYNC_BYTES), f"looptool_pool.{name}")
        var.initializer = llir.Constant(var.value_type, None)
        var.linkage, var.align = "internal", 64
        return var

    def global_word(self, name: str) -> llir.GlobalVariable:
        var = llir.GlobalVariable(self.module, I64, f"looptool_pool.{name}")
        var.initializer, var.linkage = ZERO, "internal"
        return var

    def global_pointer(self, name: str) -> llir.GlobalVariable:
        var = llir.GlobalVariable(self.module, PTR, f"looptool_pool.{name}")
        var.initializer, var.linkage = llir.Constant(PTR, None), "internal"
        return var

    def get(self, b: llir.IRBuilder, name: str) -> llir.Value:
        """Load one of the pool's words or pointers."""
        var = self.word.get(name) or self.pointer[name]
        return b.load(var, typ=var.value_type)

    def extern(self, name: str, ret: llir.Type, args: list[llir.Type]) -> llir.Function:
        return llir.Function(self.module, llir.FunctionType(ret, args), name=name)

    def define(self):
        grow = self.grow(self.worker())
        self.entry(grow, self.reset_after_fork())

    # Pieces ----------------------------------------------------------------------------------
    def call(self, b: llir.IRBuilder, name: str, *args):
        return b.call(self.libc[name], list(args))

    def wait_while(self, b: llir.IRBuilder, fn: llir.Function, condition, cond_var: str, name: str):
        """Sleep on `cond_var` (mutex held) while `condition(b)` is true; continue after it."""
        check = fn.append_basic_block(f"{name}.check")
        sleep = fn.append_basic_block(f"{name}.sleep")
        after = fn.append_basic_block(f"{name}.after")
        b.branch(check)
        b.position_at_end(check)
        b.cbranch(condition(b), sleep, after)
        b.position_at_end(sleep)
        self.call(b, "wait", self.sync[cond_var], self.sync["mutex"])
        b.branch(check)
        b.position_at_end(after)

    def run_chunk(self, b: llir.IRBuilder, body, ctx, count, chunk, index):
        """body(ctx, index*chunk, min(index*chunk + chunk, count)) when that range is not empty."""
        start = b.mul(index, chunk)
        end = b.add(start, chunk)
        end = b.select(b.icmp_signed("<", end, count), end, count)
        with b.if_then(b.icmp_signed("<", start, end)):
            b.call(TypedCallee(body, BODY_TYPE), [ctx, start, end])

    def worker(self) -> llir.Function:
        """Sleep until a new generation is posted; run this worker's chunk if it takes part; repeat."""
        fn = llir.Function(self.module, llir.FunctionType(PTR, [PTR]), name="looptool_pool.worker")
        fn.linkage = "internal"
        b = llir.IRBuilder(fn.append_basic_block("entry"))
        packed = b.ptrtoint(fn.args[0], I64)
        index = b.and_(packed, llir.Constant(I64, (1 << INDEX_BITS) - 1))
        seen = b.alloca(I64, name="seen")
        b.store(b.lshr(packed, llir.Constant(I64, INDEX_BITS)), seen)
        self.call(b, "lock", self.sync["mutex"])
        loop = fn.append_basic_block("loop")
        b.branch(loop)
        b.position_at_end(loop)
        self.wait_while(b, fn, lambda b: b.icmp_unsigned("==", self.get(b, "generation"), b.load(seen, typ=I64)),
                        "work", "job")
        b.store(self.get(b, "generation"), seen)
        with b.if_then(b.icmp_unsigned("<", index, self.get(b, "threads"))):
            body, ctx = self.get(b, "body"), self.get(b, "ctx")
            count, chunk = self.get(b, "count"), self.get(b, "chunk")
            self.call(b, "unlock", self.sync["mutex"])
            self.run_chunk(b, body, ctx, count, chunk, index)
            self.call(b, "lock", self.sync["mutex"])
            pending = b.sub(self.get(b, "pending"), ONE)
            b.store(pending, self.word["pending"])
            with b.if_then(b.icmp_unsigned("==", pending, ZERO)):
                self.call(b, "signal", self.sync["done"])
        b.branch(loop)
        return fn

    def reset_after_fork(self) -> llir.Function:
        """A process other than the pool's owner is a forked child, which has none of the workers
        (pthread_atfork is not a dynamic symbol in glibc, so the pid tells): start from an empty pool."""
        fn = llir.Function(self.module, llir.FunctionType(VOID, []), name="looptool_pool.reset_after_fork")
        fn.linkage = "internal"
        b = llir.IRBuilder(fn.append_basic_block("entry"))
        pid = b.sext(self.call(b, "getpid"), I64)
        with b.if_then(b.icmp_unsigned("!=", pid, self.get(b, "owner"))):
            for var in self.sync.values():
                b.store(llir.Constant(var.value_type, None), var)
            for name in ("workers", "pending"):
                b.store(ZERO, self.word[name])
            b.store(pid, self.word["owner"])
        b.ret_void()
        return fn

    def grow(self, worker: llir.Function) -> llir.Function:
        """Start workers until there are `want` (mutex held); return how many there are."""
        fn = llir.Function(self.module, llir.FunctionType(I64, [I64]), name="looptool_pool.grow")
        fn.linkage = "internal"
        want = fn.args[0]
        b = llir.IRBuilder(fn.append_basic_block("entry"))
        tid = b.alloca(I64, name="tid")
        check, create, done = (fn.append_basic_block(n) for n in ("check", "create", "done"))
        b.branch(check)
        b.position_at_end(check)
        workers = self.get(b, "workers")
        b.cbranch(b.icmp_signed("<", workers, want), create, done)
        b.position_at_end(create)
        index = b.add(workers, ONE)
        generation = b.shl(self.get(b, "generation"), llir.Constant(I64, INDEX_BITS))
        argument = b.inttoptr(b.or_(generation, index), PTR)
        failed = self.call(b, "create", tid, llir.Constant(PTR, None), worker, argument)
        started = fn.append_basic_block("started")
        b.cbranch(b.icmp_signed("==", failed, llir.Constant(I32, 0)), started, done)
        b.position_at_end(started)
        self.call(b, "detach", b.load(tid, typ=I64))
        b.store(index, self.word["workers"])
        b.branch(check)
        b.position_at_end(done)
        b.ret(self.get(b, "workers"))
        return fn

    def entry(self, grow: llir.Function, reset_after_fork: llir.Function) -> llir.Function:
        """`looptool_parallel_for`: post the job, run the first chunk, wait for the workers."""
        fn = llir.Function(self.module, ENTRY_TYPE, name=ENTRY)
        body, ctx, count, threads = fn.args
        b = llir.IRBuilder(fn.append_basic_block("entry"))
        serial, pooled = fn.append_basic_block("serial"), fn.append_basic_block("pooled")
        alone = b.or_(b.icmp_signed("<=", threads, ONE), b.icmp_signed("<=", count, ONE))
        claimed = fn.append_basic_block("claim")
        b.cbranch(alone, serial, claimed)
        b.position_at_end(claimed)
        b.call(reset_after_fork, [])
        busy = self.call(b, "trylock", self.sync["busy"])
        b.cbranch(b.icmp_signed("!=", busy, llir.Constant(I32, 0)), serial, pooled)

        b.position_at_end(serial)
        b.call(TypedCallee(body, BODY_TYPE), [ctx, ZERO, count])
        b.ret_void()

        b.position_at_end(pooled)
        self.call(b, "lock", self.sync["mutex"])
        workers = b.call(grow, [b.sub(threads, ONE)])
        available = b.add(workers, ONE)
        parts = b.select(b.icmp_signed("<", available, threads), available, threads)
        chunk = b.sdiv(b.add(count, b.sub(parts, ONE)), parts)
        for name, value in (("count", count), ("chunk", chunk), ("threads", parts), ("pending", b.sub(parts, ONE))):
            b.store(value, self.word[name])
        b.store(body, self.pointer["body"])
        b.store(ctx, self.pointer["ctx"])
        b.store(b.add(self.get(b, "generation"), ONE), self.word["generation"])
        self.call(b, "broadcast", self.sync["work"])
        self.call(b, "unlock", self.sync["mutex"])
        self.run_chunk(b, body, ctx, count, chunk, ZERO)
        self.call(b, "lock", self.sync["mutex"])
        self.wait_while(b, fn, lambda b: b.icmp_unsigned("!=", self.get(b, "pending"), ZERO), "done", "finish")
        self.call(b, "unlock", self.sync["mutex"])
        self.call(b, "unlock", self.sync["busy"])
        b.ret_void()
        return fn
