"""`scripts/conformance.py`'s table, from hand-made rows."""

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
