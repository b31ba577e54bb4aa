"""Benchmark suite for looptool: each workload with its default and best schedule, against NumPy.

Run it with `python -m bench` or `python bench/run.py` (see `--help`).  Best schedules are
data in `bench/schedules/<workload>.json` (the `Schedule.to_json()` format); a file named
`<workload>.<n>t.json` overrides it for the n-thread run.  For 1 thread, "parallel"
annotations are dropped from the schedule.  Results go to `bench/results/latest.{md,json,png}`.
"""
