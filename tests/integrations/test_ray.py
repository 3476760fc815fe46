"""Issue 15, point 1: tfdist programs in Ray Train, on a real local Ray.

One driver process (tests/programs/ray_driver.py) starts a one-node Ray
cluster on 127.0.0.1 and runs Ray Train's ``TensorflowTrainer`` (through
`tfdist.integrations.ray.tensorflow_trainer`) with 2 workers training
tests/support/reference.py's MLP with ``tfdist.Trainer`` under
MultiWorkerMirroredStrategy, reporting every epoch to Ray with
`tfdist.integrations.ray.ReportToRay` and checkpointing into `tfdist.integrations.ray.checkpoint_dir`,
with ``max_failures=1``: worker 1 SIGKILLs itself in epoch 2, once Ray
holds epoch 1's checkpoint; Ray restarts the group, every worker restores
that checkpoint, and the run ends after epochs 2 and 3. Epochs 2 and 3 and
the final weights are compared with single-device Keras ``fit`` on the same
batches, so epoch 1 (trained by the first group) must have been exact too.
(An uninterrupted run was a second Ray run here; it added ~40 s of CI time
and nothing this run does not check.)
The driver and every process under it (Ray's GCS, raylet, workers) are
killed by pid when the tests end. Skipped, with the reason, without the
``[ray]`` extra; CI installs it.
"""

import pytest

from tests.support import reference as ref
from tests.support.engine_harness import run_driver
from tests.programs import engine_train

pytest.importorskip("ray.train", reason="the [ray] extra is not installed")

RUNS = [{"num_workers": 2, "max_failures": 1, "kill_rank": 1}]


@pytest.fixture(scope="module")
def ray_runs(tmp_path_factory):
    """Per run of RUNS: Ray's result and each worker's output; the log."""
    work = tmp_path_factory.mktemp("ray")
    return run_driver("ray_driver.py", work / "results.json", [f"--work_dir={work}"], runs=RUNS)


@pytest.fixture(scope="module")
def keras_reference():
    return ref.keras_fit(ref.global_batches(engine_train.EXAMPLES, engine_train.BATCH),
                         engine_train.EPOCHS)


def _assert_reported_last_epoch(run, expected_history):
    """Ray's result holds the chief's last report: epoch 3's logs."""
    assert run["metrics"]["epoch"] == engine_train.EPOCHS
    ref.assert_logs_close({k: v[-1] for k, v in expected_history.items()},
                          {k: run["metrics"][k] for k in expected_history})
    assert run["checkpoint"], "the last report's checkpoint is Ray's result checkpoint"


@pytest.mark.full_form  # (CI runs Spark's engine end to end; Ray's in the full form)
def test_two_ray_workers_killed_and_restarted_by_ray_equal_one_device(ray_runs, keras_reference):
    (run,), log = ray_runs
    expected_model, expected_history = keras_reference
    assert run["error"] is None, f"{run['error']}\n{log[-4000:]}"
    killed = int(run["killed_pid"])
    assert sorted(run["workers"]) == ["worker-0", "worker-1"]
    for worker in run["workers"].values():
        assert worker["pid"] != killed, "the outputs come from the restarted group"
        assert worker["resumed_from"], "every restarted worker restored Ray's checkpoint"
        # Resumed after epoch 1: this fit trained epochs 2 and 3 only.
        ref.assert_logs_close({k: v[1:] for k, v in expected_history.items()},
                              worker["history"])
        ref.assert_weights_equal_lists(expected_model, worker["weights"])
    _assert_reported_last_epoch(run, expected_history)
    assert "resuming from Ray checkpoint" in log


@pytest.mark.parametrize("arguments,named", [
    ({"num_workers": 0, "storage_path": "/tmp/x"}, "num_workers"),
    ({"num_workers": 2, "storage_path": ""}, "storage_path"),
    ({"num_workers": 2, "storage_path": "/tmp/x", "max_failures": -2}, "max_failures"),
])
def test_bad_arguments_are_named(arguments, named):
    import tfdist.integrations.ray
    from tfdist.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=named):
        tfdist.integrations.ray.tensorflow_trainer(engine_train.ray_train_loop, **arguments)
