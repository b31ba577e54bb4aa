"""The looptool tuner: Optuna searches over legal schedules, measured in isolated workers."""
from .study import TuneResult, default_storage, tune, tune_program
from .worker import MeasureError, Measurer

__all__ = ["tune", "tune_program", "TuneResult", "default_storage", "Measurer", "MeasureError"]
