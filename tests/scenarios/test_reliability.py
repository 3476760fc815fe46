"""Stopping and hangs on real multi-worker clusters (tfdist-run, TF_CONFIG, signals).

A run must stop when asked (one SIGTERM or Ctrl-C, with or without a
checkpoint directory; a second Ctrl-C kills at once), and a worker stopped
by SIGSTOP must be found by the launcher and by its peers within bounds.
"""

import json
import os
import signal
import sys
import time

import numpy as np
import pytest

from tests.support import reference as ref
from tests.support import short_form
from tests.support.launcher_harness import LauncherRun

PROGRAM = [sys.executable, "tests/programs/train_reference_mlp.py"]
LONG = ["--examples=80000", "--batch_size=8", "--epochs=1", "--log_every_steps=10"]


def _exit_codes(line):
    return dict(part.split("=") for part in line.split("exit codes: ")[1].rstrip(")").split(", "))


@pytest.mark.parametrize("signum", short_form.only([signal.SIGTERM, signal.SIGINT],
                                                   in_ci=(signal.SIGTERM,)))
def test_one_signal_stops_every_task_without_a_checkpoint_dir(tmp_path, signum):
    with LauncherRun(["--num_workers=2", "--grace_period=25"],
                     PROGRAM + [f"--output_dir={tmp_path}"] + LONG) as run:
        run.wait_for(r"\[worker-0\] train \| epoch 1 \| step 20/", timeout=240)
        sent = time.monotonic()
        run.process.send_signal(signum)
        code = run.wait(timeout=60)
        took = time.monotonic() - sent
    assert code == 128 + signum, run.output[-3000:]
    last = run.output.splitlines()[-1]
    assert last.startswith(f"[launcher] stopped by {signal.Signals(signum).name} (exit codes: ")
    # Every worker stopped itself at the same step (143: tfdist's stop), none was killed.
    assert _exit_codes(last) == {"worker-0": "143", "worker-1": "143"}, last
    assert took < 30, took
    stops = [l for l in run.output.splitlines() if "no checkpoint directory, nothing saved" in l]
    assert len(stops) == 2 and stops[0].split("at step")[1] == stops[1].split("at step")[1]


def test_a_second_ctrl_c_kills_every_task_at_once(tmp_path):
    program = PROGRAM + [f"--output_dir={tmp_path}", "--step_delay=20"] + LONG + ["--log_every_steps=1"]
    with LauncherRun(["--num_workers=2", "--grace_period=120"], program) as run:
        run.wait_for(r"\[worker-0\] train \| epoch 1 \| step", timeout=240)
        run.wait_for(r"\[launcher\] started worker-1", timeout=5)
        time.sleep(1)  # both workers now sit in a 20 s step: the stop waits for it
        run.process.send_signal(signal.SIGINT)
        time.sleep(1)
        sent = time.monotonic()
        run.process.send_signal(signal.SIGINT)
        code = run.wait(timeout=60)
        took = time.monotonic() - sent
    last = run.output.splitlines()[-1]
    assert code == 128 + signal.SIGINT
    assert "stopped by SIGINT, then SIGINT: killed at once" in last, last
    assert set(_exit_codes(last).values()) == {str(128 + signal.SIGKILL)}, last
    assert took < 10, took


def test_stopped_worker_is_named_and_the_run_resumes_exactly(tmp_path):
    keras_model, _ = ref.keras_fit(ref.global_batches(70, 16), 3, "adam")
    args = [f"--output_dir={tmp_path / 'out'}", f"--checkpoint_dir={tmp_path / 'ckpt'}",
            "--checkpoint_every_steps=2", "--step_delay=0.4"]
    launcher = ["--num_workers=2", "--max_restarts=1", "--hang_timeout=5", "--grace_period=5"]
    with LauncherRun(launcher, PROGRAM + args) as run:
        run.wait_for(r"\[worker-0\] train \| epoch 2 \| step 2/5", timeout=240)
        stopped = run.pids()["worker-1"]
        os.kill(stopped, signal.SIGSTOP)
        sent = time.monotonic()
        line = run.wait_for(r"\[launcher\] worker-1: hung: stopped \(SIGSTOP\)", timeout=60)
        found_after = time.monotonic() - sent
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    assert found_after < 20, (found_after, line)
    assert "restart 1/1" in run.output
    with pytest.raises(ProcessLookupError):
        os.kill(stopped, 0)
    for worker in range(2):
        result = json.loads((tmp_path / "out" / f"worker-{worker}.json").read_text())
        for expected, actual in zip(keras_model.get_weights(), result["weights"]):
            np.testing.assert_allclose(np.asarray(actual), expected, atol=1e-5, rtol=0)
