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
from typing import Dict, List, Sequence


def _pairs_of(row: dict, names: Sequence[str]):
    return {(first, row[first], second, row[second])
            for first, second in itertools.combinations(names, 2)}


def all_pairs(factors: Dict[str, Sequence]) -> List[dict]:
    """Rows (dicts of factor -> value) covering every pair of values of
    every two factors; deterministic (greedy, in the factors' order)."""
    names = list(factors)
    if len(names) < 2:
        return [dict(zip(names, values)) for values in itertools.product(*factors.values())]
    uncovered = set()
    for first, second in itertools.combinations(names, 2):
        uncovered.update((first, a, second, b) for a in factors[first] for b in factors[second])
    rows = []
    candidates = [dict(zip(names, values)) for values in itertools.product(*factors.values())]
    while uncovered:
        best = max(candidates, key=lambda row: len(_pairs_of(row, names) & uncovered))
        rows.append(best)
        uncovered -= _pairs_of(best, names)
    return rows
