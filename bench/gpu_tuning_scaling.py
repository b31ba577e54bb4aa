"""Tuning throughput against the GPUs measuring one study: `python -m bench.gpu_tuning_scaling` on a
multi-GPU host.

For each worker count (1, 2, ... up to the GPUs present, or `--gpus`), a fresh study of the same
workload (bfloat16 matmul, `--size`) runs `--trials` trials with `tuner.tune(..., device="gpu",
gpus=[0..k-1])`; the report gives each study's wall time, trials an hour, best-so-far against wall
time, and its best kernel's time, so speed-up and quality are read together. Studies and the tuning
database live in a temporary folder, and the PTX cache is off (the studies draw the same schedules). `--out DIR` writes gpu_tuning_scaling.{json,md}.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def study_run(tensor, gpus: list[int], trials: int, folder: Path) -> dict:
    """One study on `gpus`: wall seconds, trials an hour, best seconds, best-so-far against wall time."""
    from tuner import tune
    started = time.time()
    result = tune(tensor, trials=trials, device="gpu", gpus=gpus, storage=f"sqlite:///{folder / f'{len(gpus)}.db'}",
                  study_name=f"scaling-{len(gpus)}", progress=False, seed=0, record=False)
    wall = time.time() - started
    done = sorted((t for t in result.study.trials if t.value is not None), key=lambda t: t.datetime_complete)
    best, curve = float("inf"), []
    for trial in done:
        best = min(best, trial.value)
        curve.append([round(trial.datetime_complete.timestamp() - started, 2), best])
    return {"gpus": gpus, "wall_s": wall, "trials": len(result.study.trials), "complete": len(done),
            "trials_an_hour": len(done) / wall * 3600, "best_s": best, "best_so_far": curve,
            "cards": sorted({t.user_attrs.get("gpu", "") for t in done})}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--gpus", type=int, default=None, help="most GPUs to use (default: all of this host)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="gpu_scaling_"))
    os.environ["LOOPTOOL_TUNING_DB"] = str(folder / "tuned.db")
    os.environ["LOOPTOOL_CACHE_DIR"] = ""       # no PTX cache: each study compiles its own draws
    import numpy as np
    import looptool as lt
    from looptool.runtime import gpu as runtime_gpu
    from bench.report import write_results
    count = args.gpus or runtime_gpu.cupy().cuda.runtime.getDeviceCount()
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((args.size, args.size)).astype(lt.bfloat16) for _ in range(2))
    sm, sk, sn = lt.symbols("m k n")
    tensor = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
    rows = [study_run(tensor, list(range(k)), args.trials, folder) for k in range(1, count + 1)]
    one = rows[0]
    lines = [f"{runtime_gpu.gpu_target().name} x{count}; bf16 matmul {args.size}^3, {args.trials} trials a study "
             f"(tuner.tune(..., device='gpu', gpus=[...]))",
             "| GPUs | wall s | trials complete | trials an hour | x one GPU | best kernel us | x one GPU's best |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {len(r['gpus'])} | {r['wall_s']:.0f} | {r['complete']}/{r['trials']} | "
                     f"{r['trials_an_hour']:.0f} | {r['trials_an_hour'] / one['trials_an_hour']:.2f} | "
                     f"{r['best_s'] * 1e6:.1f} | {one['best_s'] / r['best_s']:.3f} |")
    write_results(args.out, "gpu_tuning_scaling", rows, "\n".join(lines))


if __name__ == "__main__":
    main()
