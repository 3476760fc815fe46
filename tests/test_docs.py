"""The documentation's code runs: every ```python block of README.md and
docs/**/*.md is executed, each in a Python process of its own (so each
makes its own strategy before TensorFlow starts; forked from one that has
imported TensorFlow, Keras and tfdist and run nothing,
`tests.support.preloaded`), in an empty directory, on CPUs.

A block that cannot run here (it needs a cluster, a TPU, a cloud account or
another program's names, or is a fragment) carries a marker on the last
non-blank line before its fence, with the reason:

    <!-- no-run: needs a Cloud TPU -->

A marker without a reason is itself a failure. Runnable blocks must be
small: a tiny model, a few epochs, a few seconds on a CPU. None starts other
processes, so they run in the parallel pass; a block that starts a cluster
belongs behind a no-run marker (its program has its own test).

The README is also held to being a front door: at most 150 lines, the
first runnable example within its first 100, and its tables shown on the
site's home page from the README itself (`docs/_ext/readme_sections.py`).
"""

import os
import pathlib
import re
import sys
from typing import List, NamedTuple, Optional

import pytest

from tests.support import preloaded

REPO = pathlib.Path(__file__).resolve().parents[1]
TIMEOUT_SECONDS = 300
README_MAX_LINES = 150
README_FIRST_EXAMPLE_BY_LINE = 100

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
_NO_RUN = re.compile(r"^<!--\s*no-run\b:?(.*?)-->\s*$")


class Block(NamedTuple):
    page: pathlib.Path
    line: int  # of the opening fence, 1-based
    code: str
    no_run: Optional[str]  # None: runs; else the marker's reason ("" if missing)

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def pages() -> List[pathlib.Path]:
    return [REPO / "README.md"] + sorted((REPO / "docs").rglob("*.md"))


def _marker(text_before: str) -> Optional[str]:
    """The no-run reason on the last non-blank line before a fence, if any."""
    lines = [line.strip() for line in text_before.splitlines() if line.strip()]
    match = _NO_RUN.match(lines[-1]) if lines else None
    return None if match is None else match.group(1).strip()


def blocks() -> List[Block]:
    found = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            found.append(Block(page, text.count("\n", 0, match.start()) + 1, match.group(1),
                               _marker(text[:match.start()])))
    return found


RUNNABLE = [block for block in blocks() if block.no_run is None]


@pytest.fixture(scope="module")
def preloaded_python():
    """One process per test worker with TensorFlow, Keras and tfdist
    imported, forked for each example (`tests.support.preloaded`)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)  # an example is one process, not a cluster task
    process = preloaded.Preloaded(env)
    yield process
    process.close()


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.name for block in RUNNABLE])
def test_docs_example_runs(block, tmp_path, preloaded_python):
    code, output = preloaded_python.run(block.code, str(tmp_path), TIMEOUT_SECONDS)
    if code is None:
        pytest.fail(f"{block.name} ran over {TIMEOUT_SECONDS} s; last output:\n{output[-4000:]}")
    assert code == 0, f"{block.name} exited with {code}:\n{output[-6000:]}"


def test_a_failing_example_is_reported_as_python_would(tmp_path, preloaded_python):
    """What a fresh ``python -c`` gives: an uncaught exception's traceback
    and exit code 1, ``sys.exit``'s code, output written by threads the
    program left running (joined at exit, as the interpreter does)."""
    assert preloaded_python.run("print('fine')", str(tmp_path), 60) == (0, "fine\n")
    code, output = preloaded_python.run("raise ValueError('not fine')", str(tmp_path), 60)
    assert code == 1 and "ValueError: not fine" in output, output
    assert preloaded_python.run("import sys; sys.exit(3)", str(tmp_path), 60)[0] == 3
    threaded = ("import threading, time\n"
                "threading.Thread(target=lambda: (time.sleep(0.5), print('joined'))).start()")
    assert preloaded_python.run(threaded, str(tmp_path), 60) == (0, "joined\n")
    assert preloaded_python.run("import time; time.sleep(30)", str(tmp_path), 1)[0] is None


def test_every_no_run_marker_gives_a_reason():
    missing = [block.name for block in blocks() if block.no_run == ""]
    assert not missing, (
        f"python blocks marked no-run without a reason: {missing}; write "
        "<!-- no-run: why it cannot run in a test --> on the line before the fence")


def test_the_docs_have_runnable_examples():
    assert len(RUNNABLE) >= 10, [block.name for block in RUNNABLE]


def test_the_home_page_shows_the_readmes_tables_without_copying_them():
    sys.path.insert(0, str(REPO / "docs" / "_ext"))
    try:
        import readme_sections  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.pop(0)
    index = (REPO / "docs" / "index.md").read_text(encoding="utf-8")
    for name in ("why", "entry-points"):
        section = readme_sections.readme_section(name)
        assert f"<!-- readme: {name} -->" in index
        assert section.count("\n|") >= 5, name  # a table
        assert section.strip().splitlines()[-1] not in index, name  # not copied


def test_the_readme_is_a_front_door():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MAX_LINES
    first = min(block.line for block in RUNNABLE if block.page.name == "README.md")
    assert first <= README_FIRST_EXAMPLE_BY_LINE, first
