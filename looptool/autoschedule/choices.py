"""The scheduler's decisions as named choices: the value each rule took and the values next to it.

The automatic schedule is one point of a space: every decision the rules make (register tile,
blocks, loop order, packing, placement, parallel loop, vector width) has a name, the value the
rules chose and the values within REACH steps of it (a quarter to four times a block, two rows
or two vectors more or less), or the orders one swap away.  The tuner draws from these
neighbourhoods, so its draws land near the automatic schedule and the automatic schedule is one
of its draws.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .model import balanced

# (name, the rules' value in the schedule built so far, its neighbours) -> the value to use.
Pick = Callable[[str, object, tuple], object]
# Steps (halvings or doublings of a block) a neighbourhood reaches on each side of the rules' value.
# One step left small spaces that a 128-trial study exhausted (a 4096x64x64 matmul: 144 schedules),
# and left out a register tile of two rows more, a whole 64-long reduction in two quarters, ...
REACH = 2


@dataclass(frozen=True)
class Choice:
    """One named decision: the value taken and the values a search may take instead (`value` among them)."""

    value: object
    options: tuple


def automatic(name: str, value, options: tuple):
    """The pick of the automatic scheduler: the rules' own value."""
    return value


def steps_around(value: int, step: int, low: int, high: int) -> tuple[int, ...]:
    """`value` and up to REACH `step`s below and above it, within [low, high]."""
    near = {value + r * step for r in range(-REACH, REACH + 1)}
    return tuple(sorted({v for v in near if low <= v <= high} | {value}))


def halves_and_doubles(value: int, extent: int, multiple: int = 1) -> tuple[int, ...]:
    """Block sizes next to `value` for a loop of `extent`: its halves and doubles up to REACH times
    (a quarter to four times it), each a block that splits the loop evenly (`balanced`, a multiple
    of `multiple`), the whole loop at most."""
    near = {value} | {balanced(extent, max(1, value >> r), multiple) for r in range(1, REACH + 1)} | \
        {balanced(extent, value << r, multiple) for r in range(1, REACH + 1)}
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
