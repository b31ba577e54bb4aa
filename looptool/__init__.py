"""looptool: named-dimension tensors compiled to loop nests, scheduled, checked and tuned.

The package is layered (see docs/architecture.md); importing it imports every layer,
which installs the hooks through which `Tensor.numpy()` reaches the runtime and
`LoopTree.check()` reaches the isl analysis."""
from . import analysis, autoschedule, ir, runtime
from .errors import ArtifactError, IllegalScheduleError, TargetError
from .export import export, load
from .frontend import (Symbol, Symbols, Tensor, abs, bfloat16, concat, erf, exp, float16, float32, float64, log,
                       maximum, minimum, reciprocal, relu, sqrt, symbols, tanh)
from .runtime import (Function, In, Kernel, torch_op, auto_schedule, cache_info, clear_cache, function, get_num_threads,
                      interpret, set_num_threads)
from .schedule import LoopTree, Schedule
from .version import __version__

__all__ = [
    "Symbol", "Symbols", "Tensor", "symbols", "concat", "exp", "log", "tanh", "erf", "sqrt", "abs", "reciprocal", "relu",
    "maximum", "minimum", "float16", "bfloat16", "float32", "float64", "LoopTree", "Schedule",
    "IllegalScheduleError", "ArtifactError", "TargetError", "export", "load", "auto_schedule",
    "Kernel", "function", "Function", "In", "torch_op", "cache_info", "clear_cache", "interpret", "set_num_threads", "get_num_threads", "analysis",
    "autoschedule", "ir", "runtime", "__version__",
]
