"""All-pairs covering designs: the rows CI runs of a matrix too large to run whole.

A covering design of strength 2 holds, for every two factors, every pair of
their values in at least one row. A combination bug that needs two factors
(an optimizer and a sparse pattern, a strategy and a batch shape) shows in
CI; the full product stays a documented command.

>>> rows = all_pairs({"a": (1, 2, 3), "b": ("x", "y"), "c": (True, False)})
>>> len(rows) < 3 * 2 * 2
True
>>> sorted({(row["a"], row["b"]) for row in rows}) == [(a, b) for a in (1, 2, 3) for b in "xy"]
True
"""

import itertools
from typing import Callable, Dict, List, Optional, Sequence


def _pairs_of(row: dict, names: Sequence[str]):
    return {(first, row[first], second, row[second])
            for first, second in itertools.combinations(names, 2)}


def all_pairs(factors: Dict[str, Sequence],
              applies: Optional[Callable[[dict], bool]] = None,
              balance: Sequence[str] = (),
              needed: Optional[Callable[[tuple], bool]] = None) -> List[dict]:
    """Rows (dicts of factor -> value) covering every pair of values of
    every two factors; deterministic (greedy, in the factors' order).

    ``applies(row)``: False for a combination that does not exist (e.g. an
    option a hand-written loop does not take); such rows are never chosen,
    and a pair found in no applicable row is not asked for.

    Among rows that cover as many new pairs, the greedy takes the first, so
    the values of a factor a row is free in lean to its first value (the
    cheapest, when a factor lists its values so); for the factors named in
    ``balance`` it takes the values used least so far instead, so that
    combinations of three factors spread too.

    ``needed(pair)``: False for a pair, ``(factor, value, factor, value)``
    in the factors' order, that CI need not hold (the full product does);
    every other pair is held, and every value of every factor appears in
    some row whatever ``needed`` says (``needed=lambda pair: False``: each
    value once):

    >>> factors = {"a": tuple(range(4)), "b": tuple(range(4)), "c": (False, True)}
    >>> sum(row["c"] for row in all_pairs(factors)), sum(row["c"] for row in all_pairs(factors, balance=["c"]))
    (4, 8)

    >>> rows = all_pairs({"a": (1, 2), "b": ("x", "y")}, applies=lambda r: r != {"a": 2, "b": "y"})
    >>> sorted((row["a"], row["b"]) for row in rows)
    [(1, 'x'), (1, 'y'), (2, 'x')]
    >>> len(all_pairs({"a": tuple(range(5)), "b": tuple(range(3))}, needed=lambda pair: False))
    5
    """
    names = list(factors)
    candidates = [dict(zip(names, values)) for values in itertools.product(*factors.values())]
    if applies is not None:
        candidates = [row for row in candidates if applies(row)]
    if len(names) < 2:
        return candidates

    def units(row: dict) -> set:
        """What ``row`` covers: its pairs, and with ``needed`` each value alone."""
        if needed is None:
            return _pairs_of(row, names)
        return {pair for pair in _pairs_of(row, names) if needed(pair)} | {
            (name, row[name]) for name in names}

    uncovered = set()
    for row in candidates:
        uncovered |= units(row)
    rows, used = [], {}

    def usage(row: dict) -> int:
        return sum(used.get((name, row[name]), 0) for name in balance)

    while uncovered:
        best = max(candidates, key=lambda row: (len(units(row) & uncovered), -usage(row)))
        rows.append(best)
        uncovered -= units(best)
        for name in balance:
            used[(name, best[name])] = used.get((name, best[name]), 0) + 1
    return rows
