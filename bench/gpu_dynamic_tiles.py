"""Register tiles cut at a dynamic size on the GPU: `python -m bench.gpu_dynamic_tiles` on the GPU machine.

The automatic GPU scheduler refuses schedules that split a dynamic dim (`gpu_rules.sized_at_launch`): on
an H100 (session 15) the float32 register-tile template over dynamic rows of relu(x @ w), x 1000 x 96,
w 96 x 200, wrote rows 936-959 wrong, though the same tree ran right on the CPU. This script runs that
template's tree (built by the per-stage rules directly, past the refusal) next to variants that isolate
the cause, at several row counts, and prints for each the relative error and the wrong rows:

- `dynamic`: the refused tree (A's tiles copied into shared memory by guarded loads: A is not transposed
  ahead, since its rows would be the copy's last axis, which no dynamic size may set: the legality check
  refuses such a copy, so the script turns `templates.transposable` off);
- `static, A untransposed`: the same template on a static program of that many rows, A not transposed
  ahead either (is the fault in those copies, whatever the size?);
- `static`: the template as `.cuda()` runs it (A transposed ahead, copied by cp.async).
"""
from __future__ import annotations

import argparse

import numpy as np

import looptool as lt
from looptool.autoschedule import gpu as templates
from looptool.autoschedule import gpu_rules
from looptool.runtime import gpu as runtime_gpu

ROWS = (1, 5, 128, 129, 1000)


def layer(x: np.ndarray, w: np.ndarray, dynamic: bool):
    """relu(x @ w) over rows `b`, dynamic or not."""
    b = lt.symbols("b", dynamic=dynamic)[0]
    k, n = lt.symbols("k n")
    return lt.relu((lt.Tensor(x).to(b, k) * lt.Tensor(w).to(k, n)).sum(k))


def per_stage_tree(tensor, untransposed: bool, arch: str | None = None):
    """(the per-stage rules' schedule of `tensor`, past `sized_at_launch`; its arrays), A transposed ahead
    or not."""
    transposable = templates.transposable
    if untransposed:
        templates.transposable = lambda *args: False
    try:
        program, arrays = runtime_gpu.lowered_for(tensor.node)
        return gpu_rules.rule_tree(program, runtime_gpu.gpu_target(arch), "per stage"), arrays
    finally:
        templates.transposable = transposable


def run(tensor, reference: np.ndarray, untransposed: bool) -> str:
    """'relative error, wrong rows' of the per-stage tree of `tensor` on this GPU."""
    cp = runtime_gpu.cupy()
    tree, arrays = per_stage_tree(tensor, untransposed)
    got = cp.asnumpy(runtime_gpu.GpuKernel(tree)(arrays)).astype(np.float64)
    scale = np.abs(reference).max()
    wrong = sorted(set(np.argwhere(np.abs(got - reference) > 1e-3 * scale)[:, 0].tolist()))
    rows = f"{len(wrong)} wrong rows" + (f", {wrong[0]}..{wrong[-1]}" if wrong else "")
    return f"{np.abs(got - reference).max() / scale:.1e}, {rows}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=96)
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((args.k, args.n)).astype(np.float32)
    for rows in ROWS:
        x = rng.standard_normal((rows, args.k)).astype(np.float32)
        reference = np.maximum(x.astype(np.float64) @ w, 0)
        for label, dynamic, untransposed in (("dynamic", True, True), ("static, A untransposed", False, True),
                                             ("static", False, False)):
            try:
                outcome = run(layer(x, w, dynamic), reference, untransposed)
            except Exception as err:  # noqa: BLE001 - a variant that cannot run is reported, the others still run
                outcome = f"{type(err).__name__}: {str(err)[:200]}"
            print(f"{rows} rows x {args.k} x {args.n}, {label}: {outcome}", flush=True)


if __name__ == "__main__":
    main()
