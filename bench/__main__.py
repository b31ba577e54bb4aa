"""`python -m bench`: run the benchmark suite."""
from bench.suite import main

if __name__ == "__main__":
    raise SystemExit(main())
