"""A persistent pool of POSIX threads for parallel loops, written in LLVM IR.

`looptool_parallel_for(body, ctx, count, threads)` runs `body(ctx, start, end)` over
[0, count) on the caller and `threads - 1` pool workers.  The range is cut into blocks of
`grain` iterations (about CHUNKS_PER_THREAD blocks per thread) that each thread claims in turn
from one atomic ticket, so a worker that wakes late, or a thread with slower blocks (a partial
tile at an edge), leaves its share to the others instead of holding up the call.  Claims walk the
threads' contiguous shares in turn (claim k takes the next block of share k mod threads), so
threads that keep pace work far apart: neighbouring blocks often share a cache line of their
output (a row of 24-float column tiles is 96 bytes a tile), and two threads writing one line in
turn made a 2-thread 200x300x500 matmul 15 % slower than with blocks handed out in order.  The caller
returns when every iteration is done, not when every worker has woken.  Workers start on first
use (more are added when more threads are asked for), poll for the next loop for a while
(WORKER_POLL_NS, longer where the process has CPUs to spare) and then sleep on a condition
variable, so a parallel loop costs at most a wake-up, not a thread start.  Polls are timed by
the clock, not counted in pauses (a `pause` takes from about 10 to 140 cycles, by core).  The
caller's poll, and a worker's long poll (where CPUs are spare), call sched_yield at each look at
the clock once they have spun YIELD_AFTER_NS: another of our threads that the kernel placed on the
same CPU then runs within about that time instead of after the spinner's whole poll or scheduler
slice (3 ms on Linux with 8 or more CPUs).  A worker woken onto the CPU its caller runs on (the kernel puts it there when it
finds no idle CPU at once, e.g. while another library's threads spin) moves to another CPU before
it claims a block.  One caller uses the pool at a time: a concurrent or nested caller runs its whole range
itself, which gives the same result bit for bit (a parallel loop carries no dependence).  A
forked child starts with an empty pool.

Kernels only declare the function.  The JIT runtime compiles `pool_module` once per
process and publishes its address; an exported shared library links its own copy.
Mutexes and condition variables are zero-filled static storage, which is their
static initializer on Linux (glibc and musl).
"""
from __future__ import annotations

from llvmlite import ir as llir

from .llvm import I1, I32, I64, ONE, PTR, ZERO, TypedCallee, constant

ENTRY = "looptool_parallel_for"
VOID = llir.VoidType()
BODY_TYPE = llir.FunctionType(VOID, [PTR, I64, I64])
ENTRY_TYPE = llir.FunctionType(VOID, [PTR, PTR, I64, I64])
CLAIM_TYPE = llir.FunctionType(VOID, [I64, PTR, PTR, I64, I64, I64])
SYNC_BYTES = 128            # room for a pthread mutex or condition variable on any Linux ABI
INDEX_BITS = 16             # a worker's start argument packs (generation << 16) | index
TICKET_BITS = 32            # the ticket packs (generation << 32) | number of blocks claimed
TICKET_MASK = (1 << TICKET_BITS) - 1
# Blocks per thread: enough that a late or slow thread costs the call at most about 1/8 of a
# thread's share, few enough that claiming (one atomic compare-and-swap) stays negligible.
CHUNKS_PER_THREAD = 8
# How long a worker polls for the next parallel loop, and the caller for the workers' last blocks,
# before it sleeps.  A sleeping thread takes tens of microseconds to wake (a futex wake and, on a
# VM, an idle virtual CPU; 20-60 us on a 2-vCPU KVM guest), so each polls a few wake-ups long: a
# worker 0.1 ms, the caller, whose wait is at most the rest of one block, 0.5 ms.  Where the
# process may use at least twice as many CPUs as the loop's threads, a worker polls 2 ms: it keeps
# a CPU that no other thread is short of, and a loop called again within that time (between other
# small work: a 200x300x500 OpenBLAS matmul takes 0.3-0.8 ms) wakes nobody.  With fewer CPUs a
# long poll would take one from the other threads' work (another library's, or the next call's own).
WORKER_POLL_NS = 100_000
WORKER_POLL_SPARE_NS = 2_000_000
CALLER_POLL_NS = 500_000
# The caller's poll and a worker's spare-CPU poll yield the CPU (sched_yield) at each look at the
# clock once they have spun this long: another of our threads queued on that CPU then waits about
# this, not a whole poll or scheduler slice, while the usual short wait (a loop's last block) never
# hands the CPU to another process's thread, which may keep it for a slice.  A worker's short poll
# never yields: it costs a queued thread at most its 0.1 ms, and a worker that yields to another
# library's spinning thread (OpenBLAS's, which never yields) is then off its CPU for a slice.
YIELD_AFTER_NS = 50_000
PAUSES_PER_CLOCK = 1 << 5    # pauses between two looks at the clock (about 1-4 us)
CPU_SET_BYTES = 128          # glibc's cpu_set_t: 1024 CPUs
CLOCK_MONOTONIC = 1          # its number on Linux (all architectures)


def declare_parallel_for(module: llir.Module) -> llir.Function:
    """The pool's entry point, declared in a kernel module (defined by `pool_module`)."""
    return module.globals.get(ENTRY) or llir.Function(module, ENTRY_TYPE, name=ENTRY)


def pool_module(triple: str) -> llir.Module:
    """A module defining `looptool_parallel_for` and the pool's state."""
    module = llir.Module(name="looptool_pool")
    module.triple = triple
    _PoolBuilder(module, triple).define()
    return module


def block_start(b: llir.IRBuilder, claimed: llir.Value, blocks: llir.Value, parts: llir.Value) -> llir.Value:
    """The block index of the `claimed`-th claim: the range's `blocks` are cut into `parts` contiguous
    shares (the first `blocks mod parts` one block longer) and claim k takes the next block of share
    k mod parts, so threads that claim in turn each work through a share of their own."""
    share, step = b.urem(claimed, parts), b.udiv(claimed, parts)
    shorter, longer = b.udiv(blocks, parts), b.urem(blocks, parts)
    earlier_longer = b.select(b.icmp_unsigned("<", share, longer), share, longer)
    return b.add(b.add(b.mul(share, shorter), earlier_longer), step)


class _PoolBuilder:
    """Emits the pool's globals, its worker loop, the fork handler and the entry point."""

    def __init__(self, module: llir.Module, triple: str):
        self.module, self.triple = module, triple
        self.sync = {name: self.global_bytes(name) for name in ("mutex", "work", "done", "busy")}
        self.word = {name: self.global_word(name) for name in
                     ("workers", "generation", "ticket", "remaining", "count", "grain", "threads", "owner",
                      "caller_cpu", "cpus", "poll")}
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
            "clock": self.extern("clock_gettime", I32, [I32, PTR]),
            "getcpu": self.extern("sched_getcpu", I32, []),
            "yield": self.extern("sched_yield", I32, []),
            "getaffinity": self.extern("sched_getaffinity", I32, [I32, I64, PTR]),
            "setaffinity": self.extern("sched_setaffinity", I32, [I32, I64, PTR]),
        }

    # Declarations ---------------------------------------------------------------------------
    def global_bytes(self, name: str) -> llir.GlobalVariable:
        var = llir.GlobalVariable(self.module, llir.ArrayType(llir.IntType(8), SYNC_BYTES), f"looptool_pool.{name}")
        var.initializer = constant(var.value_type, None)
        var.linkage, var.align = "internal", 64
        return var

    def global_word(self, name: str) -> llir.GlobalVariable:
        var = llir.GlobalVariable(self.module, I64, f"looptool_pool.{name}")
        var.initializer, var.linkage = ZERO, "internal"
        var.align = 64       # each word on its own cache line: polled words are not shared with written ones
        return var

    def global_pointer(self, name: str) -> llir.GlobalVariable:
        var = llir.GlobalVariable(self.module, PTR, f"looptool_pool.{name}")
        var.initializer, var.linkage = constant(PTR, None), "internal"
        return var

    def get(self, b: llir.IRBuilder, name: str) -> llir.Value:
        """Load one of the pool's words or pointers."""
        var = self.word.get(name) or self.pointer[name]
        return b.load(var, typ=var.value_type)

    def get_atomic(self, b: llir.IRBuilder, name: str) -> llir.Value:
        """Load one of the pool's words that other threads change outside the mutex."""
        return b.load_atomic(self.word[name], "acquire", 8, typ=I64)

    def put_atomic(self, b: llir.IRBuilder, name: str, value: llir.Value):
        b.store_atomic(value, self.word[name], "release", 8)

    def extern(self, name: str, ret: llir.Type, args: list[llir.Type]) -> llir.Function:
        """The module's declaration of function `name`, made on first use."""
        return self.module.globals.get(name) or llir.Function(self.module, llir.FunctionType(ret, args), name=name)

    def define(self):
        claim = self.claim()
        grow = self.grow(self.worker(claim, self.leave_cpu()))
        self.entry(grow, self.reset_after_fork(), claim, self.count_cpus())

    # Pieces ----------------------------------------------------------------------------------
    def call(self, b: llir.IRBuilder, name: str, *args):
        return b.call(self.libc[name], list(args))

    def pause(self, b: llir.IRBuilder):
        """The CPU's spin-wait hint (x86 `pause`, Arm `yield`); nothing on other targets."""
        if self.triple.startswith(("x86_64", "i386", "i686")):
            b.call(self.extern("llvm.x86.sse2.pause", VOID, []), [])
        elif self.triple.startswith(("aarch64", "arm64")):
            b.call(self.extern("llvm.aarch64.hint", VOID, [I32]), [constant(I32, 1)])

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

    def now(self, b: llir.IRBuilder) -> llir.Value:
        """Nanoseconds on the monotonic clock (clock_gettime: a vDSO call, no system call)."""
        with b.goto_entry_block():          # an alloca in a loop would grow the stack every turn
            timespec = b.alloca(llir.ArrayType(I64, 2), name="timespec")
        self.call(b, "clock", constant(I32, CLOCK_MONOTONIC), timespec)
        seconds, nanoseconds = (b.load(b.gep(timespec, [ZERO, constant(I32, i)]), typ=I64) for i in (0, 1))
        return b.add(b.mul(seconds, constant(I64, 1_000_000_000)), nanoseconds)

    def poll_while(self, b: llir.IRBuilder, fn: llir.Function, condition, nanoseconds: llir.Value, name: str,
                   yields: llir.Value):
        """Spin (mutex not held) while `condition(b)` is true, for at most `nanoseconds`, looking at
        the clock every PAUSES_PER_CLOCK pauses; where `yields` (an i1) is true, also yield the CPU
        to any thread queued on it at each look from YIELD_AFTER_NS on."""
        start = self.now(b)
        deadline, yield_from = b.add(start, nanoseconds), b.add(start, constant(I64, YIELD_AFTER_NS))
        pre = b.block
        check = fn.append_basic_block(f"{name}.poll")
        spin = fn.append_basic_block(f"{name}.pause")
        tick = fn.append_basic_block(f"{name}.tick")
        after = fn.append_basic_block(f"{name}.polled")
        b.branch(check)
        b.position_at_end(check)
        pauses = b.phi(I64)
        pauses.add_incoming(ZERO, pre)
        b.cbranch(condition(b), spin, after)
        b.position_at_end(spin)
        self.pause(b)
        more = b.add(pauses, ONE)
        pauses.add_incoming(more, spin)
        b.cbranch(b.icmp_unsigned("==", b.and_(more, constant(I64, PAUSES_PER_CLOCK - 1)), ZERO), tick, check)
        b.position_at_end(tick)
        now = self.now(b)
        with b.if_then(b.and_(b.icmp_signed(">=", now, yield_from), yields)):
            self.call(b, "yield")
        pauses.add_incoming(more, b.block)
        b.cbranch(b.icmp_signed("<", now, deadline), check, after)
        b.position_at_end(after)

    def claim(self) -> llir.Function:
        """claim(generation, body, ctx, count, grain, parts): run blocks of that loop (read under the
        mutex with its generation) while its ticket has some left; the thread that finishes the last
        iteration wakes the caller.  The range is `parts` shares of whole blocks, and the k-th block
        claimed is the next of share k mod parts (`block_start`)."""
        fn = llir.Function(self.module, CLAIM_TYPE, name="looptool_pool.claim")
        fn.linkage = "internal"
        generation, body, ctx, count, grain, parts = fn.args
        b = llir.IRBuilder(fn.append_basic_block("entry"))
        loop, take, run, done = (fn.append_basic_block(n) for n in ("loop", "take", "run", "done"))
        b.branch(loop)
        b.position_at_end(loop)
        ticket = b.load_atomic(self.word["ticket"], "monotonic", 8, typ=I64)
        claimed = b.and_(ticket, constant(I64, TICKET_MASK))
        blocks = b.udiv(b.add(count, b.sub(grain, ONE)), grain)
        ours = b.icmp_unsigned("==", b.lshr(ticket, constant(I64, TICKET_BITS)), generation)
        b.cbranch(b.and_(ours, b.icmp_unsigned("<", claimed, blocks)), take, done)
        b.position_at_end(take)
        swapped = b.cmpxchg(self.word["ticket"], ticket, b.add(ticket, ONE), "acq_rel", "monotonic")
        b.cbranch(b.extract_value(swapped, 1), run, loop)
        b.position_at_end(run)
        start = b.mul(block_start(b, claimed, blocks, parts), grain)
        end = b.add(start, grain)
        end = b.select(b.icmp_signed("<", end, count), end, count)
        b.call(TypedCallee(body, BODY_TYPE), [ctx, start, end])
        size = b.sub(end, start)
        before = b.atomic_rmw("sub", self.word["remaining"], size, "acq_rel")
        with b.if_then(b.icmp_signed("==", before, size)):
            self.call(b, "lock", self.sync["mutex"])
            self.call(b, "signal", self.sync["done"])
            self.call(b, "unlock", self.sync["mutex"])
        b.branch(loop)
        b.position_at_end(done)
        b.ret_void()
        return fn

    def count_cpus(self) -> llir.Function:
        """count_cpus(): the CPUs this process may run on (its affinity mask; 1 if unreadable)."""
        fn = llir.Function(self.module, llir.FunctionType(I64, []), name="looptool_pool.count_cpus")
        fn.linkage = "internal"
        b = llir.IRBuilder(fn.append_basic_block("entry"))
        mask = b.alloca(llir.ArrayType(I64, CPU_SET_BYTES // 8), name="mask")
        read = self.call(b, "getaffinity", constant(I32, 0), constant(I64, CPU_SET_BYTES), mask)
        with b.if_then(b.icmp_signed("!=", read, constant(I32, 0))):
            b.ret(ONE)
        popcount = self.extern("llvm.ctpop.i64", I64, [I64])
        total = ZERO
        for word in range(CPU_SET_BYTES // 8):
            bits = b.load(b.gep(mask, [ZERO, constant(I32, word)]), typ=I64)
            total = b.add(total, b.call(popcount, [bits]))
        b.ret(total)
        return fn

    def leave_cpu(self) -> llir.Function:
        """leave_cpu(cpu): if this thread runs on `cpu`, move to another CPU it may run on (its
        affinity mask without `cpu`, then the mask restored: the kernel places it, on an idle CPU
        if there is one).  A worker woken onto its caller's CPU (the kernel does that when it finds
        no idle CPU at once) would otherwise share it with the caller for the whole call."""
        fn = llir.Function(self.module, llir.FunctionType(VOID, [I64]), name="looptool_pool.leave_cpu")
        fn.linkage = "internal"
        cpu = fn.args[0]
        b = llir.IRBuilder(fn.append_basic_block("entry"))
        mask_type = llir.ArrayType(I64, CPU_SET_BYTES // 8)
        mask, others = b.alloca(mask_type, name="mask"), b.alloca(mask_type, name="others")
        size = constant(I64, CPU_SET_BYTES)
        here = b.sext(self.call(b, "getcpu"), I64)
        shared = b.and_(b.icmp_unsigned("==", here, cpu), b.icmp_unsigned("<", cpu, constant(I64, 8 * CPU_SET_BYTES)))
        with b.if_then(shared):
            read = self.call(b, "getaffinity", constant(I32, 0), size, mask)
            with b.if_then(b.icmp_signed("==", read, constant(I32, 0))):
                b.store(b.load(mask, typ=mask_type), others)
                word = b.gep(others, [ZERO, b.lshr(cpu, constant(I64, 6))])
                bit = b.shl(ONE, b.and_(cpu, constant(I64, 63)))
                b.store(b.and_(b.load(word, typ=I64), b.not_(bit)), word)
                moved = self.call(b, "setaffinity", constant(I32, 0), size, others)
                with b.if_then(b.icmp_signed("==", moved, constant(I32, 0))):
                    self.call(b, "setaffinity", constant(I32, 0), size, mask)
        b.ret_void()
        return fn

    def worker(self, claim: llir.Function, leave_cpu: llir.Function) -> llir.Function:
        """Poll, then sleep, until a new generation is posted; claim blocks of it if this worker
        takes part; repeat.  A worker left out of a loop (a loop on fewer threads than the pool
        has) is likely left out of the next one too: it sleeps at once instead of polling."""
        fn = llir.Function(self.module, llir.FunctionType(PTR, [PTR]), name="looptool_pool.worker")
        fn.linkage = "internal"
        b = llir.IRBuilder(fn.append_basic_block("entry"))
        packed = b.ptrtoint(fn.args[0], I64)
        index = b.and_(packed, constant(I64, (1 << INDEX_BITS) - 1))
        seen, poll = b.alloca(I64, name="seen"), b.alloca(I64, name="poll")
        b.store(b.lshr(packed, constant(I64, INDEX_BITS)), seen)
        b.store(constant(I64, WORKER_POLL_NS), poll)
        loop = fn.append_basic_block("loop")
        b.branch(loop)
        b.position_at_end(loop)
        poll_ns = b.load(poll, typ=I64)
        self.poll_while(b, fn, lambda b: b.icmp_unsigned("==", self.get_atomic(b, "generation"),
                                                          b.load(seen, typ=I64)), poll_ns, "job",
                        b.icmp_signed(">=", poll_ns, constant(I64, WORKER_POLL_SPARE_NS)))
        self.call(b, "lock", self.sync["mutex"])
        self.wait_while(b, fn, lambda b: b.icmp_unsigned("==", self.get(b, "generation"), b.load(seen, typ=I64)),
                        "work", "job")
        job = [self.get(b, name) for name in ("generation", "body", "ctx", "count", "grain", "threads")]
        b.store(job[0], seen)
        takes_part = b.icmp_unsigned("<", index, self.get(b, "threads"))
        caller_cpu = self.get(b, "caller_cpu")
        b.store(b.select(takes_part, self.get(b, "poll"), ZERO), poll)
        self.call(b, "unlock", self.sync["mutex"])
        with b.if_then(takes_part):
            b.call(leave_cpu, [caller_cpu])
            b.call(claim, job)
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
                b.store(constant(var.value_type, None), var)
            for name in ("workers", "remaining", "cpus"):
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
        generation = b.shl(self.get(b, "generation"), constant(I64, INDEX_BITS))
        argument = b.inttoptr(b.or_(generation, index), PTR)
        failed = self.call(b, "create", tid, constant(PTR, None), worker, argument)
        started = fn.append_basic_block("started")
        b.cbranch(b.icmp_signed("==", failed, constant(I32, 0)), started, done)
        b.position_at_end(started)
        self.call(b, "detach", b.load(tid, typ=I64))
        b.store(index, self.word["workers"])
        b.branch(check)
        b.position_at_end(done)
        b.ret(self.get(b, "workers"))
        return fn

    def worker_poll(self, b: llir.IRBuilder, threads: llir.Value, count_cpus: llir.Function) -> llir.Value:
        """How long workers poll after a loop on `threads` threads (mutex held; the process's CPUs
        are counted on its first loop)."""
        with b.if_then(b.icmp_unsigned("==", self.get(b, "cpus"), ZERO)):
            b.store(b.call(count_cpus, []), self.word["cpus"])
        spare = b.icmp_signed("<=", b.mul(threads, constant(I64, 2)), self.get(b, "cpus"))
        return b.select(spare, constant(I64, WORKER_POLL_SPARE_NS), constant(I64, WORKER_POLL_NS))

    def entry(self, grow: llir.Function, reset_after_fork: llir.Function, claim: llir.Function,
              count_cpus: llir.Function) -> llir.Function:
        """`looptool_parallel_for`: post the loop, claim blocks of it, wait until every block is done."""
        fn = llir.Function(self.module, ENTRY_TYPE, name=ENTRY)
        body, ctx, count, threads = fn.args
        b = llir.IRBuilder(fn.append_basic_block("entry"))
        serial, pooled = fn.append_basic_block("serial"), fn.append_basic_block("pooled")
        alone = b.or_(b.icmp_signed("<=", threads, ONE), b.icmp_signed("<=", count, ONE))
        alone = b.or_(alone, b.icmp_signed(">=", count, constant(I64, 1 << (TICKET_BITS - 1))))
        claimed = fn.append_basic_block("claim")
        b.cbranch(alone, serial, claimed)
        b.position_at_end(claimed)
        b.call(reset_after_fork, [])
        busy = self.call(b, "trylock", self.sync["busy"])
        b.cbranch(b.icmp_signed("!=", busy, constant(I32, 0)), serial, pooled)

        b.position_at_end(serial)
        b.call(TypedCallee(body, BODY_TYPE), [ctx, ZERO, count])
        b.ret_void()

        b.position_at_end(pooled)
        self.call(b, "lock", self.sync["mutex"])
        workers = b.call(grow, [b.sub(threads, ONE)])
        available = b.add(workers, ONE)
        parts = b.select(b.icmp_signed("<", available, threads), available, threads)
        grain = b.sdiv(count, b.mul(parts, constant(I64, CHUNKS_PER_THREAD)))
        grain = b.select(b.icmp_signed("<", grain, ONE), ONE, grain)
        caller_cpu = b.sext(self.call(b, "getcpu"), I64)
        for name, value in (("count", count), ("grain", grain), ("threads", parts), ("caller_cpu", caller_cpu),
                            ("poll", self.worker_poll(b, parts, count_cpus))):
            b.store(value, self.word[name])
        b.store(body, self.pointer["body"])
        b.store(ctx, self.pointer["ctx"])
        generation = b.and_(b.add(self.get(b, "generation"), ONE), constant(I64, TICKET_MASK))
        self.put_atomic(b, "remaining", count)
        self.put_atomic(b, "ticket", b.shl(generation, constant(I64, TICKET_BITS)))
        self.put_atomic(b, "generation", generation)
        self.call(b, "broadcast", self.sync["work"])
        self.call(b, "unlock", self.sync["mutex"])
        b.call(claim, [generation, body, ctx, count, grain, parts])
        self.poll_while(b, fn, lambda b: b.icmp_unsigned("!=", self.get_atomic(b, "remaining"), ZERO),
                        constant(I64, CALLER_POLL_NS), "finish", constant(I1, 1))
        self.call(b, "lock", self.sync["mutex"])
        self.wait_while(b, fn, lambda b: b.icmp_unsigned("!=", self.get_atomic(b, "remaining"), ZERO),
                        "done", "finish")
        self.call(b, "unlock", self.sync["mutex"])
        self.call(b, "unlock", self.sync["busy"])
        b.ret_void()
        return fn
