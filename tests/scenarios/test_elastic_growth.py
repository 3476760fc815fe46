"""Elastic growth: ``tfdist-run --min_workers=2 --num_workers=3
--host_discovery=SCRIPT``, the script's answer changing during the run,
3 -> 2 -> 3 workers (tests/programs/train_reference_mlp.py, slowed per
step so the changes land mid-training). Each change stops the group at a
checkpoint and re-forms it at the new size; the global batches stay the
same, so the final weights of every worker equal one device's.
"""

import json
import re
import stat
import sys
import time

import pytest

from tests.support import reference as ref
from tests.support.launcher_harness import LauncherRun

EPOCHS, EXAMPLES, BATCH = 8, 70, 16  # 5 steps per epoch, a partial last batch


def _wait_after(run, first_line: int, pattern: str, timeout: float) -> int:
    """Index of the first line from ``first_line`` on matching ``pattern``."""
    regex = re.compile(pattern)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for index in range(first_line, len(run.lines)):
            if regex.search(run.lines[index]):
                return index
        if run.process.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"no line matching {pattern!r} after line {first_line} in "
                         f"{timeout} s:\n{run.output[-4000:]}")


@pytest.fixture
def discovery(tmp_path):
    """A discovery script printing the number in ``available``; set(n) changes it."""
    available = tmp_path / "available"
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {available}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, lambda workers: available.write_text(f"{workers}\n")


def test_the_group_shrinks_and_grows_back_with_the_discovered_workers(tmp_path, discovery):
    script, available = discovery
    available(3)
    command = [sys.executable, "tests/programs/train_reference_mlp.py",
               f"--output_dir={tmp_path / 'out'}", f"--checkpoint_dir={tmp_path / 'ckpt'}",
               f"--epochs={EPOCHS}", "--step_delay=0.3", "--log_every_steps=1"]
    launcher = ["--num_workers=3", "--min_workers=2", f"--host_discovery={script}",
                "--discovery_interval=0.5"]
    with LauncherRun(launcher, command) as run:
        line = _wait_after(run, 0, r"\[worker-0\] train \| epoch 1 \| step 2/", timeout=240)
        available(2)
        line = _wait_after(run, line, r"\[launcher\] re-forming the group with 2 workers",
                           timeout=120)
        line = _wait_after(run, line, r"\[worker-0\] train \| epoch \d+ \| step", timeout=240)
        available(3)
        line = _wait_after(run, line, r"\[launcher\] re-forming the group with 3 workers",
                           timeout=120)
        _wait_after(run, line, r"\[launcher\] started worker-2", timeout=60)
        assert run.wait(timeout=400) == 0, run.output[-4000:]

    model, _ = ref.keras_fit(ref.global_batches(EXAMPLES, BATCH), EPOCHS, "adam")
    for index in range(3):  # the last group: 3 workers, each with the one-device weights
        result = json.loads((tmp_path / "out" / f"worker-{index}.json").read_text())
        ref.assert_weight_lists_close(model.get_weights(), result["weights"])
    starts = [text for text in run.lines if "[launcher] cluster:" in text]
    assert [text.count("worker-") for text in starts] == [3, 2, 3], starts
