"""``tfdist-run --evaluator``: 2 workers train (tests/programs/train_reference_mlp.py,
checkpoints and validation each epoch) while an evaluator task runs the same
program and evaluates each checkpoint beside them (`tfdist.training.sidecar`).

The evaluator's numbers are the ones training reported for the same
epochs; it ends on its own after the last epoch's checkpoint; stopped
(SIGSTOP) for the whole run, it holds nothing up: training finishes and
the launcher ends it after ``--evaluator_timeout``.
"""

import json
import os
import signal
import sys

import numpy as np
import psutil
import pytest

from tests.support.launcher_harness import LauncherRun

PROGRAM = [sys.executable, "tests/programs/train_reference_mlp.py"]
EPOCHS = 3


def _command(tmp_path):
    return PROGRAM + [f"--output_dir={tmp_path / 'out'}", f"--checkpoint_dir={tmp_path / 'ckpt'}",
                      "--validation_examples=40", f"--epochs={EPOCHS}"]


def _result(tmp_path, task):
    return json.loads((tmp_path / "out" / f"{task}.json").read_text())


def test_the_evaluator_evaluates_every_checkpoint_as_training_validated_it(tmp_path):
    with LauncherRun(["--num_workers=2", "--evaluator"], _command(tmp_path)) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    training = _result(tmp_path, "worker-0")["history"]
    evaluated = _result(tmp_path, "evaluator-0")["history"]
    for name in ("val_loss", "val_accuracy"):
        np.testing.assert_allclose(evaluated[name], training[name], rtol=1e-5, err_msg=name)
    assert "[evaluator-0] [evaluator] ckpt-15 (epoch 3, step 15): loss" in run.output
    assert "ending evaluator-0" not in run.output  # it ended on its own
    assert list((tmp_path / "ckpt" / "logs" / "evaluator").glob("events.out.tfevents.*"))


@pytest.mark.full_form  # (CI: the evaluator's checkpoints, above)
def test_a_stopped_evaluator_holds_nothing_up(tmp_path):
    args = ["--num_workers=2", "--evaluator", "--evaluator_timeout=2", "--hang_timeout=2"]
    with LauncherRun(args, _command(tmp_path)) as run:
        run.wait_for(r"\[launcher\] started evaluator-0 \(pid", timeout=60)
        evaluator = run.pids()["evaluator-0"]
        os.killpg(evaluator, signal.SIGSTOP)  # its process group: the task
        try:
            assert run.wait(timeout=300) == 0, run.output[-4000:]
        finally:
            try:
                os.killpg(evaluator, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert _result(tmp_path, "worker-0")["history"]["val_loss"]
    assert "training is done; ending evaluator-0, stopped (SIGSTOP)" in run.output
    assert not psutil.pid_exists(evaluator) or psutil.Process(evaluator).status() == "zombie"
