"""looptool's automatic schedules against XLA (`jax.jit` on the CPU) and PyTorch on the CPU, side by side:
`python -m bench.peers` (peers from `pip install '.[bench]'`; a peer that is not installed is reported
as missing, its rows skipped).

For each workload of the suite (`bench.models.SUITE`: `bench.workloads.WORKLOADS` and issue #27's model
workloads) and each thread count (1 and every core this process may use),
a child process is pinned to that many cores (`os.sched_setaffinity`), so XLA's and PyTorch's thread
pools and looptool's see the same cores; PyTorch is also held to them with `torch.set_num_threads`,
XLA with its intra-op flag (before jax is imported). In the child, looptool's kernel (the automatic
schedule, no tuning database) and each peer's are checked against the float64 reference and timed
interleaved in one process (`bench.timing.interleaved`). Ratios are peer time / looptool time: above 1
looptool is faster. Writes `peers.json` and `peers.md` to `--out` (`--name` another stem, `--label` a first
line). `--quick` times each row for 0.5 s instead of 2 (the whole suite, 1 and 2 threads, in about 2 minutes
on a 2-core machine, against about 4). With `LOOPTOOL_CPU` set (docs/autoschedule.md), looptool's kernels are
code for that CPU, run on this one, and the table says so.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from . import timing
from .report import geometric_mean
from .models import SUITE
from .workloads import Workload, select

HERE = Path(__file__).resolve().parent
PEERS = ("xla", "torch")
# PyTorch's OpenMP workers spin for a while after each of its calls; timed interleaved, they spun on the
# core that the next call's threads (ours, XLA's or its own) needed: 2-thread matmul 1024³ read 24.6 ms
# for looptool and 31.6 for PyTorch against 19.2 and 22.6 with them passive (XLA 20.4 either way).
QUIET_WORKERS = {"OMP_WAIT_POLICY": "PASSIVE"}
UNTUNED = {"LOOPTOOL_TUNING_DB": ""}     # no tuned schedule from the tuning database: the automatic ones
# `--peers-isa avx2`: the peers held to AVX2 too, as far as they let themselves be (beside LOOPTOOL_CPU=znver2):
# XLA's own code generation (its library kernels, YNNPACK's matmuls, choose at run time), PyTorch's kernels,
# oneDNN and MKL.
PEER_ISA = {"avx2": {"xla_flag": "--xla_cpu_max_isa=AVX2", "env": {
    "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}}}
QUICK_BUDGET = 0.5      # seconds of timing a row with --quick


def peer_function(peer: str, workload: Workload):
    """The workload as the peer's function of its inputs dict (XLA: jitted, waited for), or None."""
    form = getattr(workload, peer)
    if form is None:
        return None
    if peer == "torch":
        import torch
        return lambda inputs: form(torch, inputs)
    import jax
    jitted = jax.jit(lambda inputs: form(jax, inputs))
    return lambda inputs: jitted(inputs).block_until_ready()


def peer_inputs(peer: str, inputs: dict):
    """The inputs as the peer's own arrays (copied once, outside the timing)."""
    if peer == "xla":
        import jax.numpy as jnp
        return {k: jnp.asarray(v) for k, v in inputs.items()}
    import torch
    return {k: torch.from_numpy(v) for k, v in inputs.items()}


def available() -> dict[str, str | None]:
    """Each peer's version, or None where it is not installed."""
    found = {}
    for peer, module in (("xla", "jax"), ("torch", "torch")):
        try:
            found[peer] = __import__(module).__version__
        except ImportError:
            found[peer] = None
    return found


def child(threads: int, names: str | None, budget: float, schedules: dict[str, str] | None = None) -> list[dict]:
    """Rows for one thread count, run in this (pinned) process. With `schedules` (schedule JSON by
    workload name), looptool runs those (a workload without one: the automatic schedule) and each
    row also times the automatic schedule (`automatic_ms`, `automatic_xla_ratio`)."""
    import looptool as lt
    from looptool import ir
    lt.set_num_threads(threads)
    versions = available()
    if versions["torch"]:
        import torch
        torch.set_num_threads(threads)
    rows = []
    for workload in select(names, SUITE):
        inputs = workload.inputs(np.random.default_rng(0))
        ref = workload.reference(inputs)
        tensor = workload.build(inputs)
        kernel = tensor.compile((schedules or {}).get(workload.name))
        arrays = ir.lower(tensor.node)[1]
        row = {"workload": workload.name, "title": workload.title, "threads": threads,
               "looptool_error": relative_error(workload.to_ref(kernel(arrays)), ref)}
        timed = {"looptool": lambda: kernel(arrays)}
        if schedules is not None:
            automatic = tensor.compile()
            row["automatic_error"] = relative_error(workload.to_ref(automatic(arrays)), ref)
            timed["automatic"] = lambda: automatic(arrays)
        for peer in PEERS:
            fn = peer_function(peer, workload) if versions[peer] else None
            if fn is None:
                row[f"{peer}_note"] = "not installed" if not versions[peer] else "no implementation"
                continue
            given = peer_inputs(peer, inputs)
            out = np.asarray(fn(given))
            row[f"{peer}_error"] = relative_error(out, ref if out.shape == ref.shape else workload.to_ref(ref))
            timed[peer] = lambda fn=fn, given=given: fn(given)
        # shuffled rounds: in a fixed order the first kernel of each round (the one after PyTorch's call) took
        # about 3 µs longer on one core, whichever it was (matmul 64³: 11 µs against 8 µs)
        times = timing.interleaved(list(timed.values()), budget=budget, shuffle=True)
        for (name, _), measured in zip(timed.items(), times):
            row[f"{name}_ms"] = measured.median * 1e3
        for peer in PEERS:
            if f"{peer}_ms" in row:
                row[f"{peer}_ratio"] = row[f"{peer}_ms"] / row["looptool_ms"]
                if "automatic_ms" in row:
                    row[f"automatic_{peer}_ratio"] = row[f"{peer}_ms"] / row["automatic_ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def relative_error(got, ref) -> float:
    got = np.asarray(got, dtype=np.float64)
    if got.shape != np.shape(ref):
        return float("inf")
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def table(rows: list[dict], versions: dict, cpu: str) -> str:
    """The markdown table of all rows, then the geometric mean and lowest row x XLA per thread count."""
    lines = [f"looptool against XLA ({versions['xla'] or 'not installed'}) and PyTorch "
             f"({versions['torch'] or 'not installed'}) on {cpu}; ratios: peer time / looptool time",
             "", "| workload | threads | looptool ms | rel. error | x XLA | x PyTorch |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        cells = [f"{r[f'{peer}_ratio']:.2f}" if f"{peer}_ratio" in r else r.get(f"{peer}_note", "")
                 for peer in ("xla", "torch")]
        lines.append(f"| {r['title']} | {r['threads']} | {r['looptool_ms']:.3f} | {r['looptool_error']:.1e} | "
                     f"{cells[0]} | {cells[1]} |")
    lines.append("")
    for threads in sorted({r["threads"] for r in rows}):
        rated = [r for r in rows if r["threads"] == threads and "xla_ratio" in r]
        if rated:
            low = min(rated, key=lambda r: r["xla_ratio"])
            lines.append(f"{threads} thread{'s' if threads > 1 else ''}: geometric mean x XLA "
                         f"{geometric_mean([r['xla_ratio'] for r in rated]):.2f} over {len(rated)} rows, lowest "
                         f"{low['xla_ratio']:.2f} ({low['title']})")
    return "\n".join(lines)


def cpu_name() -> str:
    """The CPU as /proc/cpuinfo names it, with LLVM's name for its core and the target model's vector
    registers and cores (a virtual machine often says only 'AMD EPYC'); with `LOOPTOOL_CPU` set, the CPU
    the code was compiled for first."""
    import llvmlite.binding as llvm
    from looptool.analysis.target import host, llvm_cpu
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown CPU")
    target, code = host(), llvm_cpu()
    if code.setting is None:
        return f"{model} ({llvm.get_host_cpu_name()}, {target.vector_bits}-bit vectors, {target.cores} cores)"
    return (f"code for LLVM target {code.setting} ({target.vector_bits}-bit vectors, {target.vector_registers} "
            f"vector registers, caches planned as {target.l1 // 1024} KiB / {target.l2 // 1024} KiB / "
            f"{target.l3 // 1024} KiB) run on {model} ({llvm.get_host_cpu_name()}, {target.cores} cores)")


def run_children(thread_counts, budget: float, only: str | None = None, extra: tuple[str, ...] = (),
                 peers_isa: str | None = None) -> list[dict]:
    """The rows of `child` for each thread count, each from a `python -m bench.peers --child` process
    pinned to that many of this process's cores, with XLA and PyTorch held to them (`extra`: more
    arguments of the child; `peers_isa`: a key of PEER_ISA, the instructions the peers may use)."""
    cores = sorted(os.sched_getaffinity(0))
    isa = PEER_ISA[peers_isa] if peers_isa else {"xla_flag": "", "env": {}}
    rows = []
    for threads in thread_counts:
        xla = (f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'} "
               f"intra_op_parallelism_threads={threads}")
        env = {**os.environ, "XLA_FLAGS": f"{xla} {isa['xla_flag']}".strip(), **isa["env"], **QUIET_WORKERS, **UNTUNED}
        command = [sys.executable, "-m", "bench.peers", "--child", str(threads), "--budget", str(budget), *extra]
        command += ["--only", only] if only else []
        pinned = lambda threads=threads: os.sched_setaffinity(0, cores[:threads])  # noqa: E731
        run = subprocess.run(command, env=env, capture_output=True, text=True, preexec_fn=pinned,
                             cwd=HERE.parent)
        if run.returncode:
            raise SystemExit(f"the {threads}-thread child failed:\n{run.stderr[-3000:]}")
        rows += [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="comma-separated workload names (bench.workloads)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--name", default="peers", help="file name stem of the results (default: peers)")
    parser.add_argument("--label", default=None, help="a line put above the table (and in the JSON)")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of timing a row")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_BUDGET} s of timing a row (noisier ratios)")
    parser.add_argument("--peers-isa", choices=sorted(PEER_ISA), default=None,
                        help="hold XLA and PyTorch to these instructions (their run-time dispatched libraries aside: "
                             "on an AVX-512 Intel host XLA's matmuls ignore the cap, session 26)")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--schedules", type=Path, default=None, help=argparse.SUPPRESS)   # child: JSON file
    args = parser.parse_args(argv)
    if args.quick:
        args.budget = QUICK_BUDGET
    if args.child is not None:
        child(args.child, args.only, args.budget, json.loads(args.schedules.read_text()) if args.schedules else None)
        return
    rows = run_children(sorted({1, len(os.sched_getaffinity(0))}), args.budget, args.only, peers_isa=args.peers_isa)
    versions = available()
    text = table(rows, versions, cpu_name())
    if args.label:
        text = f"{args.label}\n\n{text}"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps({"label": args.label, "cpu": cpu_name(),
                                                            "versions": versions, "peers_isa": args.peers_isa,
                                                            "rows": rows}, indent=1))
    (args.out / f"{args.name}.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
