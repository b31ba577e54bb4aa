"""Measuring schedules in an isolated worker process that may crash or hang without harm.

The parent sends the computation once, then one schedule (its steps) per trial.
The worker compiles it, runs it on fresh random inputs, checks the result
against the default schedule on the same inputs, then times warm-up plus
repeated runs and answers with the median.  A crash (segfault, abort) or a run
past the time limit kills only the worker: the parent reports the failure and
starts a new one.
"""
from __future__ import annotations

import multiprocessing as mp
import signal
import time
import traceback
from dataclasses import dataclass

import numpy as np

STARTUP_TIMEOUT = 300.0


class MeasureError(RuntimeError):
    """A trial whose kernel failed: crashed, timed out, or computed a wrong result."""


@dataclass
class Measurement:
    seconds: float
    compile_seconds: float
    relative_error: float
    overhead_seconds: float


def fresh_like(array: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A new array with the same shape, dtype and strides, filled with values in [0.5, 1.5)."""
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(array.shape, array.strides)) // array.itemsize
    base = rng.uniform(0.5, 1.5, size=span).astype(array.dtype)
    offset = sum((n - 1) * -s for n, s in zip(array.shape, array.strides) if s < 0) // array.itemsize
    return np.lib.stride_tricks.as_strided(base[offset:], array.shape, array.strides)


def _serve(conn, run_trial):
    """The worker's loop: answer one request per schedule until told to stop."""
    conn.send({"ready": True})
    while True:
        request = conn.recv()
        if request is None:
            return
        try:
            if request.get("inject_crash"):
                signal.raise_signal(signal.SIGSEGV)
            conn.send(run_trial(request["steps"], request.get("repeats")))
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


def _cpu_trials(node, repeats: int, seed: int):
    """Trials on the CPU: fresh random inputs each time, checked against the default schedule."""
    from looptool import ir, runtime
    from looptool.schedule import LoopTree, Schedule

    program, arrays = ir.lower(node)
    reference_kernel = runtime.Kernel(LoopTree(program), runtime.get_num_threads())
    rng = np.random.default_rng(seed)

    def run_trial(steps, trial_repeats):
        kernel = runtime.Kernel(LoopTree(program, Schedule.default(program).apply(steps)), runtime.get_num_threads())
        inputs = [fresh_like(a, rng) for a in arrays]
        expected = reference_kernel(inputs).astype(np.float64)
        error, wrong = _wrong_result(kernel(inputs), expected, program.output.dtype, "default schedule")
        if wrong:
            return wrong
        kernel(inputs)
        times = []
        for _ in range(trial_repeats or repeats):
            start = time.perf_counter()
            kernel(inputs)
            times.append(time.perf_counter() - start)
        return {"seconds": float(np.median(times)), "compile": kernel.compile_seconds, "relative_error": error}
    return run_trial


def _gpu_trials(node, repeats: int, seed: int):
    """Trials on the GPU: fixed random inputs on the device, each trial's output poisoned with NaN,
    checked against the default GPU schedule, timed with CUDA events."""
    from looptool import ir
    from looptool.runtime import gpu as runtime_gpu
    from looptool.schedule import LoopTree, Schedule

    cp = runtime_gpu.cupy()
    program, arrays = ir.lower(node)
    rng = np.random.default_rng(seed)
    inputs = [cp.asarray(fresh_like(a, rng)) for a in arrays]
    expected = cp.asnumpy(runtime_gpu.GpuKernel(runtime_gpu.default_tree(program))(inputs)).astype(np.float64)

    def run_trial(steps, trial_repeats):
        started = time.perf_counter()
        kernel = runtime_gpu.GpuKernel(LoopTree(program, Schedule.default(program).apply(steps)))
        compile_seconds = time.perf_counter() - started
        out = cp.full(expected.shape, cp.nan, dtype=program.output.dtype)
        got = cp.asnumpy(kernel(inputs, out=out))
        error, wrong = _wrong_result(got, expected, program.output.dtype, "default GPU schedule")
        if wrong:
            return wrong
        times = []
        for _ in range(trial_repeats or repeats):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            kernel(inputs, out=out)
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
        return {"seconds": float(np.median(times)), "compile": compile_seconds, "relative_error": error}
    return run_trial


class Measurer:
    """Owns one worker process for a computation; restarts it after a crash or a time-out."""

    def __init__(self, node, repeats: int = 10, timeout: float = 60.0, seed: int = 0, threads: int | None = None,
                 device: str = "cpu"):
        self.node, self.repeats, self.timeout, self.seed, self.threads = node, repeats, timeout, seed, threads
        self.device = device
        self._context = mp.get_context("spawn")
        self._process = None
        self._conn = None

    def _start(self):
        parent, child = self._context.Pipe()
        self._process = self._context.Process(target=_worker_main, args=(child, self.node, self.repeats,
                                                                         self.seed, self.threads, self.device),
                                             daemon=True)
        self._process.start()
        child.close()
        self._conn = parent
        # Start-up (spawn, imports, compiling the reference kernel) is not part of a trial's time limit.
        if not parent.poll(STARTUP_TIMEOUT):
            self.close(kill=True)
            raise MeasureError(f"worker did not start within {STARTUP_TIMEOUT:g} s (worker killed)")
        try:
            parent.recv()
        except (EOFError, ConnectionResetError):
            self._process.join(5)
            code = self._process.exitcode
            self.close(kill=True)
            raise MeasureError(f"worker crashed while starting (exit code {code})") from None

    def measure(self, steps, inject_crash: bool = False) -> Measurement:
        """Compile, check and time one schedule; raise MeasureError when the trial must fail."""
        if self._process is None or not self._process.is_alive():
            self._start()
        hop = time.perf_counter()
        self._conn.send({"steps": [list(s) for s in steps], "inject_crash": inject_crash})
        if not self._conn.poll(self.timeout):
            self.close(kill=True)
            raise MeasureError(f"timed out after {self.timeout:g} s (worker killed)")
        try:
            reply = self._conn.recv()
        except (EOFError, ConnectionResetError):
            self._process.join(5)
            code = self._process.exitcode
            self.close(kill=True)
            raise MeasureError(f"worker crashed (exit code {code})") from None
        if "error" in reply:
            raise MeasureError(reply["error"])
        overhead = time.perf_counter() - hop - reply["seconds"] * (self.repeats + 2)
        return Measurement(reply["seconds"], reply["compile"], reply["relative_error"], max(overhead, 0.0))

    def close(self, kill: bool = False):
        """Stop the worker (politely unless `kill`)."""
        if self._process is None:
            return
        if not kill and self._process.is_alive():
            try:
                self._conn.send(None)
                self._process.join(5)
            except (BrokenPipeError, OSError):
                pass
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._process = None
        self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _worker_main(conn, node, repeats, seed, threads, device):
    import looptool
    if threads:
        looptool.set_num_threads(threads)
    _serve(conn, (_gpu_trials if device == "gpu" else _cpu_trials)(node, repeats, seed))
