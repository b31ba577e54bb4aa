"""The GPU tuner against torch on the GPU suite's matmul rows, in one process: `python -m bench.gpu_tuned`
on the GPU machine.

For each row: its untuned `c.cuda()` timed next to torch (`bench.gpu_suite.run_row`), then a study of
`--trials` trials on this GPU (`tuner.tune(..., device="gpu")`, which stores its best schedule only
where it beats the automatic one), then the row again on freshly built inputs, now running what the
tuning database holds. Both runs are checked against float64. The studies and the tuning database
live in a temporary folder, so nothing tuned here reaches other runs.
Prints one JSON line a row, then a table; `--out DIR` writes gpu_tuned.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

ROWS = ("matmul", "batched matmul", "mlp")       # the suite's rows whose names start so


def tuned_row(torch, name: str, build, copy_ms_for, trials: int, storage: str) -> dict:
    """The row untuned, the study's summary, and the row tuned."""
    from bench.gpu_suite import run_row
    from tuner import tune
    untuned = run_row(torch, name, build, copy_ms_for)
    started = time.perf_counter()
    result = tune(build()[0], trials=trials, device="gpu", storage=storage, progress=False)
    seconds = time.perf_counter() - started
    tuned = run_row(torch, name, build, copy_ms_for)
    complete = [t for t in result.study.trials if t.value is not None]
    automatic = result.study.user_attrs.get("automatic_seconds")
    return {"name": name, "untuned": untuned, "tuned": tuned, "tuning_s": seconds, "trials": len(result.study.trials),
            "complete": len(complete), "best_trial_s": min((t.value for t in complete), default=None),
            "automatic_s": automatic, "kept_automatic": result.best_seconds == automatic}


def table(rows: list[dict], device: str, trials: int) -> str:
    lines = [f"{device}; GPU tuner, {trials} trials a row, against torch (x torch: torch time / c.cuda() time)",
             "| workload | untuned x torch | tuned x torch | tuning s | trials complete | schedule kept | rel err |",
             "| --- | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in rows:
        before, after = r["untuned"], r["tuned"]
        if "error" in before or "error" in after:
            lines.append(f"| {r['name']} | error: {(before.get('error') or after.get('error'))[:120]} | | | | | |")
            continue
        kept = "automatic" if r["kept_automatic"] else "tuned"
        lines.append(f"| {r['name']} | {before['x_torch']:.2f} | {after['x_torch']:.2f} | {r['tuning_s']:.0f} | "
                     f"{r['complete']}/{r['trials']} | {kept} | {after['rel_error']:.1e} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--only", default="", help="comma-separated: rows whose name contains any")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="gpu_tuned_"))
    os.environ["LOOPTOOL_TUNING_DB"] = str(folder / "tuning.db")     # read at each lookup
    import torch
    from bench.gpu_suite import workloads
    from bench.report import write_results
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    storage = f"sqlite:///{folder / 'studies.db'}"
    rows = []
    for name, build in workloads(torch):
        wanted = [part for part in args.only.split(",") if part]
        if not name.startswith(ROWS) or wanted and not any(part in name for part in wanted):
            continue
        row = tuned_row(torch, name, build, lambda moved: None, args.trials, storage)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("untuned", "tuned")}
                         | {"untuned": row["untuned"].get("x_torch"), "tuned": row["tuned"].get("x_torch")}), flush=True)
    write_results(args.out, "gpu_tuned", rows, table(rows, torch.cuda.get_device_name(), args.trials))


if __name__ == "__main__":
    main()
