"""Where a GPU suite row's time goes: `python -m bench.gpu_profile --only attention` runs the rows of
`bench.gpu_suite` whose name contains the text, each through `c.cuda()` and through torch, under
`torch.profiler` (CUPTI sees looptool's kernels too, launched through cuLaunchKernel), and prints each
kernel's mean GPU time, looptool's and torch's side by side.
"""
from __future__ import annotations

import argparse

from looptool.runtime import gpu as runtime_gpu

from .gpu import kernel_times
from .gpu_suite import workloads


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="profile rows whose name contains this")
    parser.add_argument("--shapes", choices=("suite", "even", "other"), default="suite",
                        help="which of bench.gpu_suite's shape sets")
    args = parser.parse_args(argv)
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False          # (as bench.gpu_suite: float32 convolutions without TF32)
    for name, build in workloads(torch, args.shapes):
        if args.only not in name:
            continue
        tensor, baseline, _, _ = build()
        tensor.cuda()
        runtime_gpu.cupy().cuda.Stream.null.synchronize()
        for who, fn in (("looptool", tensor.cuda), ("torch", baseline)):
            times = kernel_times(torch, fn)
            total = sum(t for _, t in times)
            print(f"{name} | {who}: {total:.1f} us in {len(times)} kernels")
            for kernel, us in times:
                print(f"    {us:9.1f} us  {kernel[:90]}")


if __name__ == "__main__":
    main()
