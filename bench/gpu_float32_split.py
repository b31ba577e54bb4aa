"""float32 products on forced register-tile blocks and split-k parts, side by side with torch in one process:
`python -m bench.gpu_float32_split 1536x1536x1536:128x128:6 1536x1536x1536:64x64:1 ...` on the GPU machine.

Each argument is PRODUCT:BLOCK:PARTS (m x k x n, rows x columns, parts of k). For each product its
variants run as `.cuda()` lowers and schedules it (`runtime.gpu.lowered_for`, `gpu_rules.gpu_tree`) with
`autoschedule.gpu.FLOAT32_BLOCKS` held to the block and `split_k_parts` to the parts, on a NaN-poisoned
output compared with float64, then are timed interleaved with torch (TF32 off; best median of CUDA-event
timed calls over 5 rounds). Prints one JSON line a product. Session 28 measured the time model of
`autoschedule.gpu.float32_cost` with it (bench/results/gpu_float32_split_s28_h100.md).
"""
from __future__ import annotations

import argparse
import json

import numpy as np

import looptool as lt
from looptool.autoschedule import gpu as templates
from bench.gpu_rules_variants import automatic_kernels
from bench.gpu_suite import interleaved_ms


def forced_launch(a, b, block: tuple[int, int], parts: int, reference: np.ndarray):
    """(a call of the kernels of a @ b on `block` tiles in `parts` parts, their relative error, kernel count)."""
    kept = templates.FLOAT32_BLOCKS, templates.split_k_parts
    templates.FLOAT32_BLOCKS = (block,)
    templates.split_k_parts = lambda program, sms, hopper=True: parts
    try:
        sm, sk, sn = lt.symbols("m k n")
        call, error, kernel = automatic_kernels((lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk), reference)
    finally:
        templates.FLOAT32_BLOCKS, templates.split_k_parts = kept
    return call, error, len(kernel.module.launches)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+", help="PRODUCT:BLOCK:PARTS, e.g. 1000x1500x777:128x64:5")
    args = parser.parse_args(argv)
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    by_product: dict[tuple, list] = {}
    for variant in args.variants:
        product, block, parts = variant.split(":")
        by_product.setdefault(tuple(map(int, product.split("x"))), []).append(
            (tuple(map(int, block.split("x"))), int(parts)))
    gen = torch.Generator(device="cuda").manual_seed(1)
    for (m, k, n), variants in by_product.items():
        a, b = torch.randn(m, k, device="cuda", generator=gen), torch.randn(k, n, device="cuda", generator=gen)
        reference = (a.double() @ b.double()).cpu().numpy()
        calls, facts = {"torch": lambda: a @ b}, {}
        for block, parts in variants:
            name = f"{block[0]}x{block[1]}:{parts}"
            calls[name], error, kernels = forced_launch(a, b, block, parts, reference)
            facts[name] = {"rel_error": error, "kernels": kernels}
        ms = interleaved_ms(calls, rounds=5)
        print(json.dumps({"product": f"{m}x{k}x{n}", "torch_ms": round(ms["torch"], 4),
                          **{name: {**facts[name], "ms": round(ms[name], 4), "x_torch": round(ms["torch"] / ms[name], 3)}
                             for name in facts}}), flush=True)


if __name__ == "__main__":
    main()
