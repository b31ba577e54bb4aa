"""Benchmark suite for looptool: each workload with its default, automatic and best schedule, against NumPy.

Run it with `python -m bench` or `python bench/run.py` (see `--help`).  The best schedule is the
faster of the automatic one and the schedule `looptool tune` stored for this CPU in the tuning
database, when there is one.  Results go to `bench/results/latest.{md,json,png}`.
"""
