"""Tuning throughput against the workers measuring one study: `python -m bench.tuning_scaling --device gpu` on a
multi-GPU host, `--device cpu` on a machine's cores.

For each worker count (1, 2, ... up to the GPUs present or the cores, or `--workers`; or those of `--counts`),
a fresh study of the same workload (GPU: a bfloat16 matmul; CPU: a float32 one, `--size`) runs `--trials` trials with
`tuner.tune(..., device="gpu", gpus=[0..k-1])` or `tuner.tune(..., jobs=k, threads=1)`; the report gives each
study's wall time, trials an hour, the seconds a trial takes a worker and the mean of them spent
outside the kernel's runs (drawing, checking, compiling, storing), best-so-far against wall time, and its best kernel's time, so speed-up and
quality are read together; the rate between the first and the last finished trial is given too (the
start-up of the processes weighs on a short study's wall time). Studies and the tuning database live in a temporary folder, and the kernel caches
are off (the studies draw the same schedules). `--out DIR` writes {gpu,cpu}_tuning_scaling.{json,md}.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def study_run(tensor, device: str, workers: int, trials: int, folder: Path) -> dict:
    """One study on `workers` GPUs or processes: wall seconds, trials an hour, best seconds, best-so-far
    against wall time."""
    from tuner import tune
    placement = dict(gpus=list(range(workers))) if device == "gpu" else dict(jobs=workers, threads=1)
    started = time.time()
    result = tune(tensor, trials=trials, device=device, storage=f"sqlite:///{folder / f'{device}{workers}.db'}",
                  study_name=f"scaling-{workers}", progress=False, seed=0, record=False, **placement)
    wall = time.time() - started
    done = sorted((t for t in result.study.trials if t.value is not None), key=lambda t: t.datetime_complete)
    best, curve = float("inf"), []
    for trial in done:
        best = min(best, trial.value)
        curve.append([round(trial.datetime_complete.timestamp() - started, 2), best])
    overheads = [t.user_attrs["overhead_seconds"] for t in done if "overhead_seconds" in t.user_attrs]
    return {"workers": workers, "wall_s": wall, "trials": len(result.study.trials), "complete": len(done),
            "overhead_mean_s": sum(overheads) / max(len(overheads), 1),
            "trials_an_hour": len(done) / wall * 3600, "best_s": best, "best_so_far": curve,
            "cards": sorted({t.user_attrs.get("gpu", "") for t in done})}


def steady_rate(curve: list) -> float:
    """Trials an hour between the first and the last finished trial (`curve`: [seconds, best] a trial):
    the rate once every worker runs, with the start-up (processes, imports, the first compile) and the
    last trials' wait left out."""
    if len(curve) < 2 or curve[-1][0] <= curve[0][0]:
        return 0.0
    return (len(curve) - 1) / (curve[-1][0] - curve[0][0]) * 3600


def table(rows: list[dict]) -> list[str]:
    """The markdown table of the studies, each against the first (one worker)."""
    one = rows[0]
    steady = [steady_rate(r["best_so_far"]) for r in rows]
    lines = ["| workers | wall s | trials complete | trials an hour | x one worker | after the first trial: an hour "
             "| x one worker | s a trial a worker | of it outside the kernel's runs | best kernel us | x one worker's best |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r, rate in zip(rows, steady):
        lines.append(f"| {r['workers']} | {r['wall_s']:.0f} | {r['complete']}/{r['trials']} | "
                     f"{r['trials_an_hour']:.0f} | {r['trials_an_hour'] / one['trials_an_hour']:.2f} | "
                     f"{rate:.0f} | {rate / steady[0]:.2f} | {r['workers'] * r['wall_s'] / max(r['complete'], 1):.2f} | "
                     f"{r.get('overhead_mean_s', 0):.2f} | {r['best_s'] * 1e6:.1f} | {one['best_s'] / r['best_s']:.3f} |")
    return lines


def workload(device: str, size: int):
    """The tuned tensor and its description: a bfloat16 matmul on the GPU, a float32 one on the CPU."""
    import numpy as np
    import looptool as lt
    dtype = lt.bfloat16 if device == "gpu" else np.float32
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((size, size)).astype(dtype) for _ in range(2))
    sm, sk, sn = lt.symbols("m k n")
    return (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk), \
        f"{'bf16' if device == 'gpu' else 'f32'} matmul {size}^3"


def machine(device: str, workers: int) -> str:
    """The machine in words: the GPU's name, or the CPU's."""
    if device == "gpu":
        from looptool.runtime import gpu as runtime_gpu
        return f"{runtime_gpu.gpu_target().name} x{workers}"
    from bench.peers import cpu_name
    return cpu_name()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--trials", type=int, default=200,
                        help="trials a study (fewer: each process's start-up weighs on the ratios)")
    parser.add_argument("--size", type=int, default=None, help="matmul size (default: 2048 on a GPU, 256 on the CPU)")
    parser.add_argument("--workers", type=int, default=None,
                        help="most workers (default: every GPU of this host, or every core)")
    parser.add_argument("--counts", type=int, nargs="+", default=None,
                        help="the worker counts to run, the first the baseline (default: 1 to the most)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="tuning_scaling_"))
    os.environ["LOOPTOOL_TUNING_DB"] = str(folder / "tuned.db")
    os.environ["LOOPTOOL_CACHE_DIR"] = ""       # no kernel cache: each study compiles its own draws
    from bench.report import write_results
    if args.device == "gpu":
        from looptool.runtime import gpu as runtime_gpu
        count = args.workers or runtime_gpu.cupy().cuda.runtime.getDeviceCount()
    else:
        count = args.workers or os.cpu_count()
    tensor, described = workload(args.device, args.size or (2048 if args.device == "gpu" else 256))
    rows = [study_run(tensor, args.device, k, args.trials, folder) for k in args.counts or range(1, count + 1)]
    how = "gpus=[...]" if args.device == "gpu" else "jobs=k, threads=1"
    lines = [f"{machine(args.device, max(row['workers'] for row in rows))}; {described}, {args.trials} trials a study "
             f"(tuner.tune(..., device='{args.device}', {how}))"] + table(rows)
    write_results(args.out, f"{args.device}_tuning_scaling", rows, "\n".join(lines))


if __name__ == "__main__":
    main()
