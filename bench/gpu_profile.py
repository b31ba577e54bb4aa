"""Where a GPU suite row's time goes: `python -m bench.gpu_profile --only attention` runs the rows of
`bench.gpu_suite` whose name contains the text, each through `c.cuda()` and through torch, under
`torch.profiler` (CUPTI sees looptool's kernels too, launched through cuLaunchKernel), and prints each
kernel's mean GPU time, looptool's and torch's side by side.
"""
from __future__ import annotations

import argparse
import collections

from looptool.runtime import gpu as runtime_gpu

from .gpu_suite import workloads

CALLS = 20


def kernel_times(torch, fn) -> list[tuple[str, float]]:
    """(kernel name, mean microseconds a call) for the GPU kernels `fn` launches, in launch order."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = collections.OrderedDict()
    for event in prof.events():
        if event.device_type.name == "CUDA":
            totals[event.name] = totals.get(event.name, 0.0) + event.device_time
    return [(name, total / CALLS) for name, total in totals.items()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="profile rows whose name contains this")
    args = parser.parse_args(argv)
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, build in workloads(torch, True):
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
