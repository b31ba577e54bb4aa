"""Schedules as users pass them (None, a LoopTree, a Schedule or its JSON text), made concrete."""
from __future__ import annotations

import functools
import json

from .. import ir
from ..schedule import LoopTree, Schedule


def frozen_steps(value):
    """Lists (from JSON) as tuples, so schedule steps can be part of a dictionary key (steps that
    hash already are returned as they are)."""
    try:
        hash(value)
        return value
    except TypeError:
        return tuple(frozen_steps(v) for v in value) if isinstance(value, (list, tuple)) else value


@functools.lru_cache(maxsize=256)
def _json_steps(text: str) -> tuple:
    """The frozen steps of a schedule's JSON text, parsed once per text (a tuned schedule from the
    database arrives as text on every call: parsing and freezing it each time cost 0.1-0.2 ms)."""
    return frozen_steps(json.loads(text)["steps"])


def schedule_steps(schedule) -> tuple:
    """The steps of whatever a user passed as a schedule (None, LoopTree, Schedule, JSON text)."""
    if schedule is None:
        return ()
    if isinstance(schedule, LoopTree):
        return schedule.schedule.steps
    if isinstance(schedule, str):
        return _json_steps(schedule)
    return schedule.steps


def resolve_schedule(program: ir.Program, schedule) -> Schedule:
    """The Schedule of `program` for what a user passed (None: the default schedule)."""
    if schedule is None:
        return Schedule.default(program)
    if isinstance(schedule, LoopTree):
        schedule = schedule.schedule
    if isinstance(schedule, str):
        return Schedule.from_json(schedule, program)
    return Schedule.default(program).apply(schedule.steps)
