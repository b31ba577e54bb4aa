"""The process's one thread pool for parallel loops, compiled once and shared by every kernel."""
from __future__ import annotations

import threading

import llvmlite.binding as llvm

from ..codegen import threadpool
from ..codegen.cpu import HostTarget

_LOCK = threading.Lock()
_ENGINES: list = []     # the pool's JIT engine, kept for the life of the process: workers run its code


def ensure_loaded() -> None:
    """Compile the pool (first call only) and publish `looptool_parallel_for` to the JIT linker, so
    kernels compiled or loaded afterwards resolve it."""
    with _LOCK:
        if _ENGINES:
            return
        target = HostTarget.get()
        machine = target.new_machine()
        module = target.optimize(str(threadpool.pool_module(target.triple)), machine)
        engine = llvm.create_mcjit_compiler(module, machine)
        engine.finalize_object()
        llvm.add_symbol(threadpool.ENTRY, engine.get_function_address(threadpool.ENTRY))
        _ENGINES.append(engine)
