"""The suite driver: build, check and time every workload × threads × {default, auto, best} schedule.

default: the plain loop tree; auto: the automatic schedule for this machine (no tuning); best: the
faster of the automatic schedule and the tuned schedule stored for this CPU in the tuning database
(`looptool tune`), when there is one."""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

import looptool as lt
import looptool.ir
from looptool.codegen.cpu import HostTarget
from looptool.runtime import tuning_db

from . import report, timing
from .workloads import Workload, select

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TOLERANCE = 1e-5
VARIANTS = ("default", "auto", "best")


@dataclass
class Row:
    """One line of the results table."""

    workload: str
    title: str
    threads: int
    variant: str                    # "default", "auto" or "best"
    status: str = "ok"              # ok, FAILED (wrong numbers or crash), skipped
    ours_ms: float | None = None
    base_ms: float | None = None
    ratio: float | None = None
    rel_err: float | None = None
    ours_rate: float | None = None  # GFLOP/s or GB/s
    base_rate: float | None = None
    unit: str = ""
    baseline_threads: int = 1
    target: float | None = None
    note: str = ""
    repeat: int = 0
    spread: float | None = None     # worst interquartile range / median of the two sides
    foreign_load: float | None = None  # cores other processes kept busy while timing
    ours_min_ms: float | None = None
    base_min_ms: float | None = None

    @property
    def misses_target(self) -> bool:
        return self.status == "ok" and self.target is not None and self.ratio is not None and self.ratio < self.target


def best_schedule(tensor, program, arrays) -> tuple[object, str]:
    """The faster of the automatic schedule and the tuning database's schedule for this workload
    (`program`, lowered from `tensor` with its `arrays`) and CPU (the automatic one alone when nothing
    is tuned), and a note saying which it is."""
    automatic = lt.auto_schedule(tensor)
    tuned = tuning_db.lookup(program, HostTarget.get().name)
    if tuned is None:
        return automatic, "automatic: no tuned schedule for this CPU"
    try:
        tuned_kernel = tensor.compile(tuned)
    except Exception as err:     # a stored schedule from an older looptool that no longer applies
        return automatic, f"automatic: the tuned schedule does not apply ({type(err).__name__}: {err})"
    auto_kernel = tensor.compile(automatic)
    auto_time, tuned_time = timing.interleaved([lambda: auto_kernel(arrays), lambda: tuned_kernel(arrays)],
                                               warmup=1, budget=1.0)
    if tuned_time.median < auto_time.median:
        return tuned, f"tuned (tuning database), {auto_time.median / tuned_time.median:.2f}x the automatic one"
    return automatic, "automatic: faster than the tuned schedule stored for this CPU"


def relative_error(ours: np.ndarray, ref: np.ndarray) -> float:
    """max |ours - ref| / max |ref| (inf on a shape mismatch or NaN)."""
    if ours.shape != ref.shape:
        return float("inf")
    err = float(np.max(np.abs(ours.astype(np.float64) - ref)) / max(np.max(np.abs(ref)), 1e-30))
    return err if np.isfinite(err) else float("inf")


def run_one(workload: Workload, inputs, ref, threads: int, variant: str, args) -> Row:
    """Compile one variant at `threads`, check it against the float64 reference and time it vs the baseline."""
    base_threads = workload.baseline_threads(threads)
    row = Row(workload.name, workload.title, threads, variant, baseline_threads=base_threads,
              target=workload.target if variant == "best" and threads in workload.target_threads else None)
    lt.set_num_threads(threads)
    tensor = workload.build(inputs)
    program, arrays = looptool.ir.lower(tensor.node)
    if variant == "best":
        schedule, row.note = best_schedule(tensor, program, arrays)
    elif variant == "auto":
        start = time.perf_counter()
        schedule = lt.auto_schedule(tensor)
        row.note = f"chosen in {time.perf_counter() - start:.2f} s"
    else:
        schedule = tensor.loop_tree()
    try:
        kernel = tensor.compile(schedule)
    except Exception as err:     # a schedule that does not apply, is illegal, or crashes the compiler
        row.status = "FAILED"
        row.note = f"{row.note}: {type(err).__name__}: {err}".lstrip(": ")
        if args.verbose:
            traceback.print_exc()
        return row
    row.rel_err = relative_error(workload.to_ref(kernel(arrays)), ref)
    if not row.rel_err < TOLERANCE:
        row.status = "FAILED"
        row.note = f"{row.note}; rel err {row.rel_err:.2e}".lstrip("; ")
        return row
    if args.settle > 0:
        timing.wait_until_quiet(args.settle)
    with threadpool_limits(base_threads, user_api="blas"), timing.ForeignLoad() as load:
        ours, base = timing.interleaved([lambda: kernel(arrays), lambda: workload.baseline(inputs)],
                                        repeat=args.repeat, warmup=args.warmup, budget=args.budget,
                                        before=timing.quiesce if args.quiesce and threads > 1 else None)
    row.repeat, row.foreign_load = len(ours.times), load.cores
    if ours.spread is not None and base.spread is not None:
        row.spread = max(ours.spread, base.spread)
    row.ours_min_ms, row.base_min_ms = ours.best * 1e3, base.best * 1e3
    row.ours_ms, row.base_ms = ours.median * 1e3, base.median * 1e3
    row.ratio = base.median / ours.median
    work, row.unit = (workload.flops, "GFLOP/s") if workload.flops else (workload.bytes, "GB/s")
    if work:
        row.ours_rate, row.base_rate = work / ours.median / 1e9, work / base.median / 1e9
    return row


def compile_time() -> dict:
    """Seconds from loop tree to callable for one 512³ matmul kernel with the automatic schedule, cold cache.

    Measured in a fresh process: there the cache is cold without lt.clear_cache(), which
    crashes when it frees more than one kernel (see `_compile_time_child`)."""
    root = HERE.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    try:
        proc = subprocess.run([sys.executable, "-c", "import bench.suite as s; s._compile_time_child()"],
                              cwd=root, env=env, capture_output=True, text=True, timeout=300)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception as err:
        return {"schedule": "the automatic schedule", "error": f"compile-time child failed: {type(err).__name__}: {err}"}


def _compile_time_child() -> None:
    """Print the compile-time JSON for `compile_time` and leave without running finalizers.

    LLVM is warmed up with a small kernel; all kernels are kept alive across lt.clear_cache():
    every kernel's execution engine frees the one shared TargetMachine when it is
    disposed, so clearing a cache of two or more kernels segfaults (looptool bug)."""
    from .workloads import matmul
    workload = matmul(512, 512, 512, target=0.7)
    source = "the automatic schedule"
    lt.set_num_threads(1)
    i, = lt.symbols("i")
    warm = (lt.Tensor(np.ones(16, np.float32)).to(i) * 2.0).compile()
    tensor = workload.build(workload.inputs(np.random.default_rng(0)))
    start = time.perf_counter()
    schedule = lt.auto_schedule(tensor)
    choose_s = time.perf_counter() - start
    kept, compile_s, total_s = [warm], [], []
    try:
        for _ in range(3):                      # best of three cold compiles: the machine is noisy
            lt.clear_cache()                    # safe: every kernel stays referenced in `kept`
            start = time.perf_counter()
            kept.append(tensor.compile(schedule))
            total_s.append(time.perf_counter() - start)
            compile_s.append(kept[-1].compile_seconds)
        info = {"schedule": source, "compile_seconds": min(compile_s), "with_legality_seconds": min(total_s),
                "all_compile_seconds": compile_s, "choose_seconds": choose_s, "target_seconds": 0.3}
    except Exception as err:
        info = {"schedule": source, "error": f"{type(err).__name__}: {err}"}
    print(json.dumps(info), flush=True)
    os._exit(0)


def parse_args(argv=None):
    """Command-line options."""
    p = argparse.ArgumentParser(prog="bench", description="looptool vs NumPy benchmark suite")
    p.add_argument("--only", metavar="NAME[,NAME]", help="workloads to run (a prefix like 'matmul' selects all matmuls)")
    p.add_argument("--repeat", type=int, help="timed rounds per row (default: as many as fit the time budget)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls of each side before timing")
    p.add_argument("--budget", type=float, default=3.0, help="seconds of timed rounds per row when --repeat is not given")
    p.add_argument("--settle", type=float, default=10.0,
                   help="before each row, wait up to this many seconds for other processes to go quiet")
    p.add_argument("--quiesce", action="store_true",
                   help="in multi-thread rows, before each timed call wait for the previous call's threads "
                        "(OpenBLAS workers spin after returning) to stop using CPU")
    p.add_argument("--threads", help="comma-separated thread counts to run (default: each workload's own)")
    p.add_argument("--variant", choices=VARIANTS, help="run only this variant")
    p.add_argument("--quick", action="store_true", help="smoke run: few repetitions, one warm-up")
    p.add_argument("--out", default=str(RESULTS), help="directory for latest.{md,json,png}")
    p.add_argument("--no-save", action="store_true", help="print the table only")
    p.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of failed compilations")
    args = p.parse_args(argv)
    if args.quick:
        args.warmup = 1
        args.repeat = args.repeat or 3
        args.settle = min(args.settle, 1.0)
    return args


def main(argv=None) -> int:
    """Run the suite; returns the exit code (1 if any row gave wrong numbers or crashed)."""
    faulthandler.enable()
    args = parse_args(argv)
    thread_filter = {int(t) for t in args.threads.split(",")} if args.threads else None
    variants = [args.variant] if args.variant else list(VARIANTS)
    rows: list[Row] = []
    start = time.time()
    for workload in select(args.only):
        inputs = workload.inputs(np.random.default_rng(0))
        ref = workload.reference(inputs)
        for threads in workload.threads:
            if thread_filter and threads not in thread_filter:
                continue
            for variant in variants:
                row = run_one(workload, inputs, ref, threads, variant, args)
                rows.append(row)
                print(report.progress_line(row), flush=True)
    compile_info = compile_time() if not args.only or "matmul" in args.only else None
    lt.set_num_threads(1)
    text = report.markdown(rows, compile_info)
    print()
    print(text)
    if not args.no_save:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "latest.md").write_text(text)
        report.write_json(out / "latest.json", rows, compile_info, args, time.time() - start)
        report.bar_chart(out / "latest.png", rows)
        print(f"\nwrote {out / 'latest.md'}, latest.json, latest.png")
    return 1 if any(r.status == "FAILED" for r in rows) else 0
