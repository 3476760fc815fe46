"""`scripts/conformance.py`'s table, from hand-made rows, and its parts."""

import importlib.util
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("conformance_script",
                                               REPO / "scripts" / "conformance.py")
script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(script)


def test_the_table_shows_the_worst_difference_and_what_failed_or_warned():
    rows = [
        dict(case="cnn", strategy="mirrored_2", entry="attach", outcome="passed", difference=2e-8),
        dict(case="cnn", strategy="mirrored_2", entry="attach", outcome="passed", difference=6e-7),
        dict(case="gan", strategy="mirrored_2", entry="attach", outcome="failed", error="x"),
        dict(case="bn", strategy="mirrored_2", entry="attach", outcome="warned"),
        dict(case="gan", strategy="mirrored_2", entry="trainer", outcome="n/a"),
    ]
    lines = script.table(rows).splitlines()
    assert lines[0] == "| family | mirrored_2 attach |"  # the n/a-only column is left out
    assert lines[2:] == ["| cnn | 6e-07 (2) |", "| gan | **failed** |", "| bn | warned |"]


def test_the_parts_of_a_run_cover_every_test_once():
    """``--conformance-part=I/K`` (`scripts/conformance.py --parts=K`): the
    K parts are disjoint and together the whole collection; a bad part is
    a usage error."""
    import types  # pylint: disable=import-outside-toplevel

    import pytest  # pylint: disable=import-outside-toplevel

    from tests import conftest  # pylint: disable=import-outside-toplevel

    collected = [f"test_{number}" for number in range(11)]
    deselected = []
    config = types.SimpleNamespace(hook=types.SimpleNamespace(
        pytest_deselected=lambda items: deselected.extend(items)))
    parts = []
    for index in (1, 2, 3):
        items = list(collected)
        conftest._keep_part(config, items, f"{index}/3")  # pylint: disable=protected-access
        parts.append(items)
    assert parts[0] == ["test_0", "test_3", "test_6", "test_9"]
    assert sorted(sum(parts, []), key=collected.index) == collected
    assert len(deselected) == 2 * len(collected)
    for bad in ("0/3", "4/3", "two"):
        with pytest.raises(pytest.UsageError, match="give I/K"):
            conftest._keep_part(config, list(collected), bad)  # pylint: disable=protected-access
