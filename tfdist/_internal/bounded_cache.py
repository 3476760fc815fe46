"""A few recently made values, kept by key: what the runners reuse across
``fit`` calls (distributed datasets, per-worker iterator makers, shard
functions), bounded so a program that feeds ever new datasets does not
hold every one.

>>> cache = BoundedCache(limit=2)
>>> cache.get("a", lambda: 1), cache.get("a", lambda: 2)    # made once, then reused
(1, 1)
>>> _ = cache.get("b", lambda: 3); cache.get("c", lambda: 4)  # past the limit: cleared
4
>>> len(cache), "a" in cache
(1, False)
"""

from typing import Callable, Dict, Hashable, TypeVar

Value = TypeVar("Value")


class BoundedCache:
    """Up to ``limit`` values by key; making one more clears the others
    first (the values are cheap to remake, and a clear keeps no order)."""

    def __init__(self, limit: int = 4):
        self._limit = limit
        self._values: Dict[Hashable, object] = {}

    def get(self, key: Hashable, make: Callable[[], Value]) -> Value:
        """The value for ``key``, made with ``make()`` if it is not kept."""
        if key not in self._values:
            if len(self._values) >= self._limit:
                self._values.clear()
            self._values[key] = make()
        return self._values[key]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)
