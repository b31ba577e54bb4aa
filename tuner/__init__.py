"""The looptool tuner: Optuna searches over legal schedules, measured in isolated workers."""
from .study import TuneResult, default_storage, tune
from .worker import MeasureError, Measurer

__all__ = ["tune", "TuneResult", "default_storage", "Measurer", "MeasureError"]
