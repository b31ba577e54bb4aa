"""A GPU study of bfloat16 matmul (4096^3 by default) over `tuner.space.sample_gpu`, whose draws for a
half-precision contraction include the tensor-core families 'mma' and (Hopper) 'wgmma':
`python -m bench.gpu_mma_study --trials 40 --timeout 150` on the GPU machine. Then the study's best
schedule, the best hand-written `bench.gpu` one (its first wgmma variant on Hopper, else its first mma
variant) and torch.matmul in bfloat16 are
checked (NaN-poisoned outputs, float64 reference) and timed side by side; writes mma_study.json."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import optuna

import looptool as lt
from bench.gpu import MMA_VARIANTS, WGMMA_VARIANTS, check_and_time, median_ms, resources, tensor_core_variants
from tuner.study import tune


def main(argv=None):
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--timeout", type=float, default=150.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args(argv)
    import torch
    n = args.size
    ta, tb = (torch.randn(n, n, device="cuda").to(torch.bfloat16) for _ in range(2))
    m, k, nn = lt.symbols("m k n")
    mat = (lt.Tensor(ta.cpu().float().numpy().astype(lt.bfloat16)).to(m, k)
           * lt.Tensor(tb.cpu().float().numpy().astype(lt.bfloat16)).to(k, nn)).sum(k)
    result = tune(mat, trials=args.trials, timeout=args.timeout, storage=f"sqlite:///{args.out}/mma_study.db",
                  seed=args.seed, device="gpu", progress=False, record=False)
    trials = [t for t in result.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    families = {}
    for t in trials:
        family = t.params.get("gpu.tensor.family", "tiles")
        families[family] = min(families.get(family, float("inf")), t.value)
    best = min(trials, key=lambda t: t.value)
    print(f"{len(result.study.trials)} trials, {len(trials)} complete; best per family (s): {families}")
    print(f"best trial {best.number}: {best.value * 1e3:.3f} ms, params {best.params}")
    summary = {"trials": len(result.study.trials), "complete": len(trials), "best_per_family_s": families,
               "best_params": best.params, "best_steps": best.user_attrs.get("schedule")}
    Path(args.out, "mma_study.json").write_text(json.dumps(summary, indent=1))
    ref = torch.matmul(ta.double(), tb.double()).cpu().numpy()
    gpu_mat = (lt.Tensor(ta).to(m, k) * lt.Tensor(tb).to(k, nn)).sum(k)
    hand = list(tensor_core_variants(gpu_mat.loop_tree(), MMA_VARIANTS[:1], WGMMA_VARIANTS[:1]).values())[-1]
    rows = {}
    for name, tree in (("study best", result.best_tree), ("hand-written (bench.gpu's best)", hand)):
        torch_ms = median_ms(lambda: torch.matmul(ta, tb))
        err, ms, ptx = check_and_time(gpu_mat, tree.schedule, ref, 20)
        rows[name] = {"rel_error": err, "ms": ms, "torch_ms": torch_ms, "ratio": torch_ms / ms,
                      "tflops": 2 * n ** 3 / ms / 1e9, "ptxas": resources(ptx)}
        print(f"{name}: {ms:.3f} ms, {torch_ms / ms:.2f}x torch, rel. error {err:.1e}, {rows[name]['ptxas']}")
    Path(args.out, "mma_study.json").write_text(json.dumps({**summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
