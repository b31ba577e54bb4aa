"""The runtime layer: JIT-compiled CPU kernels, the kernel cache, the reference interpreter, the tuning
database and GPU launch.  Importing it installs the backend behind `Tensor.numpy()`, `.cuda()`,
`.compile()` and `.loop_tree()`."""
from types import SimpleNamespace

from ..frontend import BACKEND
from . import gpu
from .cpu import (CACHE, Kernel, KernelObject, aligned_empty, auto_schedule, cache_info, chosen_schedule, clear_cache,
                  compile_object, evaluate, get_num_threads, interpret, kernel_for, loop_tree_of, lower_on_host,
                  set_num_threads)
from .functions import Function, In, function
from .torch_ops import torch_op
from .schedules import resolve_schedule, schedule_steps
from .sizes import DynamicSizes

BACKEND.install(SimpleNamespace(evaluate=evaluate, evaluate_on_gpu=gpu.evaluate, loop_tree_of=loop_tree_of,
                                kernel_for=kernel_for, as_device=gpu.as_device,
                                is_device_array=gpu.is_device_array))

__all__ = ["CACHE", "DynamicSizes", "Kernel", "KernelObject", "compile_object", "aligned_empty", "auto_schedule", "chosen_schedule", "cache_info", "clear_cache", "evaluate", "get_num_threads",
           "interpret", "kernel_for", "loop_tree_of", "lower_on_host", "set_num_threads", "resolve_schedule",
           "schedule_steps", "gpu", "function", "Function", "In", "torch_op"]
