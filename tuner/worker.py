"""Measuring schedules in an isolated worker process that may crash or hang without harm.

The parent sends the computation once, then one schedule (its steps) per trial.
The worker compiles it (or loads the object code a compile process made while
earlier schedules were measured: `Measurer.prefetch`), runs it on one of a few
random input sets made at start-up, checks the result against the default
schedule's on the same inputs (computed once per set), then times it.  A crash
(segfault, abort) or a run past the time limit kills only the worker: the parent
reports the failure and starts a new one.

On a CPU a schedule is timed side by side with a yardstick, the automatic schedule
compiled once at start-up: each round runs the yardstick twice, then the schedule twice,
and the trial's time is the median of the schedule's time over the yardstick's in each
round, in the slower of two call orders (each right after the other, each right after
itself), times one calibrated yardstick time kept for the whole study.  A shared machine's speed drifts by 10-30 %
over seconds; both kernels of a pair meet the same drift, so it cancels (a trial's
spread fell from 18 % to 2-5 % of its time: docs/tuning.md).

A program with dynamic dims is measured at several sizes (`measured_sizes`: the sizes
named, else `DEFAULT_SIZES`): each is checked and timed against the yardstick at that
size, and the trial's ratio is the geometric mean of the sizes' ratios; the yardstick's
calibrated time is the geometric mean of its seconds per row (seconds over the product of
the dynamic sizes) at each size. On a GPU (no yardstick) a trial's seconds are the geometric mean of its
seconds per row at each size.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import math
import multiprocessing as mp
import numbers
import multiprocessing.connection as mp_connection
import os
import signal
import time
import traceback
from dataclasses import dataclass

import numpy as np

STARTS_BEFORE_GIVING_UP = 3
STARTUP_TIMEOUT = 300.0
INPUT_SETS = 2          # random input sets per worker, used in turn by its trials
CALIBRATION_SECONDS = 0.5  # the yardstick is timed at start-up in rounds of CALIBRATION_RUNS runs for this
CALIBRATION_ROUNDS = 5     # long, and at least this many rounds
CALIBRATION_RUNS = 3
GPU_CALLS = 5              # a GPU trial's kernels launched back to back between two events: the host's
                           # cost of a launch hides behind the kernels, as in a model's stream of them;
GPU_SLOW_SECONDS = 0.01    # one launch each for kernels whose checked run took longer
# the sizes a dynamic dim is measured at when none are named (each raised to the dim's minimum): small,
# the scheduler's representative size (ir.REPRESENTATIVE_SIZE), large
DEFAULT_SIZES = (16, 256, 2048)


class MeasureError(RuntimeError):
    """A trial whose kernel failed: crashed, timed out, or computed a wrong result."""


class WorkerLost(MeasureError):
    """The measuring worker failed to start `STARTS_BEFORE_GIVING_UP` times in a row (its GPU gone, say):
    this process stops measuring, the study goes on in the others."""


@dataclass
class Measurement:
    """A measured schedule: seconds per run, seconds its kernel took to compile, its error against
    the reference, the wall seconds of all kernel runs (check, warm-up, timed, the yardstick's), and
    on a CPU its time over the yardstick's (`seconds` is that ratio times the measurer's
    `yardstick_seconds`; a study rescales it to its stored one: `tuner.study.study_seconds`)."""

    seconds: float
    compile_seconds: float
    relative_error: float
    running_seconds: float
    yardstick_ratio: float | None = None
    gpu: str | None = None                          # the GPU that ran it (name and PCI bus id)
    sizes: list[dict[str, int]] | None = None       # dynamic programs: the sizes run, read from the inputs
    size_ratios: list[float] | None = None         # and the ratio to the yardstick at each


def fresh_like(array: np.ndarray, rng: np.random.Generator, rows: int | None = None) -> np.ndarray:
    """A new array with the same shape (or `rows` for its first axis), dtype and strides, filled with
    values in [0.5, 1.5)."""
    shape = array.shape if rows is None else (rows,) + array.shape[1:]
    return _fresh(shape, tuple(s // array.itemsize for s in array.strides), array.dtype, rng)


def fresh_input(buffer, rng: np.random.Generator) -> np.ndarray:
    """A new host array laid out as a program's input `buffer` says (its shape, strides and dtype: a view
    the GPU runtime makes, such as split-k's parts of k, included), filled with values in [0.5, 1.5)."""
    from looptool.frontend.dtypes import as_dtype
    return _fresh(buffer.shape, buffer.strides, as_dtype(buffer.dtype, buffer.name), rng)


def _fresh(shape, strides, dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(shape, strides))
    base = rng.uniform(0.5, 1.5, size=span).astype(dtype)
    offset = sum((n - 1) * -s for n, s in zip(shape, strides) if s < 0)
    return np.lib.stride_tricks.as_strided(base[offset:], shape, tuple(s * dtype.itemsize for s in strides))


def measured_sizes(program, sizes: dict | None) -> list[dict[str, int]]:
    """The sizes a program's dynamic dims are measured at, one dict (dim -> size) per point: `sizes`
    maps every dynamic dim to a list of sizes (lists of one length, taken together; a single size holds
    the dim there at every point), None gives `DEFAULT_SIZES` raised to each dim's minimum. A static
    program has one point, {}. Sizes for a program without dynamic dims, for a dim it does not have,
    or below a dim's minimum are refused (ValueError)."""
    minimum = dict(program.dynamic)
    if not minimum:
        if sizes:
            raise ValueError(f"sizes {sizes} given, but the workload has no dynamic dim (make one with "
                             f"lt.symbols(name, dynamic=True))")
        return [{}]
    if sizes is None:
        lists = {dim: sorted({max(size, low) for size in DEFAULT_SIZES}) for dim, low in minimum.items()}
    else:
        if set(sizes) != set(minimum):
            raise ValueError(f"sizes name dims {sorted(sizes)}; the workload's dynamic dims are {sorted(minimum)}: "
                             f"name each of them")
        lists = {dim: [values] if isinstance(values, numbers.Integral) else list(values)
                 for dim, values in sizes.items()}
    count = max(len(values) for values in lists.values())
    if any(len(values) not in (1, count) for values in lists.values()):
        counts = ", ".join(f"'{dim}' has {len(values)}" for dim, values in lists.items())
        raise ValueError(f"sizes of the dynamic dims are taken together, so each needs as many (or one): {counts}")
    for dim, values in lists.items():
        low = [v for v in values if not isinstance(v, numbers.Integral) or v < minimum[dim]]
        if low:
            raise ValueError(f"size {low[0]!r} of dynamic dim '{dim}' cannot be measured: it takes whole sizes "
                             f"from {minimum[dim]} up")
    return [{dim: int(values[i if len(values) > 1 else 0]) for dim, values in lists.items()} for i in range(count)]


def inputs_at(program, arrays: list[np.ndarray], point: dict[str, int], rng) -> list[np.ndarray]:
    """Fresh inputs like `arrays` (the program's example inputs) with each dynamic dim at its size in
    `point` (a dynamic dim is the first axis of every input that has it)."""
    return [fresh_like(a, rng, point.get(buf.dims[0]) if buf.dims else None)
            for buf, a in zip(program.inputs, arrays)]


def point_of(program, inputs: list[np.ndarray]) -> dict[str, int]:
    """The sizes of the dynamic dims in a call on these inputs."""
    return {buf.dims[0]: a.shape[0] for buf, a in zip(program.inputs, inputs)
            if buf.dims and buf.dims[0] in dict(program.dynamic)}


def _serve(conn, run_trial, yardstick_seconds: float | None):
    """The worker's loop: say it is ready (with the yardstick's calibrated seconds, None on a GPU), then
    answer one request per schedule until told to stop."""
    conn.send({"ready": True, "yardstick_seconds": yardstick_seconds})
    while True:
        request = conn.recv()
        if request is None:
            return
        try:
            if request.get("inject_crash"):
                signal.raise_signal(signal.SIGSEGV)
            conn.send(run_trial(request))
        except Exception:
            conn.send({"error": traceback.format_exc(limit=3)})


def _wrong_result(got: np.ndarray, expected: np.ndarray, dtype: str, reference: str) -> tuple[float, dict | None]:
    """(relative error, an error reply where it is too large; unwritten NaN elements count as wrong)."""
    from looptool.frontend.dtypes import SCHEDULE_TOLERANCE
    scale = max(float(np.abs(expected).max()), 1e-30)
    error = float(np.nan_to_num(np.abs(got - expected), nan=np.inf).max() / scale)
    if error <= SCHEDULE_TOLERANCE[dtype]:
        return error, None
    return error, {"error": f"wrong result: relative error {error:.3g} against the {reference}"}


def lowered(node, device: str = "cpu"):
    """(program, input arrays) of `node` as the runtime of `device` lowers them: the CPU computes costly
    values that reductions re-read once, in stages of their own (`ir.lower`'s `separate_costly`); the
    GPU inlines them, and flattens a pointwise program's rows (`runtime.gpu.lowered_for`)."""
    from looptool import runtime
    return runtime.lower_on_host(node) if device == "cpu" else runtime.gpu.lowered_for(node)


def _cpu_trials(node, repeats: int, seed: int, calibrate: bool, sizes: dict | None = None):
    """Trials on the CPU: random input sets in turn, each checked against the default schedule's
    result on it (computed once per set), each timed against the yardstick (the module docstring), at
    every point of `measured_sizes`. Returns the trial function and the yardstick's calibrated
    seconds (None unless `calibrate`)."""
    from looptool import autoschedule, runtime
    from looptool.analysis.target import host
    from looptool.schedule import LoopTree, Schedule

    program, arrays = lowered(node)
    points = measured_sizes(program, sizes)
    threads = runtime.get_num_threads()
    reference_kernel = runtime.Kernel(LoopTree(program), threads)
    yardstick = runtime.Kernel(autoschedule.auto_tree(program, host().with_cores(threads)), threads)
    rng = np.random.default_rng(seed)
    # per input set, per point: (inputs, the default schedule's result on them)
    input_sets = [[inputs_at(program, arrays, point, rng) for point in points] for _ in range(INPUT_SETS)]
    cases = [[(inputs, reference_kernel(inputs).astype(np.float64)) for inputs in each] for each in input_sets]
    sets = itertools.cycle(cases)

    def run_trial(request):
        tree = LoopTree(program, Schedule.default(program).apply(request["steps"]))
        kernel = runtime.Kernel(tree, threads, request.get("compiled"))
        ratios, running, worst, ran = [], 0.0, 0.0, []
        for inputs, expected in next(sets):
            start = time.perf_counter()
            got = kernel(inputs)
            running += time.perf_counter() - start
            error, wrong = _wrong_result(got, expected, program.output.dtype, "default schedule")
            if wrong:
                return wrong
            with stopped(request.get("stop", ())):
                ratio, spent = _paired_runs(kernel, yardstick, inputs, request.get("repeats") or repeats)
            ratios.append(ratio)
            running, worst = running + spent, max(worst, error)
            ran.append(point_of(program, inputs))
        reply = {"ratio": _geometric_mean(ratios), "compile": kernel.compile_seconds, "relative_error": worst,
                 "running": running}
        return dict(reply, sizes=ran, size_ratios=ratios) if program.dynamic else reply
    seconds = _calibrate_at(yardstick, [inputs for inputs, _ in cases[0]], points) if calibrate else None
    return run_trial, seconds


def _geometric_mean(values: list[float]) -> float:
    return float(np.exp(np.mean(np.log(values))))


def _calibrate_at(yardstick, input_sets: list[list[np.ndarray]], points: list[dict[str, int]]) -> float:
    """The yardstick's calibrated seconds: at one point (a static program) `_calibrate`'s; at several,
    the geometric mean of its seconds per row (over the product of the dynamic sizes) at each, the
    calibration time shared among them."""
    if len(points) == 1 and not points[0]:
        return _calibrate(yardstick, input_sets[0])
    share = CALIBRATION_SECONDS / len(points)
    return _geometric_mean([_calibrate(yardstick, inputs, share) / float(np.prod(list(point.values())))
                            for inputs, point in zip(input_sets, points)])


def _timed(kernel, inputs) -> float:
    start = time.perf_counter()
    kernel(inputs)
    return time.perf_counter() - start


def _paired_runs(kernel, yardstick, inputs, repeats: int) -> tuple[float, float]:
    """A warm-up run of each, then `repeats` rounds of the yardstick twice and the kernel twice: (the
    kernel's time over the yardstick's in the slower of two call orders, each the median over the
    rounds: each kernel right after itself (the second runs), and each right after the other (the
    first runs: the yardstick's follows the kernel's last); wall seconds of all these runs). A kernel
    whose speed depends on what ran before it, or that slows the yardstick run after it, is so never
    kept for a speed it has in one order only (MetaSchedule kept one that ran at 61-88 GFLOP/s as it
    was called: issue 29)."""
    spent = _timed(yardstick, inputs) + _timed(kernel, inputs)
    after_other, after_self = [], []
    for _ in range(repeats):
        times = [_timed(fn, inputs) for fn in (yardstick, yardstick, kernel, kernel)]
        after_other.append(times[2] / times[0])
        after_self.append(times[3] / times[1])
        spent += sum(times)
    return max(float(np.median(after_other)), float(np.median(after_self))), spent


def _calibrate(yardstick, inputs, seconds: float = CALIBRATION_SECONDS) -> float:
    """The yardstick's seconds: the fastest median of CALIBRATION_RUNS runs over `seconds` (load
    only slows a kernel; a memory-bound kernel's medians of a few runs moved by up to 1.9x from one
    moment to the next, and a fraction of a second of them finds the fast ones: docs/tuning.md)."""
    yardstick(inputs)
    medians, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(medians) < CALIBRATION_ROUNDS:
        medians.append(float(np.median([_timed(yardstick, inputs) for _ in range(CALIBRATION_RUNS)])))
    return min(medians)


@contextlib.contextmanager
def stopped(pids):
    """Stop these processes (the compile processes) while the block runs, so that they do not share a
    core, the caches or the memory bandwidth with a kernel being timed; they go on afterwards."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        resume(pids)


def resume(pids):
    """Let stopped processes go on (those that are gone are skipped)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def _gpu_trials(node, repeats: int, seed: int, sizes: dict | None = None):
    """Trials on the GPU: fixed random inputs on the device at each point of `measured_sizes` (one for a
    static program), each trial's output poisoned with NaN, checked against the default GPU schedule,
    timed with CUDA events around GPU_CALLS launches (one where the checked run took over GPU_SLOW_SECONDS;
    steady enough: no yardstick); a trial's seconds are the geometric mean over the points of its seconds
    per row (over the product of the dynamic sizes: 1 for a static program). Returns the trial function and
    None."""
    from looptool import ir
    from looptool.autoschedule import gpu_rules
    from looptool.runtime import gpu as runtime_gpu
    from looptool.schedule import LoopTree, Schedule

    cp = runtime_gpu.cupy()
    card = f"{runtime_gpu.gpu_target().name} {cp.cuda.Device().pci_bus_id}"
    program, _ = lowered(node, "gpu")
    rng = np.random.default_rng(seed)
    reference = runtime_gpu.GpuKernel(gpu_rules.default_gpu_tree(program))
    cases = []                                   # (point, inputs, the default schedule's result on them)
    for point in measured_sizes(program, sizes):
        fixed = ir.with_fixed_sizes(program, point) if point else program
        inputs = [runtime_gpu.as_device(fresh_input(buffer, rng)) for buffer in fixed.inputs]
        cases.append((point, inputs, runtime_gpu.to_host(reference(inputs)).astype(np.float64)))

    def run_trial(request):
        started = time.perf_counter()
        kernel = runtime_gpu.GpuKernel(LoopTree(program, Schedule.default(program).apply(request["steps"])))
        compile_seconds = time.perf_counter() - started
        per_row, running, worst = [], 0.0, 0.0
        for point, inputs, expected in cases:
            out = runtime_gpu.poisoned_empty(expected.shape, program.output.dtype)
            ran = time.perf_counter()
            got = runtime_gpu.to_host(kernel(inputs, out=out)).astype(np.float64)
            ran = time.perf_counter() - ran
            error, wrong = _wrong_result(got, expected, program.output.dtype, "default GPU schedule")
            if wrong:
                return wrong
            times = _gpu_times(cp, kernel.prepare(inputs, out), out, GPU_CALLS if ran < GPU_SLOW_SECONDS else 1,
                               request.get("repeats") or repeats)
            per_row.append(float(np.median(times)) / math.prod(point.values()))
            running, worst = running + ran + sum(times), max(worst, error)
        reply = {"seconds": _geometric_mean(per_row), "compile": compile_seconds, "relative_error": worst,
                 "running": running, "gpu": card}
        return dict(reply, sizes=[point for point, _, _ in cases]) if program.dynamic else reply
    return run_trial, None


def _gpu_times(cp, launch, out, calls: int, repeats: int) -> list[float]:
    """Seconds a call of `launch` (inputs checked once: the kernels' own time), in `repeats` rounds of
    `calls` launches between two CUDA events."""
    times = []
    for _ in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(calls):
            launch(out)
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3 / calls)
    return times


def compile_processes() -> int:
    """Compile processes per measurer: one per core this process may run on. They run only while the
    measuring worker waits (they are stopped while it times a kernel), so they take no core from it."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class Compiler:
    """Processes that compile CPU schedules to object code while the measuring worker times others;
    schedules go to them in turn, each compiles its share in the order submitted. Results come back
    over pipes read only here, when a result is asked for: no thread waits on them, so a compile
    process killed in the middle of sending leaves nothing blocked (a process pool's reading thread
    waited forever then, and the program could not exit)."""

    def __init__(self, node, threads: int | None):
        spawn = mp.get_context("spawn")
        self._lanes = []                       # (process, connection) of each compile process
        for _ in range(compile_processes()):
            conn, child = spawn.Pipe()
            process = spawn.Process(target=_compiler_main, args=(child, node, threads), daemon=True)
            process.start()
            child.close()
            self._lanes.append((process, conn))
        self._turn = 0
        self._pending: list[str] = []          # keys submitted and not yet answered, in order
        self._done: dict = {}                  # key -> object code, or None where it did not compile

    def submit(self, steps):
        """Start compiling a schedule (its steps) unless it is already under way."""
        key = _steps_key(steps)
        self._drain()               # the processes never wait on a full pipe
        if not self._lanes or key in self._pending or key in self._done:
            return
        self._lanes[self._turn % len(self._lanes)][1].send((key, [list(s) for s in steps]))
        self._turn += 1
        self._pending.append(key)

    def ready(self, steps) -> bool:
        """Whether a submitted schedule has finished compiling."""
        self._drain()
        return _steps_key(steps) in self._done

    def take(self, steps, timeout: float):
        """The object code of a submitted schedule (a `runtime.KernelObject`), waiting for it at most
        `timeout` seconds (past it, the compile processes are killed and MeasureError raised); None
        when it was not submitted or did not compile here (the measuring worker then compiles it, and
        reports its error)."""
        key = _steps_key(steps)
        deadline = time.monotonic() + timeout
        while key in self._pending:
            if not self._receive(deadline - time.monotonic()) and time.monotonic() >= deadline:
                self.close(kill=True)
                raise MeasureError(f"compiling timed out after {timeout:g} s (compile process killed)")
        return self._done.pop(key, None)

    def _drain(self):
        """Take every answer already sent."""
        while self._receive(0):
            pass

    def _receive(self, wait: float) -> bool:
        """Take the next answer if one comes within `wait` seconds (0: only those already sent); False
        when none came. A compile process that died closes them all, their schedules left to the worker."""
        if not self._lanes or not self._pending:
            return False
        try:
            sent = mp_connection.wait([conn for _, conn in self._lanes], max(wait, 0))
            if not sent:
                if all(process.is_alive() for process, _ in self._lanes):
                    return False
                raise EOFError
            key, code = sent[0].recv()
        except (EOFError, OSError):
            self.close(kill=True)
            return True
        self._pending.remove(key)
        self._done[key] = code
        return True

    @property
    def pids(self) -> list[int]:
        """The compile processes: the measuring worker stops them while it times a kernel (`stopped`)."""
        return [process.pid for process, _ in self._lanes]

    @property
    def closed(self) -> bool:
        """Whether the processes were stopped (killed at a time limit, or one died): new ones are needed."""
        return not self._lanes

    def close(self, kill: bool = False):
        """Stop the compile processes: at once when `kill`, else after the schedule each is compiling."""
        for process, conn in self._lanes:
            _stop(process, conn, kill)
            conn.close()
        self._lanes = []
        self._pending.clear()
        self._done.clear()


def _stop(process, conn, kill: bool):
    """Stop a child process: asked to (None on its pipe) and given 5 s unless `kill`, then killed."""
    if not kill and process.is_alive():
        with contextlib.suppress(OSError):
            conn.send(None)
            process.join(5)
    if process.is_alive():
        process.kill()
        process.join(5)


def _steps_key(steps) -> str:
    return json.dumps([list(s) for s in steps])


def _compiler_main(conn, node, threads):
    """The compile process: compile each (key, steps) received, in order, and answer (key, object
    code), or (key, None) where it does not compile; stop at None or when the parent is gone."""
    import looptool
    from looptool import runtime
    from looptool.schedule import LoopTree, Schedule
    if threads:
        looptool.set_num_threads(threads)
    program = lowered(node)[0]
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        key, steps = request
        try:
            tree = LoopTree(program, Schedule.default(program).apply(steps))
            code = runtime.compile_object(tree, runtime.get_num_threads())
        except Exception:           # a compile error: the worker compiles it again and reports it
            code = None
        conn.send((key, code))


class Measurer:
    """Owns one worker process for a computation (on the GPU numbered `gpu` where one is given: the
    worker sees only that one); restarts it after a crash or a time-out.  On the
    CPU, schedules given to `prefetch` compile in other processes (`Compiler`) while others are measured,
    and times are the yardstick ratio times `yardstick_seconds`: the first worker's calibration unless
    set before (a study keeps one for all its workers and resumptions)."""

    def __init__(self, node, repeats: int = 10, timeout: float = 60.0, seed: int = 0, threads: int | None = None,
                 device: str = "cpu", yardstick_seconds: float | None = None, sizes: dict | None = None,
                 gpu: int | None = None):
        self.node, self.repeats, self.timeout, self.seed, self.threads = node, repeats, timeout, seed, threads
        self.device, self.yardstick_seconds, self.gpu = device, yardstick_seconds, gpu
        measured_sizes(lowered(node)[0], sizes)       # refused here, in the caller, rather than in the worker
        self.sizes = sizes
        self._context = mp.get_context("spawn")
        self._process = None
        self._conn = None
        self._compiler: Compiler | None = None
        self.failed_starts = 0

    def prefetch(self, schedules):
        """Compile these schedules (lists of steps) ahead, in order, in the compile process (CPU only)."""
        if self.device != "cpu":
            return
        if self._compiler is None or self._compiler.closed:
            self._compiler = Compiler(self.node, self.threads)
        for steps in schedules:
            self._compiler.submit(steps)

    def ready(self, steps) -> bool:
        """Whether a prefetched schedule has finished compiling."""
        return self._compiler is not None and self._compiler.ready(steps)

    def _start(self):
        parent, child = self._context.Pipe()
        calibrate = self.yardstick_seconds is None
        self._process = self._context.Process(target=_worker_main, args=(child, self.node, self.repeats, self.seed,
                                                                         self.threads, self.device, calibrate,
                                                                         self.sizes, self.gpu),
                                             daemon=True)
        self._process.start()
        child.close()
        self._conn = parent
        # Start-up (spawn, imports, compiling the reference kernel) is not part of a trial's time limit.
        if not parent.poll(STARTUP_TIMEOUT):
            self.close(kill=True)
            raise MeasureError(f"worker did not start within {STARTUP_TIMEOUT:g} s (worker killed)")
        try:
            ready = parent.recv()
        except (EOFError, ConnectionResetError):
            self._process.join(5)
            code = self._process.exitcode
            self.close(kill=True)
            raise MeasureError(f"worker crashed while starting (exit code {code})") from None
        if self.yardstick_seconds is None:
            self.yardstick_seconds = ready["yardstick_seconds"]

    def _start_or_give_up(self):
        """Start the worker; a `WorkerLost` once it has failed to start `STARTS_BEFORE_GIVING_UP` times in a row."""
        try:
            self._start()
        except MeasureError as err:
            self.failed_starts += 1
            if self.failed_starts >= STARTS_BEFORE_GIVING_UP:
                where = f" on GPU {self.gpu}" if self.gpu is not None else ""
                raise WorkerLost(f"{err}; the measuring worker{where} failed to start {self.failed_starts} times in "
                                 f"a row: this process stops measuring") from None
            raise
        self.failed_starts = 0

    def measure(self, steps, inject_crash: bool = False) -> Measurement:
        """Compile, check and time one schedule; raise MeasureError when the trial must fail."""
        if self._process is None or not self._process.is_alive():
            self._start_or_give_up()
        compiled = self._compiler.take(steps, self.timeout) if self._compiler else None
        pids = self._compiler.pids if self._compiler else []
        try:
            reply = self._exchange({"steps": [list(s) for s in steps], "inject_crash": inject_crash,
                                    "compiled": compiled, "stop": pids})
        finally:
            resume(pids)            # also when the worker died while they were stopped
        if "error" in reply:
            raise MeasureError(reply["error"])
        ratio = reply.get("ratio")
        seconds = reply["seconds"] if ratio is None else ratio * self.yardstick_seconds
        return Measurement(seconds, reply["compile"], reply["relative_error"], reply["running"], ratio,
                           reply.get("gpu"), reply.get("sizes"), reply.get("size_ratios"))

    def _exchange(self, request: dict) -> dict:
        """Send one request to the worker and wait for its reply (killing it past the time limit)."""
        self._conn.send(request)
        if not self._conn.poll(self.timeout):
            self.close(kill=True)
            raise MeasureError(f"timed out after {self.timeout:g} s (worker killed)")
        try:
            return self._conn.recv()
        except (EOFError, ConnectionResetError):
            self._process.join(5)
            code = self._process.exitcode
            self.close(kill=True)
            raise MeasureError(f"worker crashed (exit code {code})") from None

    def close(self, kill: bool = False):
        """Stop the worker (politely unless `kill`)."""
        if self._process is None:
            return
        _stop(self._process, self._conn, kill)
        self._process = None
        self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        if self._compiler is not None:
            self._compiler.close(kill=True)
            self._compiler = None


def _worker_main(conn, node, repeats, seed, threads, device, calibrate, sizes, gpu):
    if gpu is not None:             # before CUDA starts in this process: the one GPU it measures on
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    import looptool
    if threads:
        looptool.set_num_threads(threads)
    trials = _gpu_trials(node, repeats, seed, sizes) if device == "gpu" else \
        _cpu_trials(node, repeats, seed, calibrate, sizes)
    _serve(conn, *trials)
