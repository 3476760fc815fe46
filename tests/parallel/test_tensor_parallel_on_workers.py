"""Tensor parallelism over processes: a data x model mesh whose data axis
is 2 MultiWorkerMirroredStrategy workers (real TF_CONFIGs from
``tfdist-run`` on 127.0.0.1) and whose model axis is each worker's 2
logical CPUs. Compared with one-device Keras on the same data
(`tests.parallel.test_tensor_parallel`), never with tfdist itself."""

import json
import re
import sys

import numpy as np
import pytest

from tests.parallel import test_tensor_parallel as in_process
from tests.support import reference as ref
from tests.support import short_form
from tests.support.launcher_harness import LauncherRun

PROGRAM = [sys.executable, "tests/programs/tensor_parallel_per_worker.py"]


def _assert_worker_equals(expected_model, expected_history, result, epochs_run=None,
                          data=in_process._data, batch_size=in_process.BATCH) -> None:  # pylint: disable=protected-access
    ref.assert_weight_lists_close(expected_model.get_weights(),
                                  [np.asarray(w, np.float32) for w in result["weights"]])
    x, y = data()
    ref.assert_logs_close(
        expected_model.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True),
        result["evaluation"])
    np.testing.assert_allclose(
        np.asarray(result["predictions"], np.float32),
        expected_model.predict(x, batch_size=batch_size, verbose=0), atol=1e-5)
    losses = expected_history["loss"][-(epochs_run or len(expected_history["loss"])):]
    np.testing.assert_allclose(result["history"]["loss"], losses, rtol=1e-5)


def test_a_mesh_over_two_workers_equals_one_device_and_refuses_what_it_cannot_run(tmp_path):
    """Mesh 2 x 2 over 2 workers (``tfdist.parallel.mesh_devices``): every
    worker ends at one device's weights, History, evaluation and
    predictions; each worker keeps shard j of every split weight on its own
    CPU j. Meshes that do not fit the cluster are refused on every worker,
    naming the row and giving the cluster's mesh."""
    expected, expected_history = in_process._one_device("adam")  # pylint: disable=protected-access
    program = PROGRAM + [f"--output_dir={tmp_path / 'out'}", "--refusals"]
    with LauncherRun(["--num_workers=2"], program) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    mesh = [f"/job:worker/task:{t}/device:CPU:{d}" for t in (0, 1) for d in (0, 1)]
    for task in (0, 1):
        result = json.loads((tmp_path / "out" / f"worker-{task}.json").read_text())
        _assert_worker_equals(expected, expected_history, result)
        assert result["mesh"] == mesh
        assert set(result["shards"]) == {"d1/kernel[0]", "d1/kernel[1]", "d1/bias[0]",
                                         "d1/bias[1]", "d2/kernel[0]", "d2/kernel[1]"}
        for name, copies in result["shards"].items():
            assert copies == [f"/job:worker/replica:0/task:{task}/device:CPU:{name[-2]}"], (
                name, copies)
        refusals = result["refusals"]
        assert "names its worker's job and task; row ['cpu:0', 'cpu:1']" in \
            refusals["unnamed tasks"], refusals
        assert "spans workers" in refusals["a row over two workers"], refusals
        assert f"this worker (worker {task}) has 1 replica(s) but the mesh has " \
            f"{2 if task == 0 else 0} row(s) on it" in refusals["every row on worker 0"], refusals
        assert all(str(mesh) in message for message in refusals.values()), refusals


@pytest.mark.parametrize("fully_sharded", [False, True], ids=["", "fully_sharded"])
def test_data_pipeline_and_model_axes_over_two_workers_equal_one_device(tmp_path,
                                                                        fully_sharded):
    """Mesh 2 x 2 x 2 (data x pipeline x model) over 2 workers, each
    worker's 4 CPUs its 2 stages of 2 model devices: the column layer's
    shards on stage 0's CPUs 0 and 1, the row layer's on stage 1's CPUs 2
    and 3, 3 micro-batches; every worker ends at one device's weights,
    History, evaluation and predictions. With ``FullySharded()`` too (the
    four at once): each worker keeps half of each shard there (its slice),
    every weight gathered once per step for the 3 micro-batches."""
    expected, expected_history = in_process._one_device("adam")  # pylint: disable=protected-access
    program = PROGRAM + [f"--output_dir={tmp_path / 'out'}", "--stages=2"] + (
        ["--fully_sharded", "--count_collectives"] if fully_sharded else [])
    with LauncherRun(["--num_workers=2"], program) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    for task in (0, 1):
        result = json.loads((tmp_path / "out" / f"worker-{task}.json").read_text())
        _assert_worker_equals(expected, expected_history, result)
        stage_of = {"d1": 0, "d2": 1}
        for name, copies in result["shards"].items():
            device = 2 * stage_of[name[:2]] + int(name[-2])
            assert copies == [f"/job:worker/replica:0/task:{task}/device:CPU:{device}"], (
                name, copies)
        if fully_sharded:  # d1/kernel (5, 8): shards of 20, half on each worker
            assert result["slice_elements"]["d1/kernel[0]"] == [10], result["slice_elements"]
            # One traced step of the worker's replica: each weight and shard
            # gathered once for the 3 micro-batches (forward), its gradient
            # summed over them reduce-scattered once (backward), one
            # all-reduce of the batch's example count, no other collective.
            found, variables = result["collectives"], result["step_variables"]
            assert sorted(found) == ["CollectiveAllToAllV2", "CollectiveGatherV2",
                                     "CollectiveReduceV2"], found
            assert len(found["CollectiveGatherV2"]) == variables, found
            assert len(found["CollectiveAllToAllV2"]) == variables, found
            assert found["CollectiveReduceV2"] == [1], found


def test_data_model_and_fully_sharded_over_two_workers_equal_one_device(tmp_path):
    """Mesh 2 x 2 over 2 workers with ``communication=FullySharded()``:
    each worker keeps half of each of its shards (slice r of shard j on
    its CPU j), gathered among the workers' CPUs j; every worker ends at
    one device's weights, History, evaluation and predictions. Background
    saves every 2 steps hold only the worker's own slices on its host (the
    chief: its half of the weights and Adam's moments and the counters),
    never the whole model."""
    expected, expected_history = in_process._one_device("adam")  # pylint: disable=protected-access
    program = PROGRAM + [f"--output_dir={tmp_path / 'out'}", "--fully_sharded",
                         f"--checkpoint_dir={tmp_path / 'c'}", "--checkpoint_every_steps=2",
                         "--async_checkpoint"]
    with LauncherRun(["--num_workers=2"], program) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    for task in (0, 1):
        result = json.loads((tmp_path / "out" / f"worker-{task}.json").read_text())
        _assert_worker_equals(expected, expected_history, result)
        for name, copies in result["shards"].items():
            assert copies == [f"/job:worker/replica:0/task:{task}/device:CPU:{name[-2]}"], (
                name, copies)
        # d1/kernel (5, 8): shards of 20, half on each worker
        assert result["slice_elements"]["d1/kernel[1]"] == [10], result["slice_elements"]
        # weights + Adam's 2 moments, whole: 3 x 4 bytes per weight element
        whole = 12 * sum(w.size for w in expected.get_weights())
        # (about half each; the chief's counters: the step, the rate)
        assert 0.45 * whole < result["background_host_bytes"] < 0.5 * whole + 128, (
            result["background_host_bytes"], whole)


def test_a_block_split_by_sequence_over_two_workers_equals_one_device(tmp_path):
    """Mesh 2 x 2 over 2 workers, each worker's transformer block split by
    heads and its replicated region by sequence over its 2 CPUs
    (`tests.parallel.test_sequence_parallel`): every worker ends at one
    device's weights, History, evaluation and predictions."""
    from tests.parallel import test_sequence_parallel as sequence  # pylint: disable=import-outside-toplevel

    x, y = sequence.layers._data()  # pylint: disable=protected-access
    expected = sequence._model()  # pylint: disable=protected-access
    expected_history = expected.fit(x, y, batch_size=sequence.BATCH, epochs=2, shuffle=False,
                                    verbose=0).history
    program = PROGRAM + [f"--output_dir={tmp_path / 'out'}", "--sequence"]
    with LauncherRun(["--num_workers=2"], program) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    for task in (0, 1):
        result = json.loads((tmp_path / "out" / f"worker-{task}.json").read_text())
        _assert_worker_equals(expected, expected_history, result,
                              data=sequence.layers._data, batch_size=sequence.BATCH)  # pylint: disable=protected-access
        assert result["shards"]["block/down/kernel[1]"] == [
            f"/job:worker/replica:0/task:{task}/device:CPU:1"], result["shards"]


@pytest.mark.parametrize("layout", short_form.only(
    ["2x2", "2x2x2", "2x2_sliced"], in_ci=["2x2"]))
def test_a_killed_worker_of_a_mesh_restarts_from_the_checkpoint_and_ends_equal(
        tmp_path, layout):
    """SIGKILL of worker 1 mid-epoch under the 2 x 2 mesh (2x2x2: data x
    pipeline x model, 2 stages; 2x2_sliced: data x model x fully
    sharded, saved in the background, each worker writing its slices): its shards (or its slices of them) and their Adam state die
    with it. tfdist-run names it and restarts the group; both workers
    restore from the last checkpoint (mid-epoch) and end where one
    uninterrupted device ends."""
    expected, expected_history = in_process._one_device("adam", epochs=3)  # pylint: disable=protected-access
    program = PROGRAM + [f"--output_dir={tmp_path / 'out'}", f"--checkpoint_dir={tmp_path / 'c'}",
                         "--checkpoint_every_steps=2", "--step_delay=0.3", "--epochs=3",
                         f"--stages={2 if layout == '2x2x2' else 1}"] + (
                             ["--fully_sharded", "--async_checkpoint"]  # (merged slices)
                             if layout.endswith("sliced") else [])
    with LauncherRun(["--num_workers=2", "--max_restarts=1", "--grace_period=5"],
                     program) as run:
        run.interrupt_and_wait_for_restart("worker-1", after=r"\[worker-0\] epoch step 3 done")
    assert "worker-1: exited (exit code 137)" in run.output, run.output[-4000:]
    for task in (0, 1):  # (resumed from a checkpoint, not from the start)
        starts = re.findall(rf"\[worker-{task}\] first step after (\d+) updates", run.output)
        assert starts[0] == "0" and int(starts[-1]) in (2, 4), (task, starts)
        result = json.loads((tmp_path / "out" / f"worker-{task}.json").read_text())
        _assert_worker_equals(expected, expected_history, result,
                              epochs_run=len(result["history"]["loss"]))
