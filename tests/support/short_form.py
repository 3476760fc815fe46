"""Parametrizations of which CI runs a part: the rest is marked to run
with ``--full`` (or ``--conformance=full``), a documented command.

>>> rows = in_turn([("adam",), ("sgd",), ("lion",)], (4, 3))
>>> [row.values for row in rows if not row.marks]
[('adam', 4), ('sgd', 3), ('lion', 4)]
>>> len(rows)
6
>>> [bool(row.marks) for row in only([1, 2, 4], in_ci=(4,))]
[True, True, False]
"""

from typing import Sequence

import pytest


def in_turn(values: Sequence, counts: Sequence, mark=pytest.mark.full_form, ids=None) -> list:
    """Every value (a tuple of arguments) with every count (last argument);
    the short form keeps each value once, at the counts in turn, so every
    value and every count stays in CI. ``ids``: one name per value."""
    rows = []
    for turn, value in enumerate(values):
        value = value if isinstance(value, tuple) else (value,)
        for count in counts:
            marks = [] if count == counts[turn % len(counts)] else [mark]
            name = None if ids is None else f"{ids[turn]}-{count}"
            rows.append(pytest.param(*value, count, marks=marks, id=name))
    return rows


def only(values: Sequence, in_ci: Sequence, mark=pytest.mark.full_form) -> list:
    """``values`` of one parameter, of which CI runs those ``in_ci`` (the
    rest with ``--full``): for a test whose other values another test in
    CI already runs (a replica count, a signal)."""
    missing = [value for value in in_ci if value not in values]
    if missing:
        raise ValueError(f"in_ci names {missing}, which are not among {list(values)}")
    return [pytest.param(value, marks=[] if value in in_ci else [mark]) for value in values]
