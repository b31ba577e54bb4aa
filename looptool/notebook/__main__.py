"""`python -m looptool.notebook [WORKLOAD]`: the schedule editor in a terminal."""
from looptool.notebook.terminal import main

if __name__ == "__main__":
    raise SystemExit(main())
