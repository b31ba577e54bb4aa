"""Reporting: the markdown table, the JSON record with machine info, and the bar chart of ratios."""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

import numpy as np


def _num(x, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def progress_line(row) -> str:
    """A one-line summary printed as each row finishes."""
    if row.status != "ok":
        return f"{row.title:28s} {row.threads}t {row.variant:7s} {row.status}: {row.note}"
    return (f"{row.title:28s} {row.threads}t {row.variant:7s} ours {row.ours_ms:9.3f} ms  "
            f"numpy {row.base_ms:9.3f} ms  ratio {row.ratio:6.2f}  err {row.rel_err:.1e}  (n={row.repeat})")


BUSY = 0.25   # cores used by other processes above which a row is marked as timed on a busy machine


def noise(row) -> str:
    """'±IQR%' of the noisier side, plus the load other processes put on the machine when it was high."""
    if row.spread is None:
        return "—"
    text = f"±{100 * row.spread:.0f}%"
    if row.foreign_load is not None and row.foreign_load > BUSY:
        text += f" busy {row.foreign_load:.1f}"
    return text


def markdown(rows, compile_info: dict | None = None) -> str:
    """The results as a markdown table, followed by target misses, failures and notes."""
    lines = ["| workload | threads | variant | ours ms | NumPy ms | ratio | ours | NumPy | noise | status |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        threads = f"{r.threads}" + (f" (NumPy {r.baseline_threads})" if r.baseline_threads != r.threads else "")
        rate = lambda v: "—" if v is None else f"{v:.1f} {r.unit}"  # noqa: E731
        status = r.status
        if r.misses_target:
            status = f"below target {r.target}"
        elif r.status == "ok" and r.target is not None:
            status = f"ok (target {r.target})"
        lines.append(f"| {r.title} | {threads} | {r.variant} | {_num(r.ours_ms, '.3f')} | {_num(r.base_ms, '.3f')} "
                     f"| {_num(r.ratio, '.2f')} | {rate(r.ours_rate)} | {rate(r.base_rate)} | {noise(r)} | {status} |")
    lines += ["", "ratio = NumPy time / our time (medians of interleaved runs; > 1: looptool is faster). "
              "Softmax, layer norm and relu run single-threaded in NumPy (ufuncs do not thread); the conv "
              "baseline (im2col + matmul) is held to one BLAS thread; matmul baselines use as many OpenBLAS "
              "threads as ours. noise: interquartile range / median of the noisier side; 'busy x' means other "
              "processes kept x cores busy while the row was timed (its numbers are suspect)."]
    if compile_info:
        if "error" in compile_info:
            lines.append(f"\nCompile time (512³ matmul, {compile_info['schedule']}): ERROR {compile_info['error']}")
        else:
            ok = "ok" if compile_info["compile_seconds"] < compile_info["target_seconds"] else "ABOVE TARGET"
            lines.append(f"\nCompile time, 512³ matmul with {compile_info['schedule']} (cold cache): "
                         f"{compile_info['compile_seconds']:.3f} s (best of 3) loop tree → callable ({ok}, target < "
                         f"{compile_info['target_seconds']} s); {compile_info['with_legality_seconds']:.3f} s "
                         f"including lowering and the isl legality check.")
    misses = [r for r in rows if r.misses_target]
    if misses:
        lines.append("\nBelow target: " + "; ".join(f"{r.title} {r.threads}t {r.ratio:.2f} < {r.target}"
                                                    for r in misses))
    notes = [r for r in rows if r.status != "ok"]
    if notes:
        lines.append("\nFailed or skipped:")
        lines += [f"- {r.title} {r.threads}t {r.variant}: {r.status} — {r.note}" for r in notes]
    return "\n".join(lines) + "\n"


def machine_info() -> dict:
    """CPU model, core count, library versions, date and git commit of the checkout."""
    import llvmlite
    import numpy
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        root = Path(__file__).resolve().parent.parent
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "looptool"], cwd=root,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    try:
        from threadpoolctl import threadpool_info
        blas = [{k: p.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
                for p in threadpool_info() if p.get("user_api") == "blas"]
    except Exception:
        blas = []
    return {"cpu": cpu, "cores": os.cpu_count(), "numpy": numpy.__version__, "llvmlite": llvmlite.__version__,
            "python": platform.python_version(), "blas": blas,
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "git_commit": commit, "looptool_dirty": dirty}


def write_json(path: Path, rows, compile_info, args, seconds: float) -> None:
    """Rows, compile time, machine info and the options used, as JSON."""
    data = {"machine": machine_info(), "options": vars(args), "seconds": round(seconds, 1),
            "compile_time": compile_info,
            "rows": [dict(dataclasses.asdict(r), misses_target=r.misses_target) for r in rows]}
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def geometric_mean(values: list[float]) -> float:
    """The geometric mean of positive numbers."""
    return float(np.exp(np.mean(np.log(values))))


def write_results(folder: Path | None, stem: str, data, text: str) -> None:
    """Print `text` (a Markdown table), and where a folder is given write it and `data` (as JSON) there
    as <stem>.md and <stem>.json."""
    print(text)
    if folder:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{stem}.json").write_text(json.dumps(data, indent=1))
        (folder / f"{stem}.md").write_text(text + "\n")


def bar_chart(path: Path, rows) -> None:
    """Bars of the ratio per workload and thread count, default, auto and best side by side (log scale)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r.title, r.threads) for r in rows))
    by_key = {(r.title, r.threads, r.variant): r for r in rows}
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(groups) + 2), 5))
    width, labelled = 0.27, set()

    def label(name):
        """Each legend entry once."""
        if name in labelled:
            return None
        labelled.add(name)
        return name

    for offset, variant, color in ((-width, "default", "#9aa5b1"), (0.0, "auto", "#6fb06f"), (width, "best", "#2f6fb0")):
        for i, (title, threads) in enumerate(groups):
            r = by_key.get((title, threads, variant))
            x = i + offset
            if r is None:
                continue
            if r.ratio is None:
                ax.text(x, 1, f"{variant} {r.status}", rotation=90, ha="center", va="bottom", fontsize=7,
                        color="#b03030")
                continue
            ax.bar(x, r.ratio, width, color=color, label=label(variant))
            busy = r.foreign_load is not None and r.foreign_load > BUSY
            ax.text(x, r.ratio, f"{r.ratio:.2f}" + ("*" if busy else ""), ha="center", va="bottom", fontsize=7)
            if r.target is not None:
                ax.plot([x - width / 2, x + width / 2], [r.target] * 2, color="#d04020", lw=2, label=label("target"))
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{t}\n{n} thr" for t, n in groups], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("NumPy time / looptool time  (>1: looptool faster)")
    ax.set_title("looptool vs NumPy  (* timed while other processes kept the machine busy)", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
