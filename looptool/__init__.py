"""looptool: named-dimension tensors compiled to loop nests, scheduled, checked and tuned."""
from .frontend import (Symbol, Symbols, Tensor, abs, concat, exp, log, maximum, minimum, reciprocal, relu,
                       sqrt, symbols)
from . import ir
from .errors import ArtifactError, IllegalScheduleError
from .looptree import LoopTree
from .runtime import Kernel, cache_info, clear_cache, get_num_threads, interpret, set_num_threads
from .export import export, load
from .schedule import Schedule

__version__ = "0.1.0"

__all__ = [
    "Symbol", "Symbols", "Tensor", "symbols", "concat", "exp", "log", "sqrt", "abs", "reciprocal", "relu",
    "maximum", "minimum", "LoopTree", "Schedule", "IllegalScheduleError", "ArtifactError", "export", "load", "Kernel", "cache_info", "clear_cache", "interpret", "set_num_threads",
    "get_num_threads",
]
