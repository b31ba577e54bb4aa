"""Where a GPU suite row's first call goes: `python -m bench.gpu_first_call --only mlp --shapes other` runs
the first `c.cuda()` of each row of `bench.gpu_suite` whose name contains the text under cProfile (with an
empty PTX cache) and prints its seconds and the functions that took the most of them.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time

from .gpu_suite import workloads


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="rows whose name contains this")
    parser.add_argument("--shapes", choices=("suite", "even", "other"), default="suite")
    parser.add_argument("--top", type=int, default=30, help="functions printed, by cumulative time")
    args = parser.parse_args(argv)
    os.environ["LOOPTOOL_CACHE_DIR"] = tempfile.mkdtemp()
    import torch
    torch.zeros(1, device="cuda")
    for name, build in workloads(torch, args.shapes):
        if args.only not in name:
            continue
        tensor = build()[0]
        profile = cProfile.Profile()
        start = time.perf_counter()
        profile.enable()
        tensor.cuda()
        profile.disable()
        print(f"{name}: first call {time.perf_counter() - start:.2f} s")
        pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
