"""Where the host time of a `.cuda()` call goes: `python -m bench.gpu_call_cost` on the GPU machine.

Times, in host microseconds a call (perf_counter over many calls, no synchronization inside the loop),
each piece of a prepared `.cuda()` call next to the pieces of torch's own eager call, for a workload
with one kernel (a 64x64 softmax) and one with several kernels and temps (`--only` picks suite rows
by name), and of an `lt.function` call on PyTorch CUDA tensors. Prints one JSON line a measurement.
"""
from __future__ import annotations

import argparse
import json
import time

import looptool as lt
from looptool.runtime import gpu as runtime_gpu

from .gpu_suite import workloads

CALLS = 2000


def host_us(fn, calls: int = CALLS) -> float:
    """Mean host microseconds of fn() over `calls` calls (the device synchronized before and after)."""
    cp = runtime_gpu.cupy()
    for _ in range(20):
        fn()
    cp.cuda.Stream.null.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    cp.cuda.Stream.null.synchronize()
    return elapsed / calls * 1e6


def softmax_64(torch):
    x = torch.randn(64, 64, device="cuda")
    xt = lt.Tensor(x).to(*lt.symbols("m n"))
    n = lt.symbols("n")[0]
    e = (xt - xt.max(n)).exp()
    return e / e.sum(n), lambda: torch.softmax(x, dim=1)


def function_call(torch) -> dict:
    """Host microseconds of an `lt.function` call on PyTorch CUDA tensors (a 64x64 softmax: traced once,
    then launched on the tensors' addresses, its result a new torch tensor) next to torch's softmax."""
    m, n = lt.symbols("m n")

    @lt.function
    def softmax(x: lt.In[m, n]):
        e = (x - x.max(n)).exp()
        return e / e.sum(n)
    x = torch.randn(64, 64, device="cuda")
    got = softmax(x)
    error = float((got - torch.softmax(x, dim=1)).abs().max())
    return {"workload": "lt.function softmax f32 64x64 on torch tensors",
            "function_call": round(host_us(lambda: softmax(x)), 2),
            "torch_call": round(host_us(lambda: torch.softmax(x, dim=1)), 2), "max_abs_error": error}


def pieces(torch, name: str, tensor, baseline) -> dict:
    """Host microseconds of the whole call and of its parts, and of torch's call."""
    cp = runtime_gpu.cupy()
    tensor.cuda()
    call = runtime_gpu.prepared_call(tensor.node)
    out = call()
    shape, dtype = out.shape, out.dtype
    row = {"workload": name,
           "cuda_call": host_us(tensor.cuda),
           "prepared_call": host_us(call),
           "prepared_call_into_out": host_us(lambda: call(out)),
           "cupy_empty_output": host_us(lambda: cp.empty(shape, dtype=dtype)),
           "torch_call": host_us(baseline),
           "torch_empty_output": host_us(lambda: torch.empty(shape, device="cuda"))}
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], help="also suite rows whose name contains this")
    args = parser.parse_args(argv)
    import torch
    print(json.dumps(pieces(torch, "softmax f32 64x64", *softmax_64(torch))), flush=True)
    print(json.dumps(function_call(torch)), flush=True)
    for name, build in workloads(torch):
        if any(text in name for text in args.only):
            tensor, baseline, _, _ = build()
            print(json.dumps(pieces(torch, name, tensor, baseline)), flush=True)


if __name__ == "__main__":
    main()
