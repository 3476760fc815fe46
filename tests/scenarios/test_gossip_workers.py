"""Decentralized SGD (`tfdist.communication.Gossip`) on real workers:
`tfdist-run` starts 2 processes with real TF_CONFIG, each with 2 replicas
on logical CPUs (4 replicas: on a ring, pairs 0-1 and 2-3 within a
worker, 1-2 and 3-0 across; a pair's exchange is the same collective
whether its replicas share a process or not). Each worker's final weights equal
tests/communication/test_gossip.py's NumPy simulation of the same run.
"""

import json
import os
import signal
import sys

import numpy as np
import pytest

from tests.communication import test_gossip as case
from tests.support import reference as ref
from tests.support.launcher_harness import LauncherRun
from tfdist.communication import gossip_graphs

PROGRAM = [sys.executable, "tests/programs/train_gossip.py"]


@pytest.mark.parametrize("topology,momentum", [
    ("ring", 0.9), pytest.param("exponential", 0.0, marks=pytest.mark.full_form)])
def test_gossip_on_two_workers_equals_a_numpy_simulation(tmp_path, topology, momentum):
    args = [f"--output_dir={tmp_path}", f"--topology={topology}", f"--momentum={momentum}"]
    with LauncherRun(["--num_workers=2"], PROGRAM + args) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    initial = case._linear_model(momentum).get_weights()  # pylint: disable=protected-access
    x, y = case._data()  # pylint: disable=protected-access
    # Replica r is worker r // 2's replica r % 2 (TensorFlow's ids); the
    # per-replica pieces of a global batch go to the workers in turn, so
    # worker w's replica l steps on piece 2 l + w.
    expected, spreads = case._numpy_gossip(  # pylint: disable=protected-access
        initial, x, y, gossip_graphs.matrices(topology, 4), momentum, pieces=[0, 2, 1, 3])
    assert max(spreads) > 1e-4  # the replicas differed between epoch ends
    steps = case.EPOCHS * len(x) // case.BATCH
    for worker in (0, 1):
        result = json.loads((tmp_path / f"worker-{worker}.json").read_text())
        assert result["exchanges"] == steps
        ref.assert_weight_lists_close(expected, [np.asarray(w) for w in result["weights"]])


def test_a_killed_worker_restarts_from_the_checkpoint_and_ends_as_the_simulation(tmp_path):
    """SIGKILL of worker 1 mid-run, a ring with momentum, saves every 2
    steps (each save averages the replicas first): its neighbours' exchange
    ends (bounded), the launcher names the dead worker and restarts the
    group from the last checkpoint, and both workers end with the weights
    of the simulation that averages at the same saves."""
    args = [f"--output_dir={tmp_path / 'out'}", "--topology=ring", "--momentum=0.9",
            f"--checkpoint_dir={tmp_path / 'ckpt'}", "--checkpoint_every_steps=2",
            "--step_delay=0.4"]
    launcher = ["--num_workers=2", "--max_restarts=1", "--grace_period=5"]
    with LauncherRun(launcher, PROGRAM + args) as run:
        run.wait_for(r"\[worker-0\] train \| epoch 2 \| step 1/4", timeout=240)
        os.kill(run.pids()["worker-1"], signal.SIGKILL)
        run.wait_for(r"restart 1/1", timeout=90)
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    assert "worker-1: exited (exit code 137)" in run.output
    initial = case._linear_model(0.9).get_weights()  # pylint: disable=protected-access
    x, y = case._data()  # pylint: disable=protected-access
    expected, _ = case._numpy_gossip(  # pylint: disable=protected-access
        initial, x, y, gossip_graphs.matrices("ring", 4), 0.9, pieces=[0, 2, 1, 3],
        save_every=2)
    for worker in (0, 1):
        result = json.loads((tmp_path / "out" / f"worker-{worker}.json").read_text())
        ref.assert_weight_lists_close(expected, [np.asarray(w) for w in result["weights"]])
