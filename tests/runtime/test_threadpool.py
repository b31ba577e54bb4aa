"""The persistent thread pool behind parallel loops: chunks, thread counts, fork, concurrent callers."""
import ctypes
import os
import threading
import time

import llvmlite.binding as llvm
import numpy as np
import pytest

import looptool as lt
from looptool.codegen import threadpool as pool_code
from looptool.runtime import threadpool

BODY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


def parallel_for():
    threadpool.ensure_loaded()
    address = llvm.address_of_symbol(pool_code.ENTRY)
    return ctypes.CFUNCTYPE(None, BODY, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(address)


@pytest.mark.parametrize("count", [0, 1, 2, 7, 100])
@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_chunks_cover_the_range_once(count, threads):
    ranges, lock = [], threading.Lock()

    @BODY
    def body(ctx, start, end):
        with lock:
            ranges.append((start, end))

    parallel_for()(body, None, count, threads)
    covered = sorted(i for start, end in ranges for i in range(start, end))
    assert covered == list(range(count))
    if threads > 1 and count > 1:     # blocks claimed one by one, about CHUNKS_PER_THREAD per thread
        grain = max(1, count // (threads * pool_code.CHUNKS_PER_THREAD))
        assert sorted(ranges) == [(start, min(start + grain, count)) for start in range(0, count, grain)]
    else:
        assert ranges == [(0, count)]


def test_a_stalled_thread_leaves_the_other_blocks_to_the_rest():
    """A block that does not finish until every other block has run: with blocks handed out one by
    one, the caller runs all the others (with chunks fixed per thread it would wait for ever)."""
    count, ranges, lock, rest_done, stalls = 10, [], threading.Lock(), threading.Event(), []
    caller = threading.get_ident()

    @BODY
    def body(ctx, start, end):
        if threading.get_ident() != caller and not rest_done.is_set():
            stalls.append(rest_done.wait(timeout=30))      # False: the others waited for this block
        with lock:
            ranges.append((start, end))
            if sum(e - s for s, e in ranges) == count - 1:
                rest_done.set()

    parallel_for()(body, None, count, 2)
    assert sorted(i for start, end in ranges for i in range(start, end)) == list(range(count))
    assert all(stalls), "the caller did not take the stalled worker's share"


def test_claims_walk_each_threads_contiguous_share_in_turn():
    """With the worker held on its first block, the caller's blocks come in claim order: 0, 6, 1,
    7, ...: claim k is the next block of share k mod 2 (shares [0, 6) and [6, 11)), so two threads
    keeping pace never run neighbouring blocks at once (their output may share a cache line)."""
    count, order, lock, rest_done = 11, [], threading.Lock(), threading.Event()
    caller, held = threading.get_ident(), []

    @BODY
    def body(ctx, start, end):
        if threading.get_ident() != caller:
            held.append(start)
            rest_done.wait(timeout=30)
            return
        with lock:
            order.append(start)
            if len(order) + len(held) == count and held:
                rest_done.set()

    parallel_for()(body, None, count, 2)
    claim_order = [0, 6, 1, 7, 2, 8, 3, 9, 4, 10, 5]
    assert order == [block for block in claim_order if block not in held]
    assert sorted(order + held) == list(range(count))


@pytest.fixture
def parallel_matmul(rng):
    m, k, n = lt.symbols("m k n")
    a_np, b_np = rng.random((37, 23), dtype=np.float32), rng.random((23, 41), dtype=np.float32)
    c = (lt.Tensor(a_np).to(m, k) * lt.Tensor(b_np).to(k, n)).sum(k)
    tree = c.loop_tree().split("m", 5).parallel("m.0")
    yield c, tree, [a_np, b_np], a_np.astype(np.float64) @ b_np
    lt.set_num_threads(os.cpu_count() or 1)


@pytest.mark.parametrize("threads", [1, 2, 3, 5, 16])
def test_every_thread_count_gives_the_serial_bits(parallel_matmul, threads):
    c, tree, arrays, ref = parallel_matmul
    serial = c.numpy(c.loop_tree().split("m", 5))
    lt.set_num_threads(threads)
    out = c.numpy(tree)
    assert np.array_equal(out, serial)
    assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-5


def test_concurrent_callers_share_the_pool(parallel_matmul):
    c, tree, arrays, ref = parallel_matmul
    lt.set_num_threads(2)
    kernel = c.compile(tree)
    expected = kernel(arrays).copy()
    results = [None] * 6

    def call(i):
        results[i] = [np.array_equal(kernel(arrays), expected) for _ in range(20)]

    callers = [threading.Thread(target=call, args=(i,)) for i in range(len(results))]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert results == [[True] * 20] * len(results)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_forked_child_starts_its_own_workers(parallel_matmul):
    c, tree, arrays, ref = parallel_matmul
    lt.set_num_threads(2)
    kernel = c.compile(tree)
    expected = kernel(arrays).copy()      # the parent's workers exist now
    pid = os.fork()
    if pid == 0:
        os._exit(0 if np.array_equal(kernel(arrays), expected) else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def allowed_cpus_of_threads() -> dict[str, str]:
    """Each thread of this process: its Cpus_allowed_list from /proc."""
    allowed = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/status") as status:
            allowed[tid] = next(line.split()[1] for line in status if line.startswith("Cpus_allowed_list"))
    return allowed


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_workers_keep_the_process_cpus_after_moving_off_the_callers(parallel_matmul):
    """A worker that leaves its caller's CPU narrows its affinity only for the move: afterwards
    every thread may run on every CPU the process may."""
    c, tree, arrays, ref = parallel_matmul
    lt.set_num_threads(4)
    kernel = c.compile(tree)
    for _ in range(50):
        kernel(arrays)
    process = allowed_cpus_of_threads()[str(os.getpid())]
    for _ in range(1000):       # a worker that woke after the last block may still be moving
        if set(allowed_cpus_of_threads().values()) == {process}:
            break
        time.sleep(0.001)
    assert set(allowed_cpus_of_threads().values()) == {process}


@pytest.mark.skipif(not hasattr(os, "fork") or not hasattr(os, "sched_setaffinity"), reason="needs fork and affinity")
def test_one_allowed_cpu_still_runs_every_block(parallel_matmul):
    """With one CPU allowed a woken worker has nowhere to move (the kernel refuses the empty mask):
    it shares the CPU and the result is still the serial one."""
    c, tree, arrays, ref = parallel_matmul
    lt.set_num_threads(3)
    kernel = c.compile(tree)
    expected = kernel(arrays).copy()
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        same = all(np.array_equal(kernel(arrays), expected) for _ in range(20))
        one_cpu = len(set(allowed_cpus_of_threads().values())) == 1
        os._exit(0 if same and one_cpu else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
