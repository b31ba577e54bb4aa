"""`python bench/run.py`: the same as `python -m bench`, runnable as a script from anywhere."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.suite import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
