"""The scheduler's decisions as named choices: the value each rule took and the values next to it.

The automatic schedule is one point of a space: every decision the rules make (register tile,
blocks, loop order, packing, placement, parallel loop, vector width) has a name, the value the
rules chose and a few neighbouring values (halves and doubles of a block, a row more or less,
a vector more or less, the orders one swap away).  The tuner draws from these neighbourhoods,
so its draws land near the automatic schedule and the automatic schedule is one of its draws.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .model import balanced

# (name, the rules' value in the schedule built so far, its neighbours) -> the value to use.
Pick = Callable[[str, object, tuple], object]


@dataclass(frozen=True)
class Choice:
    """One named decision: the value taken and the values a search may take instead (`value` among them)."""

    value: object
    options: tuple


def automatic(name: str, value, options: tuple):
    """The pick of the automatic scheduler: the rules' own value."""
    return value


def steps_around(value: int, step: int, low: int, high: int) -> tuple[int, ...]:
    """`value` and one `step` below and above it, within [low, high]."""
    return tuple(sorted({v for v in (value - step, value, value + step) if low <= v <= high} | {value}))


def halves_and_doubles(value: int, extent: int, multiple: int = 1) -> tuple[int, ...]:
    """Block sizes next to `value` for a loop of `extent`: its half and its double, each a block
    that splits the loop evenly (`balanced`, a multiple of `multiple`), the whole loop at most."""
    near = {balanced(extent, value // 2, multiple), value, balanced(extent, value * 2, multiple)}
    return tuple(sorted(near))


def adjacent_orders(order: list[str], movable: list[str]) -> tuple[str, ...]:
    """`order` (space-separated) and every order made from it by swapping two neighbouring `movable`
    items (items that are not movable are skipped over, not swapped)."""
    present = [item for item in order if item in movable]
    out = [" ".join(order)]
    for a, b in zip(present, present[1:]):
        swapped = [b if item == a else a if item == b else item for item in order]
        out.append(" ".join(swapped))
    return tuple(out)
