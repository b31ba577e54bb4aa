"""Dynamic vs static kernels (issue 28): `python -m bench.dynamic_sizes [--out DIR]`.

Each workload is one `lt.function` written twice, over a static batch dim and over a dynamic one
(`lt.symbols("b", dynamic=True)`): the static function traces and compiles a kernel for each batch
size, scheduled for it; the dynamic one compiles one kernel, scheduled at the representative size
(`ir.REPRESENTATIVE_SIZE`), that takes the batch size as an argument. At three batch sizes both are
timed interleaved in one process (median of calls; one thread unless `--threads`) and the ratio is static
time over dynamic time (>= 0.95 is the issue's target). Results are checked against float64 first.
Writes dynamic_sizes.json and .md to `--out`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import looptool as lt

from . import timing
from .peers import cpu_name

SIZES = (64, 300, 1000)
WIDTH = 256


def _functions(batch):
    """The workloads over batch dim `batch`: name -> (lt.function, its inputs at batch size B, reference)."""
    k, n = lt.symbols("k n")

    @lt.function
    def layer(x: lt.In[batch, k], w: lt.In[k, n]):
        return lt.relu((x * w).sum(k))

    @lt.function
    def softmax(x: lt.In[batch, n]):
        e = (x - x.max(n)).exp()
        return e / e.sum(n)
    return {"relu(x @ w), k = n = 256": layer, "row softmax, n = 256": softmax}


def _inputs(name: str, size: int, rng) -> tuple[list[np.ndarray], np.ndarray]:
    """The arrays of a workload at batch size `size` and its float64 reference result."""
    x = rng.standard_normal((size, WIDTH)).astype(np.float32)
    if name.startswith("relu"):
        w = rng.standard_normal((WIDTH, WIDTH)).astype(np.float32)
        return [x, w], np.maximum(x.astype(np.float64) @ w, 0)
    e = np.exp(x - x.max(1, keepdims=True).astype(np.float64))
    return [x], e / e.sum(1, keepdims=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    lt.set_num_threads(args.threads)
    static = _functions(lt.symbols("b")[0])
    dynamic = _functions(lt.symbols("b", dynamic=True)[0])
    rng = np.random.default_rng(0)
    rows = []
    for name in static:
        for size in SIZES:
            arrays, reference = _inputs(name, size, rng)
            errors = [float(np.abs(fn(*arrays) - reference).max() / np.abs(reference).max())
                      for fn in (static[name], dynamic[name])]
            times = timing.interleaved([lambda fn=static[name]: fn(*arrays), lambda fn=dynamic[name]: fn(*arrays)],
                                       budget=3.0, min_repeat=20)
            rows.append({"workload": name, "batch": size, "static_us": times[0].median * 1e6,
                         "dynamic_us": times[1].median * 1e6, "ratio": times[0].median / times[1].median,
                         "max_rel_error": max(errors)})
    kernels = {name: len(fn._calls) for name, fn in dynamic.items()}
    lines = [f"Dynamic vs static batch dim, {args.threads} thread(s), {cpu_name()}; µs a call (median), "
             f"ratio = static / dynamic",
             "", "| workload | batch | static µs | dynamic µs | ratio | max rel. error |",
             "| --- | ---: | ---: | ---: | ---: | ---: |",
             *[f"| {r['workload']} | {r['batch']} | {r['static_us']:.1f} | {r['dynamic_us']:.1f} | {r['ratio']:.3f} | "
               f"{r['max_rel_error']:.1e} |" for r in rows], "",
             f"Dynamic functions compiled {kernels} kernel(s) for the {len(SIZES)} sizes."]
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        name = "dynamic_sizes" if args.threads == 1 else f"dynamic_sizes_{args.threads}threads"
        (args.out / f"{name}.json").write_text(json.dumps({"cpu": cpu_name(), "threads": args.threads, "rows": rows,
                                                          "kernels": kernels}, indent=1))
        (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
