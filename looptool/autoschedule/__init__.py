"""The automatic scheduler (a layer between analysis and codegen): a fast schedule for any program on
this CPU, derived from the program's structure and the target model, with no measurement.
Importing it installs `LoopTree.auto()`."""
from ..schedule import AUTOSCHEDULE
from . import model, scheduler, structure
from .scheduler import auto_tree

AUTOSCHEDULE.install(scheduler)

__all__ = ["auto_tree", "model", "scheduler", "structure"]
