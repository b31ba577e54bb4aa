"""A bounded memo: values computed once per key, the oldest forgotten past a limit."""
from __future__ import annotations


class BoundedMemo:
    """Values by key, each computed on its first request; past `limit` entries the oldest is dropped."""

    def __init__(self, limit: int):
        self.limit = limit
        self._values: dict = {}

    def get(self, key, compute):
        """The value remembered for `key`, or `compute()` remembered now."""
        if key not in self._values:
            if len(self._values) >= self.limit:
                self._values.pop(next(iter(self._values)))
            self._values[key] = compute()
        return self._values[key]
