"""The automatic scheduler (a layer between analysis and codegen): a fast schedule for any program on
this CPU, derived from the program's structure and the target model, with no measurement.
Importing it installs `LoopTree.auto()`."""
from ..schedule import AUTOSCHEDULE
from . import choices, model, scheduler, structure
from .choices import Choice
from .scheduler import auto_tree, automatic_choices, drawn_tree

AUTOSCHEDULE.install(scheduler)

__all__ = ["Choice", "auto_tree", "automatic_choices", "choices", "drawn_tree", "model", "scheduler", "structure"]
