"""Where a call finds the sizes of its dynamic dims: the first axis of the arrays that have them."""
from __future__ import annotations

import numpy as np

from .. import ir


class DynamicSizes:
    """Dynamic dims (`dims`, with their minimum sizes) and where a call finds their sizes: the first
    axis of every input whose first dim it is (`first_dims`, one per input, None for a fixed one). The
    inputs are found in a call's arrays at `positions` (default: in order) and named by `labels` in the
    errors, which are `error`s."""

    def __init__(self, dynamic, first_dims: list, labels: list[str], positions: list | None = None,
                 error: type = ValueError):
        self.dims = [dim for dim, _ in dynamic]
        self.minimum, self.error = dict(dynamic), error
        positions = positions or list(range(len(first_dims)))
        self.sources = [[(position, label) for first, label, position in zip(first_dims, labels, positions)
                         if first == dim] for dim in self.dims]
        # per dim: (where its size is read, where it must be the same, its minimum): a call's only work
        self._reads = [(sources[0][0], tuple(p for p, _ in sources[1:]), self.minimum[dim])
                       for dim, sources in zip(self.dims, self.sources)]

    @classmethod
    def of_program(cls, program: ir.Program, labels: list[str], positions: list | None = None) -> "DynamicSizes":
        """The dynamic dims of a program, read from its inputs (named by `labels`)."""
        return cls(program.dynamic, [buf.dims[0] if buf.dims else None for buf in program.inputs], labels, positions)

    def of(self, arrays: list[np.ndarray]) -> list[int]:
        """The size of each dynamic dim in a call on `arrays` (their ranks already checked by the caller): an
        error naming the arrays and sizes where inputs sharing a dim disagree, or where one is below the dim's
        minimum."""
        sizes = []
        for first, others, minimum in self._reads:
            size = arrays[first].shape[0]
            if size < minimum:
                self._refuse(arrays)
            for other in others:
                if arrays[other].shape[0] != size:
                    self._refuse(arrays)
            sizes.append(size)
        return sizes

    def _refuse(self, arrays: list[np.ndarray]):
        """Raise the error that says which dim's size a call gets wrong, and where."""
        for dim, sources in zip(self.dims, self.sources):
            index, label = sources[0]
            size = arrays[index].shape[0]
            for other, other_label in sources[1:]:
                if arrays[other].shape[0] != size:
                    raise self.error(f"dim '{dim}' has size {size} in {label} (shape {tuple(arrays[index].shape)}) "
                                     f"but {arrays[other].shape[0]} in {other_label} (shape "
                                     f"{tuple(arrays[other].shape)}); arrays that share a dim must agree in its size")
            if size < self.minimum[dim]:
                raise self.error(f"dynamic dim '{dim}' has size {size} in {label} (shape "
                                 f"{tuple(arrays[index].shape)}); this kernel takes sizes from {self.minimum[dim]} up")

    def template(self, shape) -> tuple:
        """A planned shape as (the shape, None, 1) where its sizes are fixed, or as (its axes after the first,
        the index in `of`'s sizes of the first's, its divisor) where that axis is dynamic (an `ir.Size`,
        ceil(n / divisor), or a dim's name in a manifest, 'dim/divisor'): `at` gives it at a call's sizes."""
        first = shape[0] if len(shape) else None
        if isinstance(first, ir.Size):
            return tuple(shape[1:]), self.dims.index(first.dim), first.divisor
        if isinstance(first, str):
            dim, _, divisor = first.partition("/")
            return tuple(shape[1:]), self.dims.index(dim), int(divisor or 1)
        return tuple(shape), None, 1

    @staticmethod
    def at(template: tuple, sizes: list[int]) -> tuple[int, ...]:
        """A `template` shape at a call's sizes."""
        rest, index, divisor = template
        return rest if index is None else (-(-sizes[index] // divisor),) + rest
