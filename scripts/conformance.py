"""Runs the full conformance matrix and writes its table.

    python scripts/conformance.py [--clusters] [--axes] [--parts=K [--first_part=I]]
                                  [--output_dir=conformance_results]

Runs ``pytest tests/conformance --conformance=full`` (every model family of
the zoo x one device and Mirrored on 2, 3 and 4 replicas x even, uneven
partial and tiny last batches x attach / Trainer / custom loop; with
``--clusters`` also 2 MultiWorkerMirrored workers and 1 worker + 1 ps; with
``--axes`` also the axes of ``tests/conformance/test_axes.py``), each
test appending a row to a report, then writes the table
``<output_dir>/conformance.md`` (the one on the docs site) and the rows as
``conformance.json``. Exits with pytest's code (the first failing part's).

``--parts=K`` runs the tests in K parts, each a fresh pytest process
(every K-th test, from the I-th: ``pytest --conformance-part=I/K``), one
after another: a test worker that runs thousands of combinations keeps
growing (each traces its own models; the figures are on the Conformance
page), a fresh one per part stays small. ``--first_part=I`` goes on
from part I of a run stopped part-way, keeping the rows written so far.
"""

import collections
import json
import os
import pathlib
import subprocess
import sys

from absl import app, flags

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.bench.outputs import write_results  # noqa: E402


STRATEGY_ORDER = ["one_device", "mirrored_2", "mirrored_3", "mirrored_4", "multi_worker_2",
                  "ps_1_worker"]
ENTRY_ORDER = ["attach", "trainer", "custom_loop"]


def table(rows) -> str:
    """One line per family; a column per strategy x entry point, each cell
    the largest weight difference from one device over the batch shapes
    that ran, or what stopped it."""
    present = {(r["strategy"], r["entry"]) for r in rows if r["outcome"] != "n/a"}
    columns = sorted(present, key=lambda column: (
        STRATEGY_ORDER.index(column[0]) if column[0] in STRATEGY_ORDER else len(STRATEGY_ORDER),
        column[0], ENTRY_ORDER.index(column[1]) if column[1] in ENTRY_ORDER else 0))
    cells = collections.defaultdict(list)
    for row in rows:
        cells[(row["case"], row["strategy"], row["entry"])].append(row)
    header = "| family | " + " | ".join(f"{s} {e}" for s, e in columns) + " |"
    lines = [header, "|" + "---|" * (len(columns) + 1)]
    for case in dict.fromkeys(r["case"] for r in rows):
        values = []
        for strategy, entry in columns:
            found = cells.get((case, strategy, entry), [])
            outcomes = {r["outcome"] for r in found}
            if not found or outcomes == {"n/a"}:
                values.append("n/a")
            elif "failed" in outcomes:
                values.append("**failed**")
            elif "warned" in outcomes:
                values.append("warned")
            else:
                worst = max(r["difference"] for r in found if r["outcome"] == "passed")
                values.append(f"{worst:.0e} ({len(found)})")
        lines.append(f"| {case} | " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


def define_flags() -> None:
    """The flags; defined when this runs as a program (a test imports the
    module for `table`)."""
    flags.DEFINE_string("output_dir", "conformance_results", "Where the table and rows go.")
    flags.DEFINE_bool("clusters", False,
                      "Also the real-cluster columns (several minutes per family).")
    flags.DEFINE_bool("axes", False,
                      "Also the axes beyond families (optimizers x gradient patterns x sharding "
                      "stages, loss / metric / model forms, input containers x feeds, each "
                      "crossed with strategies, batch shapes and entry points): thousands of "
                      "combinations, hours on 2 cores (use --parts).")
    flags.DEFINE_integer("parts", 1, "Run the tests in this many fresh processes, in turn.")
    flags.DEFINE_integer("first_part", 1, "Start at this part (1-based), keeping the rows of "
                         "the parts before it.")


def main(argv) -> int:
    del argv  # every option is a flag
    args = flags.FLAGS
    output_dir = pathlib.Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    report = output_dir / "rows.jsonl"
    if not 1 <= args.first_part <= args.parts:
        raise app.UsageError(f"--first_part={args.first_part} must be in 1..{args.parts}")
    if args.first_part == 1:
        report.unlink(missing_ok=True)
    tests = ["tests/conformance/test_zoo.py"]
    if args.clusters:
        tests.append("tests/conformance/test_clusters.py")
    if args.axes:
        tests.append("tests/conformance/test_axes.py")
    env = dict(os.environ, TFDIST_CONFORMANCE_REPORT=str(report.resolve()))
    code = 0
    for part in range(args.first_part, args.parts + 1):
        selected = [] if args.parts == 1 else [f"--conformance-part={part}/{args.parts}"]
        print(f"conformance: part {part} of {args.parts}", flush=True)
        part_code = subprocess.call([sys.executable, "-m", "pytest", "-q", "--conformance=full",
                                     "-n", "2", "--dist", "load", *selected, *tests],
                                    cwd=REPO, env=env)
        code = code or part_code
    rows = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    write_results(str(output_dir), "conformance", {"rows": rows}, table(rows))
    print((output_dir / "conformance.md").read_text())
    return code


if __name__ == "__main__":
    define_flags()
    app.run(main)
