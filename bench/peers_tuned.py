"""The tuner on the peers' suite (issue #27, part 4): `python -m bench.peers_tuned [--trials 64]`.

For one workload of each family of `bench.models.SUITE` (`FAMILIES`: the size that fits in L2 where the
suite has two), `tuner.tune` runs a fresh study of `--trials` trials at one thread (the cost-model
sampler, starting from the automatic schedule as `looptool tune` does (trial 0); the studies share one
storage, so later families learn from earlier ones). The best schedule of each study is then timed at one thread
by `bench.peers`'s child process, pinned to one core with XLA and PyTorch held to it: the tuned kernel,
the automatic one, XLA and PyTorch interleaved in one process, each result checked against float64.
Ratios are peer time / looptool time (above 1: looptool faster). Nothing is written to the tuning
database. Writes `peers_tuned.json` and `peers_tuned.md` to `--out`; `--keep DIR` keeps the studies.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import optuna

import tuner
from looptool import set_num_threads

from . import peers
from .report import geometric_mean
from .models import SUITE

HERE = Path(__file__).resolve().parent
# (family, workload of bench.models.SUITE): one row a family
FAMILIES = (
    ("matmul", "matmul_512"), ("matmul, odd sizes", "matmul_331x277x413"), ("matmul, the cost of a call", "matmul_64"),
    ("matmul, A k-major", "matmul_kmajor_512"), ("matmul, B n-major", "matmul_nmajor_512"),
    ("batched matmul", "bmm_8x256x64"), ("MLP layer", "mlp_128x512x512"),
    ("softmax, inner dim", "softmax_inner_128x1024"), ("softmax, outer dim", "softmax_outer_128x1024"),
    ("log-softmax, inner dim", "log_softmax_inner_128x1024"), ("log-softmax, outer dim", "log_softmax_outer_4096x1024"),
    ("layer norm", "layernorm_128x1024"), ("RMS norm", "rmsnorm_128x1024"),
    ("sum, inner dim", "reduce_sum_inner_4096x1024"), ("sum, outer dim", "reduce_sum_outer_256x1024"),
    ("max, inner dim", "reduce_max_inner_4096x1024"), ("max, outer dim", "reduce_max_outer_4096x1024"),
    ("mean, several dims", "reduce_mean_dims_bn_16x1024x256"),
    ("attention head", "attention_1x512x64"), ("multi-head attention", "attention_8x256x64"),
    ("conv 3×3", "conv3x3_32to64_28"), ("conv 1×1", "conv1x1_64to128_28"),
    ("conv 3×3 stride 2", "conv3x3_s2_64to128_56"),
    ("depthwise conv", "depthwise_64to64_56"), ("max pool", "maxpool_64x56"),
    ("GELU (tanh)", "gelu_tanh_256x1024"), ("GELU (erf)", "gelu_erf_256x1024"),
    ("pointwise relu(a·b+c)", "relu"), ("transpose", "transpose_512x512"),
)


def tune_family(name: str, trials: int, storage: str, seed: int) -> dict:
    """Tune the suite's workload `name` at one thread; its best schedule (JSON) and the study's figures."""
    workload = next(w for w in SUITE if w.name == name)
    tensor = workload.build(workload.inputs(np.random.default_rng(0)))
    started = time.perf_counter()
    result = tuner.tune(tensor, trials=trials, storage=storage, study_name=name, threads=1, seed=seed,
                        record=False, progress=False)
    states = [t.state.name for t in result.study.trials]
    first = min((t for t in result.study.trials if t.state == optuna.trial.TrialState.COMPLETE),
                key=lambda t: t.number, default=None)
    return {"workload": name, "tuning_seconds": time.perf_counter() - started,
            "measured": states.count("COMPLETE"), "pruned": states.count("PRUNED"), "failed": states.count("FAIL"),
            "best_trial": result.study.best_trial.number if result.best_tree else None,
            "study_automatic_over_best": first.value / result.best_seconds if first and result.best_tree else None,
            "schedule": result.best_tree.schedule.to_json() if result.best_tree else None}


def commit() -> str:
    """The checkout's commit (with -dirty where it has changes), or 'unknown'."""
    run = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=HERE, capture_output=True,
                         text=True)
    return run.stdout.strip() if run.returncode == 0 else "unknown"


def table(data: dict) -> str:
    """The markdown table: per family the tuned and automatic kernels against XLA and PyTorch, then the
    geometric means and the lowest rows."""
    lines = [f"looptool tuned ({data['trials']} trials a workload, 1 thread) against XLA ({data['versions']['xla']}) "
             f"and PyTorch ({data['versions']['torch']}){' held to ' + data['peers_isa'] if data.get('peers_isa') else ''} "
             f"on {data['cpu']}; commit {data['commit']}; "
             f"{data['wall_seconds'] / 60:.0f} min; load average {data['load']}. Ratios: peer time / looptool time.",
             "", "| family | workload | best trial (trials measured) | in the study: automatic / best | tuned ms | automatic ms "
             "| automatic / tuned | tuned x XLA | automatic x XLA | tuned x PyTorch |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in data["rows"]:
        gain = r["study_automatic_over_best"]
        lines.append(f"| {r['family']} | {r['title']} | {r['best_trial']} ({r['measured']} of {data['trials']}) | "
                     f"{'-' if gain is None else format(gain, '.2f')} | {r['looptool_ms']:.3f} | {r['automatic_ms']:.3f} | {r['automatic_ms'] / r['looptool_ms']:.2f} | "
                     f"{r.get('xla_ratio', float('nan')):.2f} | {r.get('automatic_xla_ratio', float('nan')):.2f} | "
                     f"{r.get('torch_ratio', float('nan')):.2f} |")
    rated = [r for r in data["rows"] if "xla_ratio" in r]
    if rated:
        lowest = sorted(rated, key=lambda r: r["xla_ratio"])[:3]
        lines += ["", f"geometric mean x XLA over {len(rated)} families: tuned "
                      f"{geometric_mean([r['xla_ratio'] for r in rated]):.2f}, automatic "
                      f"{geometric_mean([r['automatic_xla_ratio'] for r in rated]):.2f} (same process); automatic "
                      f"/ tuned {geometric_mean([r['automatic_ms'] / r['looptool_ms'] for r in rated]):.2f}",
                  "lowest tuned x XLA: " + ", ".join(f"{r['title']} {r['xla_ratio']:.2f}" for r in lowest)]
    return "\n".join(lines)


def main(argv=None):
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of timing a row")
    parser.add_argument("--only", nargs="+", default=None, choices=[name for _, name in FAMILIES], metavar="WORKLOAD",
                        help="these workloads of FAMILIES only")
    parser.add_argument("--keep", metavar="DIR", help="keep the study storage in DIR (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--name", default="peers_tuned", help="file name stem of the results")
    parser.add_argument("--peers-isa", choices=sorted(peers.PEER_ISA), default=None,
                        help="hold XLA and PyTorch to these instructions (with LOOPTOOL_CPU=znver2: an AVX2 run)")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    set_num_threads(1)
    families = [(family, name) for family, name in FAMILIES if not args.only or name in args.only]
    started, load = time.perf_counter(), os.getloadavg()[0]
    with contextlib.nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory() as folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        storage = f"sqlite:///{Path(folder).resolve() / 'peers_tuned.sqlite'}"
        tuned = {}
        for family, name in families:
            tuned[name] = tune_family(name, args.trials, storage, args.seed)
            print(json.dumps({k: v for k, v in tuned[name].items() if k != "schedule"}), flush=True)
        schedules = Path(folder) / "schedules.json"
        schedules.write_text(json.dumps({name: t["schedule"] for name, t in tuned.items() if t["schedule"]}))
        timed = peers.run_children([1], args.budget, ",".join(tuned), ("--schedules", str(schedules)),
                                   peers_isa=args.peers_isa)
    family_of = dict((name, family) for family, name in families)
    rows = [{"family": family_of[r["workload"]], **tuned[r["workload"]], **r} for r in timed]
    data = {"trials": args.trials, "seed": args.seed, "cpu": peers.cpu_name(), "commit": commit(),
            "versions": peers.available(), "wall_seconds": time.perf_counter() - started,
            "load": f"{load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end", "peers_isa": args.peers_isa,
            "rows": rows}
    text = table(data)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(data, indent=1))
    (args.out / f"{args.name}.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
