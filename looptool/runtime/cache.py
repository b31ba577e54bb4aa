"""The kernel cache shared by the CPU and GPU runtimes: compiled kernels keyed by structure."""
from __future__ import annotations

import threading

from .. import ir
from ..analysis import legality
from ..schedule import LoopTree
from .schedules import frozen_steps


class KernelCache:
    """Compiled kernels keyed by structure: program (graph, shapes, strides, dtypes), schedule and
    the target variant (`variant()`: thread count on the CPU, architecture on a GPU)."""

    def __init__(self, compile_tree, variant):
        self._compile, self._variant = compile_tree, variant
        self._kernels: dict = {}
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, tree: LoopTree):
        """The kernel of a loop tree, compiled (after the legality check) on the first request."""
        return self.get_for(tree.program, tree.schedule.steps, lambda: tree)

    def get_for(self, program: ir.Program, steps, make_tree):
        """The kernel of `program` under schedule `steps`; `make_tree()` is only called on a miss,
        so a cached computation costs no schedule replay and no tree building."""
        key = (program, frozen_steps(steps), self._variant())
        with self._lock:
            kernel = self._kernels.get(key)
            if kernel is not None:
                self.hits += 1
                return kernel
            self.misses += 1
        tree = make_tree()
        if tree.schedule.steps:
            legality.assert_legal(tree)
        kernel = self._compile(tree)
        with self._lock:
            self._kernels[key] = kernel
        return kernel

    def clear(self):
        with self._lock:
            self._kernels.clear()
            self.hits = self.misses = 0
