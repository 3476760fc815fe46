"""A pipeline with one stage per process: ``tfdist-run --workers_serve``
starts a chief (the training program, the first stage) and worker servers
(one stage each) on 127.0.0.1 with real TF_CONFIGs; the chief's step runs
every stage on its task. Compared with one-device Keras on the same data
(`tests.parallel.test_pipeline`), never with tfdist itself."""

import json
import re
import signal
import sys

import numpy as np
import pytest

from tests.parallel import test_pipeline as in_process
from tests.programs import pipeline_on_tasks
from tests.support import reference as ref
from tests.support.launcher_harness import LauncherRun

PROGRAM = [sys.executable, "tests/programs/pipeline_on_tasks.py"]
PER_WORKER = [sys.executable, "tests/programs/pipeline_per_worker.py"]


@pytest.mark.parametrize("workers,schedule,micro_batches", [
    pytest.param(1, "1f1b", 4, id="2tasks-1f1b-m4"),
    pytest.param(2, "gpipe", 3, id="3tasks-gpipe-m3", marks=pytest.mark.full_form),
])  # (CI: the first; --full: both)
def test_stages_on_other_processes_equal_one_device(tmp_path, workers, schedule, micro_batches):
    expected = in_process._fit(in_process._model())  # pylint: disable=protected-access
    args = [f"--output_dir={tmp_path / 'out'}", f"--schedule={schedule}",
            f"--micro_batches={micro_batches}"]
    with LauncherRun([f"--num_workers={workers}", "--workers_serve"], PROGRAM + args) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    result = json.loads((tmp_path / "out" / "chief-0.json").read_text())
    in_process._assert_equal_to(expected, (  # pylint: disable=protected-access
        [np.asarray(w, np.float32) for w in result["weights"]], result["history"],
        result["evaluation"], np.asarray(result["predictions"], np.float32)))
    # Each stage's weights live on its own task: the chief's, then each worker's.
    cuts = pipeline_on_tasks.CUTS[workers + 1]
    layers = ["h1", "h2", "h3", "out"]
    stage_of = {name: sum(layers.index(cut) < index for cut in cuts)
                for index, name in enumerate(layers)}
    assert [d.split("/device")[0] for d in result["stage_devices"]] == (
        ["/job:chief/replica:0/task:0"]
        + [f"/job:worker/replica:0/task:{i}" for i in range(workers)])
    for path, device in result["devices"].items():
        wanted = result["stage_devices"][stage_of[path.split("/")[0]]]
        assert device == wanted, (path, device, wanted)


def _each_worker_equals(expected, output_dir) -> list:
    """Asserts each of the 2 workers' results (``<task>.json``) holds one
    device's weights, history and evaluation; returns them."""
    results = []
    for task in (0, 1):
        result = json.loads((output_dir / f"worker-{task}.json").read_text())
        ref.assert_weight_lists_close(expected[0],
                                      [np.asarray(w, np.float32) for w in result["weights"]])
        ref.assert_logs_close(expected[1], result["history"])
        np.testing.assert_allclose(result["evaluation"], expected[2], rtol=1e-5)
        results.append(result)
    return results


def test_a_pipeline_per_worker_equals_one_device(tmp_path):
    """Data x pipeline on 2 processes: MultiWorkerMirroredStrategy with one
    replica per worker (real TF_CONFIGs from ``tfdist-run``), each worker's
    pipeline over its own 2 logical CPUs; every worker ends at one device's
    weights and history, each stage's copy on its worker's device for it."""
    expected = in_process._fit(in_process._model())  # pylint: disable=protected-access
    program = PER_WORKER + [f"--output_dir={tmp_path / 'out'}"]
    with LauncherRun(["--num_workers=2"], program) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    for task, result in enumerate(_each_worker_equals(expected, tmp_path / "out")):
        for path, copies in result["copies"].items():
            stage = 0 if path.split("/")[0] in ("h1", "h2") else 1
            assert [c.split("/device:")[1] for c in copies] == [f"CPU:{stage}"], (path, copies)
            assert all(f"/task:{task}/" in c for c in copies), (path, copies)


@pytest.mark.full_form
def test_four_stages_per_worker_on_two_devices_fully_sharded_equal_one_device(tmp_path):
    """Data x interleaved pipeline x fully sharded on 2 processes: each
    worker's pipeline of 4 stages over its 2 logical CPUs (2 stages each,
    interleaved 1F1B), each stage's weights and Adam state sharded over the
    2 workers; every worker ends at one device's weights and history."""
    expected = in_process._fit(in_process._model())  # pylint: disable=protected-access
    program = PER_WORKER + [f"--output_dir={tmp_path / 'out'}", "--fully_sharded",
                            "--stages_per_device=2", "--micro_batches=4"]
    with LauncherRun(["--num_workers=2"], program) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    _each_worker_equals(expected, tmp_path / "out")


@pytest.mark.full_form  # (CI kills a pipeline's stage, and a fully sharded worker, apart)
def test_a_killed_worker_of_a_fully_sharded_pipeline_per_worker_restarts_and_ends_equal(
        tmp_path):
    """The composed layout on processes (2 MultiWorkerMirroredStrategy
    workers x 2 stages, each stage fully sharded over the workers): SIGKILL
    of worker 1 mid-epoch loses its slices of every weight and of Adam's
    state. tfdist-run names it and restarts the group; the workers restore
    from the last checkpoint and end where one uninterrupted device ends."""
    expected = in_process._fit(in_process._model(), epochs=3)  # pylint: disable=protected-access
    program = PER_WORKER + [
        f"--output_dir={tmp_path / 'out'}", f"--checkpoint_dir={tmp_path / 'ckpt'}",
        "--checkpoint_every_steps=2", "--step_delay=0.3", "--epochs=3", "--fully_sharded"]
    launcher = ["--num_workers=2", "--max_restarts=1", "--grace_period=5"]
    with LauncherRun(launcher, program) as run:
        run.interrupt_and_wait_for_restart("worker-1", after=r"\[worker-0\] epoch step 3 done")
    assert "worker-1: exited (exit code 137)" in run.output, run.output[-4000:]
    # the restarted workers resumed from a checkpoint (2 or 4 updates), not from the start
    for task in (0, 1):
        starts = re.findall(rf"\[worker-{task}\] first step after (\d+) updates", run.output)
        assert starts[0] == "0" and int(starts[-1]) in (2, 4), (task, starts)
    weights, history, evaluation, _ = expected
    for task in (0, 1):
        result = json.loads((tmp_path / "out" / f"worker-{task}.json").read_text())
        ref.assert_weight_lists_close(
            weights, [np.asarray(w, np.float32) for w in result["weights"]])
        np.testing.assert_allclose(result["evaluation"], evaluation, rtol=1e-5)
        # (the history after a restart holds the epochs the restarted run trained)
        np.testing.assert_allclose(result["history"]["loss"], history["loss"][-len(
            result["history"]["loss"]):], rtol=1e-5)


@pytest.mark.parametrize("interruption", [
    "SIGKILL", pytest.param("SIGSTOP", marks=pytest.mark.full_form)])
def test_an_interrupted_stage_restarts_from_the_checkpoint_and_ends_equal_to_one_device(
        tmp_path, interruption):
    """SIGKILL of the worker holding the second stage mid-epoch: its weights
    and Adam state die with it. tfdist-run names it, ends the chief and
    starts the group again; the chief restores every stage from the last
    checkpoint (written by the chief, with the values read from each task)
    and ends where one uninterrupted device ends. SIGSTOP: the chief's step
    waits on the stopped stage; after ``--hang_timeout`` tfdist-run names
    it hung, and the group restarts as after SIGKILL."""
    expected = in_process._fit(in_process._model(), epochs=3)  # pylint: disable=protected-access
    args = [f"--output_dir={tmp_path / 'out'}", f"--checkpoint_dir={tmp_path / 'ckpt'}",
            "--checkpoint_every_steps=2", "--step_delay=0.3", "--epochs=3"]
    launcher = ["--num_workers=1", "--workers_serve", "--max_restarts=1", "--grace_period=5",
                "--hang_timeout=5"]
    with LauncherRun(launcher, PROGRAM + args) as run:
        run.interrupt_and_wait_for_restart("worker-0", after=r"\[chief-0\] epoch step 3 done",
                                           signal_number=getattr(signal, interruption))
    named = {"SIGKILL": r"worker-0: exited \(exit code 137\)",
             "SIGSTOP": r"worker-0.*hung: stopped \(SIGSTOP\)"}[interruption]
    assert re.search(named, run.output), run.output[-4000:]
    starts = re.findall(r"\[chief-0\] first step after (\d+) updates", run.output)
    assert starts[0] == "0" and int(starts[-1]) >= 2, starts  # (resumed from a checkpoint)
    result = json.loads((tmp_path / "out" / "chief-0.json").read_text())
    weights, history, _, _ = expected
    ref.assert_weight_lists_close(
        weights, [np.asarray(w, np.float32) for w in result["weights"]])
    # (The history after a restart holds the epochs the restarted run trained.)
    np.testing.assert_allclose(result["history"]["loss"], history["loss"][-len(
        result["history"]["loss"]):], rtol=1e-5)
