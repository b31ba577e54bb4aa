"""`python -m looptool`: the demo — matmul as (a * b).sum(k), its default loop tree and the automatic
schedule for this CPU, checked and timed next to NumPy."""
from __future__ import annotations

import argparse
import time

import numpy as np
from threadpoolctl import threadpool_limits

import looptool as lt


def _median_time(fn, repeat: int = 20) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def demo(m: int = 200, k: int = 300, n: int = 500) -> None:
    """Build matmul from named dims, print its default loop tree and the automatic schedule for this CPU
    with the reason for each choice, check both against NumPy and time them next to NumPy."""
    rng = np.random.default_rng(0)
    a_np = rng.standard_normal((m, k), dtype=np.float32)
    b_np = rng.standard_normal((k, n), dtype=np.float32)
    s = lt.symbols("m k n")
    a = lt.Tensor(a_np).to(s.m, s.k)
    b = lt.Tensor(b_np).to(s.k, s.n)
    c = (a * b).sum(s.k)
    print(f"c = (a * b).sum(k) with a: {a.shape}, b: {b.shape} -> c.dims={c.dims}, c.shape={c.shape}\n")
    default = c.loop_tree()
    print("loop tree (default schedule):")
    print(default)
    start = time.perf_counter()
    automatic = lt.auto_schedule(c)
    chosen_in = time.perf_counter() - start
    print(f"\nautomatic schedule for this CPU (chosen in {chosen_in:.2f} s, what c.numpy() runs), and why:")
    print(automatic.explain())
    print(automatic)
    print(f"isl verdict: {automatic.check()[1]}")
    print(f"and for parallel k instead: {default.parallel('k').check()[1]}\n")
    ref = a_np.astype(np.float64) @ b_np.astype(np.float64)
    flops = 2.0 * m * k * n
    threads = lt.get_num_threads()
    with threadpool_limits(threads):
        theirs = _median_time(lambda: a_np @ b_np)
    worst = 0.0
    _, arrays = lt.ir.lower(c.node)
    for label, tree in (("default schedule", default), ("automatic", automatic)):
        kernel = c.compile(tree)
        err = float(np.abs(c.numpy(tree) - ref).max() / np.abs(ref).max())
        worst = max(worst, err)
        ours = _median_time(lambda: kernel(arrays))
        print(f"looptool, {label:16s}: {ours * 1e3:7.3f} ms {flops / ours / 1e9:7.1f} GFLOP/s  "
              f"(compiled in {kernel.compile_seconds * 1e3:.0f} ms, max rel. error vs NumPy float64 {err:.1e})")
    print(f"NumPy a @ b (BLAS, {threads} thread{'s' if threads > 1 else ''}){' ' * (9 - len(str(threads)))}: "
          f"{theirs * 1e3:7.3f} ms {flops / theirs / 1e9:7.1f} GFLOP/s")
    if worst >= 1e-5:
        raise SystemExit("result does not match NumPy")


def _parse_gpus(text: str | None) -> list[int] | None:
    """`--gpus all` (every GPU of this host) or a comma-separated list of GPU numbers, as a list."""
    if text is None:
        return None
    if text == "all":
        from looptool.runtime import gpu
        return list(range(gpu.cupy().cuda.runtime.getDeviceCount()))
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise SystemExit(f"--gpus takes 'all' or GPU numbers such as 0,1,2; got {text!r}") from None


def tune_command(args) -> None:
    """`looptool tune WORKLOAD ...`: tune with Optuna, print the summary, write plots."""
    from tuner import report, study, workloads

    work = workloads.resolve(args.workload)
    result = study.tune(work.tensor, trials=args.trials, timeout=args.timeout, storage=args.storage,
                        study_name=args.study, sampler=args.sampler, seed=args.seed, jobs=args.jobs,
                        threads=args.threads, device=args.device, transfer=args.transfer,
                        sizes=_parse_sizes(args.sizes), gpus=_parse_gpus(args.gpus))
    # a dynamic program's times are per row, over several sizes: no one NumPy time compares
    measured_once = "measured_sizes" not in result.study.user_attrs
    baseline = _median_time(work.baseline, 10) if work.baseline and args.device == "cpu" and measured_once else None
    print(result.summary(baseline))
    if args.plots:
        for path in report.save_plots(result.study, args.plots):
            print(f"wrote {path}")


def _parse_sizes(specs: list[str] | None) -> dict[str, list[int]] | None:
    """`--sizes b=1,64,1000` (once per dynamic dim) as {"b": [1, 64, 1000]}; None when not given."""
    if not specs:
        return None
    sizes = {}
    for spec in specs:
        dim, _, values = spec.partition("=")
        try:
            sizes[dim.strip()] = [int(v) for v in values.split(",")]
        except ValueError:
            raise ValueError(f"--sizes {spec!r}: write DIM=SIZE,SIZE,... (e.g. b=1,64,1000)") from None
    return sizes


def export_command(args) -> None:
    """`looptool export WORKLOAD OUT`: write a kernel artifact (tuned schedule if one is stored)."""
    from tuner import workloads

    work = workloads.resolve(args.workload)
    schedule = open(args.schedule).read() if args.schedule else None
    path = lt.export(work.tensor, args.out, schedule, input_names=args.names, device=args.device, arch=args.arch)
    print(f"exported {args.workload} to {path}: {', '.join(sorted(p.name for p in path.iterdir()))}")


def run_command(args) -> None:
    """`looptool run ARTIFACT IN.npy... --output OUT.npy`: run an exported kernel (CPU or GPU) on .npy
    files; the time includes a GPU result's copy to the host."""
    kernel = lt.load(args.artifact, rebuild=args.rebuild)
    arrays = [np.load(p) for p in args.inputs]
    start = time.perf_counter()
    out = kernel(*arrays)
    out = out if isinstance(out, np.ndarray) else out.get()
    elapsed = time.perf_counter() - start
    np.save(args.output, out)
    print(f"ran {args.artifact} in {elapsed * 1e3:.3f} ms; wrote {args.output} "
          f"(dims {tuple(kernel.output['dims'])}, shape {out.shape}, {out.dtype})")


def main(argv=None) -> None:
    """Command-line entry point: `looptool [demo]` or `looptool tune WORKLOAD`."""
    parser = argparse.ArgumentParser(prog="looptool", description="looptool: loop-nest compiler and tuner")
    commands = parser.add_subparsers(dest="command")
    demo_cmd = commands.add_parser("demo", help="matmul as (a * b).sum(k): default and automatic schedule, check, "
                                                "timing (default)")
    demo_cmd.add_argument("--size", nargs=3, type=int, default=(200, 300, 500), metavar=("M", "K", "N"))
    demo_cmd.add_argument("--threads", type=int, default=1, help="threads for looptool and for NumPy's BLAS")
    tune_cmd = commands.add_parser("tune", help="search schedules with Optuna")
    tune_cmd.add_argument("workload", help="matmul:512x512x512, softmax:4096x1024, layernorm:4096x1024 "
                                           "or package.module:function returning a Tensor")
    tune_cmd.add_argument("--trials", type=int, default=100, help="trials the study should hold in all")
    tune_cmd.add_argument("--timeout", type=float, default=None, help="seconds to stop after")
    tune_cmd.add_argument("--jobs", type=int, default=1, help="worker processes sharing the study")
    tune_cmd.add_argument("--storage", default=None, help="Optuna storage URL (default: SQLite in ~/.cache/looptool)")
    tune_cmd.add_argument("--study", default=None, help="study name (default: derived from the workload)")
    tune_cmd.add_argument("--sampler", default="costmodel", choices=("costmodel", "tpe", "random"),
                          help="costmodel: a learned cost model ranks many drawn schedules, the best few are measured")
    tune_cmd.add_argument("--no-transfer", dest="transfer", action="store_false",
                          help="costmodel: do not learn from the storage's other studies")
    tune_cmd.add_argument("--seed", type=int, default=None)
    tune_cmd.add_argument("--threads", type=int, default=1, help="cores each kernel may use")
    tune_cmd.add_argument("--device", default="cpu", choices=("cpu", "gpu"),
                          help="tune for this CPU or for the current NVIDIA GPU (needs looptool[gpu])")
    tune_cmd.add_argument("--gpus", default=None, help="with --device gpu: 'all' or GPU numbers (0,1,...): one "
                          "measuring process a GPU, each pinned to its GPU, on the one study")
    tune_cmd.add_argument("--plots", default=None, help="folder for history.png and importances.png")
    tune_cmd.add_argument("--sizes", action="append", default=None, metavar="DIM=N,N,...",
                          help="sizes a dynamic dim is measured at, e.g. b=1,64,1000 (once per dynamic dim; "
                               "default 16,256,2048)")
    export_cmd = commands.add_parser("export", help="write a kernel artifact (manifest, LLVM IR, object, .so/.h; or PTX)")
    export_cmd.add_argument("workload", help="as for tune")
    export_cmd.add_argument("out", help="artifact directory to write")
    export_cmd.add_argument("--schedule", default=None, help="schedule JSON file (default: tuned, else automatic)")
    export_cmd.add_argument("--names", nargs="+", default=None, help="names for the inputs")
    export_cmd.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                            help="gpu: the PTX of the GPU kernels (tuned for the GPU if stored)")
    export_cmd.add_argument("--arch", default=None, help="GPU target for --device gpu, e.g. sm_90 (default: this GPU)")
    run_cmd = commands.add_parser("run", help="run an exported kernel on .npy inputs")
    run_cmd.add_argument("artifact")
    run_cmd.add_argument("inputs", nargs="+", help=".npy files, one per kernel input")
    run_cmd.add_argument("--output", required=True, help=".npy file to write")
    run_cmd.add_argument("--rebuild", action="store_true", help="recompile the LLVM IR for this CPU")
    args = parser.parse_args(argv)
    commands_run = {"tune": tune_command, "export": export_command, "run": run_command}
    if args.command in commands_run:
        try:
            commands_run[args.command](args)
        except (ValueError, OSError) as err:
            raise SystemExit(f"looptool {args.command}: error: {err}") from None
    else:
        lt.set_num_threads(getattr(args, "threads", 1))
        demo(*getattr(args, "size", (200, 300, 500)))


if __name__ == "__main__":
    main()
