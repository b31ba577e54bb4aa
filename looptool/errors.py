"""Exceptions users catch, importable without islpy or optuna."""


class IllegalScheduleError(ValueError):
    """A schedule that would break a dependence; the message says which one and where."""


class ArtifactError(ValueError):
    """An exported kernel that cannot be loaded or called as asked; the message says why."""


class TargetError(ValueError):
    """A CPU named by `LOOPTOOL_CPU` (or caches by `LOOPTOOL_CPU_CACHES`) that LLVM does not know or this
    host cannot run; the message names the variable and its value."""
