"""Dynamic vs static kernels (issue 28): `python -m bench.dynamic_sizes [--out DIR]`.

Each workload is one `lt.function` written twice, over a static batch dim and over a dynamic one
(`lt.symbols("b", dynamic=True)`): the static function traces and compiles a kernel for each batch
size, scheduled for it; the dynamic one compiles one kernel, scheduled at the representative size
(`ir.REPRESENTATIVE_SIZE`), that takes the batch size as an argument (on the GPU, one per size class,
`ir.size_class`: 256 and 1000 rows share one, 8192 rows get one planned at 4096). At three batch sizes both are
timed interleaved in one process (median of calls; one thread unless `--threads`) and the ratio is static
time over dynamic time (>= 0.95 is the issue's target). Results are checked against float64 first.
Writes dynamic_sizes.json and .md to `--out`.

`--device gpu`: the same functions on CuPy arrays at GPU sizes (`GPU_SIZES`, width `GPU_WIDTH`), plus the
layer in bfloat16; the ratio compares the kernels' device time a call (torch's profiler), and each call's
time back to back (host work included where it is the longer) is shown beside it; best of rounds taken in
turn, written to dynamic_sizes_gpu.json and .md.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import looptool as lt
from looptool.runtime import gpu as runtime_gpu

from . import timing
from .peers import cpu_name

SIZES = (64, 300, 1000)
WIDTH = 256
GPU_SIZES = (256, 1000, 8192)
GPU_WIDTH = 1024


def _functions(batch, width: int = WIDTH, gpu: bool = False):
    """The workloads over batch dim `batch`: name -> lt.function."""
    k, n = lt.symbols("k n")

    @lt.function
    def layer(x: lt.In[batch, k], w: lt.In[k, n]):
        return lt.relu((x * w).sum(k))

    @lt.function
    def softmax(x: lt.In[batch, n]):
        e = (x - x.max(n)).exp()
        return e / e.sum(n)
    functions = {f"relu(x @ w), k = n = {width}": layer, f"row softmax, n = {width}": softmax}
    if gpu:
        @lt.function
        def layer_bf16(x: lt.In[batch, k], w: lt.In[k, n]):
            return lt.relu((x * w).sum(k))
        functions[f"bfloat16 relu(x @ w), k = n = {width}"] = layer_bf16
    return functions


def _inputs(name: str, size: int, width: int, rng) -> tuple[list[np.ndarray], np.ndarray]:
    """The arrays of a workload at batch size `size` and its float64 reference result."""
    dtype = np.float32
    if name.startswith("bfloat16"):
        import ml_dtypes
        dtype = ml_dtypes.bfloat16
    x = rng.standard_normal((size, width)).astype(dtype)
    if "relu" in name:
        w = rng.standard_normal((width, width)).astype(dtype)
        return [x, w], np.maximum(x.astype(np.float64) @ w.astype(np.float64), 0)
    e = np.exp(x - x.max(1, keepdims=True).astype(np.float64))
    return [x], e / e.sum(1, keepdims=True)


def _cpu_row(static, dynamic, arrays, reference) -> tuple[float, float, float]:
    """(static s, dynamic s, max relative error) of one workload at one size on the CPU."""
    errors = [float(np.abs(fn(*arrays) - reference).max() / np.abs(reference).max()) for fn in (static, dynamic)]
    times = timing.interleaved([lambda: static(*arrays), lambda: dynamic(*arrays)], budget=3.0, min_repeat=20)
    return times[0].median, times[1].median, max(errors)


def _gpu_row(static, dynamic, arrays, reference) -> tuple[float, float, float, float, float]:
    """(static s, dynamic s, max relative error, static call s, dynamic call s) of one workload at one
    size, on CuPy arrays: the kernels' device time a call (torch's profiler, summed over the kernels a
    call launches), best of 3 rounds taken in turn; and each call's time in calls launched back to back
    (`bench.gpu.back_to_back_ms`: the larger of the kernels' time and the host's per-call work)."""
    import torch

    from .gpu import back_to_back_ms, kernel_times
    cp = runtime_gpu.cupy()
    device = [cp.asarray(a) for a in arrays]
    errors = [float(np.abs(cp.asnumpy(fn(*device)).astype(np.float64) - reference).max() / np.abs(reference).max())
              for fn in (static, dynamic)]
    kernels, calls = [float("inf")] * 2, [float("inf")] * 2
    for _ in range(3):
        for i, fn in enumerate((static, dynamic)):
            kernels[i] = min(kernels[i], sum(us for _, us in kernel_times(torch, lambda: fn(*device))) / 1e6)
            calls[i] = min(calls[i], back_to_back_ms(lambda: fn(*device)) / 1e3)
    return kernels[0], kernels[1], max(errors), calls[0], calls[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    args = parser.parse_args(argv)
    gpu = args.device == "gpu"
    lt.set_num_threads(args.threads)
    width, sizes, measure = (GPU_WIDTH, GPU_SIZES, _gpu_row) if gpu else (WIDTH, SIZES, _cpu_row)
    static = _functions(lt.symbols("b")[0], width, gpu)
    dynamic = _functions(lt.symbols("b", dynamic=True)[0], width, gpu)
    rng = np.random.default_rng(0)
    rows = []
    for name in static:
        for size in sizes:
            arrays, reference = _inputs(name, size, width, rng)
            static_s, dynamic_s, error, *calls = measure(static[name], dynamic[name], arrays, reference)
            rows.append({"workload": name, "batch": size, "static_us": static_s * 1e6, "dynamic_us": dynamic_s * 1e6,
                         "ratio": static_s / dynamic_s, "max_rel_error": error,
                         **({"static_call_us": calls[0] * 1e6, "dynamic_call_us": calls[1] * 1e6} if calls else {})})
    kernels = {name: len(fn._calls) for name, fn in dynamic.items()}
    machine = runtime_gpu.gpu_target().name if gpu else f"{args.threads} thread(s), {cpu_name()}"
    timed = "the kernels' device time a call (torch's profiler); a call: back to back, by CUDA events" if gpu \
        else "median"
    calls = " static call µs | dynamic call µs |" if gpu else ""
    lines = [f"Dynamic vs static batch dim, {machine}; µs a call ({timed}), ratio = static / dynamic",
             "", f"| workload | batch | static µs | dynamic µs | ratio | max rel. error |{calls}",
             "| --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if gpu else ""),
             *[f"| {r['workload']} | {r['batch']} | {r['static_us']:.1f} | {r['dynamic_us']:.1f} | {r['ratio']:.3f} | "
               f"{r['max_rel_error']:.1e} |" + (f" {r['static_call_us']:.1f} | {r['dynamic_call_us']:.1f} |" if gpu else "")
               for r in rows], "",
             f"Dynamic functions compiled {kernels} kernel(s) for the {len(sizes)} sizes."]
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        name = "dynamic_sizes_gpu" if gpu else \
            "dynamic_sizes" if args.threads == 1 else f"dynamic_sizes_{args.threads}threads"
        (args.out / f"{name}.json").write_text(json.dumps({"machine": machine, "threads": args.threads, "rows": rows,
                                                          "kernels": kernels}, indent=1))
        (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
