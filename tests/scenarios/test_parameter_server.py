"""Parameter-server training with real server processes on localhost.

Every test runs `tfdist-run --num_ps=...`: the chief runs
tests/programs/train_ps.py, worker and ps tasks run `python -m
tfdist.server`. With one worker, training must equal single-device Keras
`fit` on the same batches (70 examples, batch 16: a partial last batch).
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import tfdist
from tests.support import reference as ref
from tests.support.launcher_harness import REPO, LauncherRun
from tests.support.program_loader import load_program

PROGRAM = [sys.executable, "tests/programs/train_ps.py"]
EPOCHS, STEPS, EXAMPLES, BATCH = 3, 5, 70, 16  # 5 steps: one pass per epoch


@pytest.fixture(scope="module")
def keras_reference():
    model, history = ref.keras_fit(ref.global_batches(EXAMPLES, BATCH), EPOCHS, "adam")
    evaluation = model.evaluate(ref.global_batches(EXAMPLES, BATCH), verbose=0, return_dict=True)
    predictions = model.predict(ref.global_batches(EXAMPLES, BATCH), verbose=0)
    return model.get_weights(), history, evaluation, predictions


def _result(output_dir):
    return json.loads((output_dir / "chief.json").read_text())


def _assert_weights_equal_reference(result, keras_reference):
    for index, (expected, actual) in enumerate(zip(keras_reference[0], result["weights"])):
        np.testing.assert_allclose(np.asarray(actual), expected, atol=1e-5, rtol=0, err_msg=f"weight {index}")


@pytest.mark.parametrize("given", [
    # A dataset_fn (full form; in CI: the parameter-server tutorial's tests).
    "dataset", pytest.param("dataset_fn", marks=pytest.mark.full_form)])
def test_one_worker_trains_like_one_device(tmp_path, keras_reference, given):
    args = [f"--output_dir={tmp_path}", f"--input={given}"]
    with LauncherRun(["--num_workers=1", "--num_ps=1"], PROGRAM + args) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    result = _result(tmp_path)
    _assert_weights_equal_reference(result, keras_reference)
    ref.assert_logs_close(keras_reference[1], result["history"])
    ref.assert_logs_close(keras_reference[2], result["evaluate"])
    # predict runs on the coordinator: every example, in order.
    np.testing.assert_allclose(np.asarray(result["trainer_predict"]), keras_reference[3],
                               atol=1e-5, rtol=0)
    assert result["trainer_steps"] == result["optimizer_iterations"] == EPOCHS * STEPS
    assert "needs `steps_per_epoch`" in result["missing_steps_error"]
    assert "under ParameterServerStrategy the weights live on the ps" in result["local_sgd_error"]
    # Progress comes from the chief; the servers only serve.
    assert "[chief-0] train | epoch 3 | step 5/5" in run.output
    assert "[worker-0] tfdist.server: worker-0 serving at 127.0.0.1:" in run.output


EMBEDDING_EPOCHS, EMBEDDING_STEPS = 2, 40
# Evaluation loss; chance is ln(10) = 2.30. Measured ~0.67 after these 80
# asynchronous steps (~0.32 after the program's 3 x 100); runs vary.
EMBEDDING_LOSS_THRESHOLD = 1.0


@pytest.fixture(scope="module")
def embedding_run(tmp_path_factory, synthetic_data_dir):
    """2 workers + 2 ps train the embedding model; keeps its checkpoint."""
    root = tmp_path_factory.mktemp("embedding")
    args = [f"--output_dir={root / 'out'}", f"--checkpoint_dir={root / 'ckpt'}",
            f"--data_dir={synthetic_data_dir}", "--model=embedding",
            f"--epochs={EMBEDDING_EPOCHS}", f"--steps_per_epoch={EMBEDDING_STEPS}"]
    with LauncherRun(["--num_workers=2", "--num_ps=2"], PROGRAM + args) as run:
        assert run.wait(timeout=400) == 0, run.output[-4000:]
    return root, _result(root / "out"), args


def test_two_workers_two_ps_shard_the_embedding_and_learn(embedding_run):
    _, result, _ = embedding_run
    devices = sorted(device for device, _ in result["embedding_shards"])
    assert devices == ["/job:ps/replica:0/task:0/device:CPU:0", "/job:ps/replica:0/task:1/device:CPU:0"]
    assert sum(shape[0] for _, shape in result["embedding_shards"]) == 256 * 16
    assert result["evaluate"]["loss"] < EMBEDDING_LOSS_THRESHOLD, result["evaluate"]
    assert result["history"]["loss"][-1] < result["history"]["loss"][0]
    assert result["trainer_steps"] == EMBEDDING_EPOCHS * EMBEDDING_STEPS
    # Keras' step counter on the ps, raced by both workers: no increment lost
    # (tfdist.strategies.atomic_updates; without it one run counted 62 of 80).
    assert result["optimizer_iterations"] == EMBEDDING_EPOCHS * EMBEDDING_STEPS


def test_checkpoint_from_two_ps_restores_on_one_ps_and_on_one_device(embedding_run, tmp_path,
                                                                    synthetic_data_dir):
    root, trained, args = embedding_run
    expected = np.asarray(trained["predictions"])
    # One ps (nothing sharded): fit finds the target epoch reached and only restores.
    restore_args = [a for a in args if not a.startswith("--output_dir")] + [f"--output_dir={tmp_path}"]
    with LauncherRun(["--num_workers=1", "--num_ps=1"], PROGRAM + restore_args) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    on_one_ps = _result(tmp_path)
    assert len(on_one_ps["embedding_shards"]) == 1
    assert on_one_ps["trainer_steps"] == trained["trainer_steps"]
    np.testing.assert_allclose(np.asarray(on_one_ps["predictions"]), expected, atol=1e-6)

    # One device, in this process, no strategy: a plain Keras model for serving.
    import keras  # pylint: disable=import-outside-toplevel

    recipes = load_program("recipes")  # strategies/recipes.py
    _, test, info = recipes.token_classification_data(
        "synthetic_patterns", global_batch_size=64, data_dir=synthetic_data_dir)
    model = recipes.build_embedding_model(
        info["vocabulary"], info["sequence_length"], info["num_classes"])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy")
    model.optimizer.build(model.trainable_variables)
    checkpoint = tfdist.checkpoint.TrainingCheckpoint(model, str(root / "ckpt"))
    assert checkpoint.restore_latest() is not None
    predictions = model(next(iter(test))[0], training=False).numpy()
    np.testing.assert_allclose(predictions, expected, atol=1e-6)


def _slow_args(tmp_path, delay=0.4, checkpoint_every=2):
    return [f"--output_dir={tmp_path / 'out'}", f"--checkpoint_dir={tmp_path / 'ckpt'}",
            f"--checkpoint_every_steps={checkpoint_every}", f"--step_delay={delay}"]


def test_killed_worker_is_retried_and_training_completes(tmp_path):
    with LauncherRun(["--num_workers=2", "--num_ps=1"], PROGRAM + _slow_args(tmp_path)) as run:
        run.wait_for(r"\[chief-0\] train \| epoch 1 \| step 5/5", timeout=240)
        os.kill(run.pids()["worker-1"], signal.SIGKILL)
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    assert "[launcher] worker-1 exited (exit code 137); starting it again" in run.output
    result = _result(tmp_path / "out")
    assert result["trainer_steps"] == EPOCHS * STEPS
    # A step that was running on the dead worker may have updated the
    # variables before it died, and is then run again elsewhere.
    assert EPOCHS * STEPS <= result["optimizer_iterations"] <= EPOCHS * STEPS + 1


def test_killed_ps_is_named_and_a_restart_resumes_from_the_checkpoint_exactly(
        tmp_path, keras_reference):
    """(Without restarts the launcher then ends the run with the dead task's
    exit code: tests/launch/test_launcher.py, with a cheap program.)"""
    launcher = ["--num_workers=1", "--num_ps=1", "--max_restarts=1", "--grace_period=5"]
    # Checkpoints every 3 steps, the kill after step 10: the run resumes
    # mid-epoch, from step 9, so the data position matters.
    args = _slow_args(tmp_path, checkpoint_every=3)
    with LauncherRun(launcher, PROGRAM + args) as run:
        run.wait_for(r"\[chief-0\] train \| epoch 2 \| step 5/5", timeout=240)
        killed = time.monotonic()
        os.kill(run.pids()["ps-0"], signal.SIGKILL)
        run.wait_for(r"restart 1/1", timeout=90)
        assert time.monotonic() - killed < 60
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    assert "ps-0: exited (exit code 137)" in run.output
    assert "ckpt-9: epoch 2, step 4 of the epoch, 9 in all" in run.output
    result = _result(tmp_path / "out")
    assert result["trainer_steps"] == EPOCHS * STEPS
    # One worker: resuming at the checkpoint's data position is exact.
    _assert_weights_equal_reference(result, keras_reference)


def test_sigterm_to_the_coordinator_saves_and_the_restarted_run_resumes_exactly(
    tmp_path, keras_reference
):
    """Issue 10, point 6: SIGTERM to the chief (what a cluster manager sends)
    saves a checkpoint at the step it stops and exits 143; the launcher's
    restart resumes from it, and one worker's result equals one device's."""
    launcher = ["--num_workers=1", "--num_ps=1", "--max_restarts=1", "--grace_period=20"]
    # Only the preemption saves mid-run; a progress line every step.
    args = _slow_args(tmp_path, checkpoint_every=100) + ["--log_every_steps=1"]
    with LauncherRun(launcher, PROGRAM + args) as run:
        run.wait_for(r"\[chief-0\] train \| epoch 2 \| step 2/5", timeout=240)
        os.kill(run.pids()["chief-0"], signal.SIGTERM)
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    preempted = [line for line in run.output.splitlines()
                 if "preempted (SIGTERM): checkpoint saved at step" in line]
    assert preempted, run.output[-4000:]
    step = int(preempted[0].rsplit(" ", 1)[1])
    assert "chief-0: exited (exit code 143)" in run.output
    assert f"ckpt-{step}: epoch 2, step {step - STEPS} of the epoch, {step} in all" in run.output
    result = _result(tmp_path / "out")
    assert result["trainer_steps"] == EPOCHS * STEPS
    _assert_weights_equal_reference(result, keras_reference)


@pytest.mark.full_form  # (CI: a stopped worker under MultiWorkerMirrored, test_reliability)
def test_a_worker_stopped_forever_is_replaced_and_training_completes(tmp_path):
    """Issue 10, point 6: a worker SIGSTOPped and never continued does not
    stall the coordinator: after --hang_timeout the launcher kills it and
    starts it again; its steps run elsewhere meanwhile."""
    launcher = ["--num_workers=2", "--num_ps=1", "--hang_timeout=5"]
    with LauncherRun(launcher, PROGRAM + _slow_args(tmp_path)) as run:
        run.wait_for(r"\[chief-0\] train \| epoch 1 \| step 5/5", timeout=240)
        stopped = time.monotonic()
        os.kill(run.pids()["worker-1"], signal.SIGSTOP)
        run.wait_for(r"\[launcher\] worker-1 hung: stopped \(SIGSTOP\) for \d+ s; killed it, "
                     r"starting it again, same address", timeout=60)
        replaced = time.monotonic() - stopped
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    assert replaced < 5 + 10  # hang_timeout plus the launcher's polling slack
    result = _result(tmp_path / "out")
    assert result["trainer_steps"] == EPOCHS * STEPS
    assert EPOCHS * STEPS <= result["optimizer_iterations"] <= EPOCHS * STEPS + 1


def test_unreachable_servers_time_out_naming_them(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]},
        "task": {"type": "chief", "index": 0}}))
    started = time.monotonic()
    with pytest.raises(tfdist.errors.ConfigurationError,
                       match=r"not reachable after 2 s: ps-0 \(127.0.0.1:3\), worker-0 \(127.0.0.1:2\)"):
        tfdist.make_strategy("parameter_server", timeout_seconds=2)
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("tf_config, message", [
    (None, "TF_CONFIG is not set"),
    ({"cluster": {"worker": ["127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}},
     r"needs jobs \['ps'\]"),
    ({"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]},
      "task": {"type": "worker", "index": 0}}, "the training program runs as the chief"),
])
def test_bad_tf_config_for_parameter_servers(monkeypatch, tf_config, message):
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    with pytest.raises(tfdist.errors.TFConfigError, match=message):
        tfdist.make_strategy("parameter_server", timeout_seconds=1)


def test_server_refuses_a_chief_task():
    env = dict(os.environ, TF_CONFIG=json.dumps({
        "cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
        "task": {"type": "chief", "index": 0}}))
    done = subprocess.run([sys.executable, "-m", "tfdist.server"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "needs TF_CONFIG with task.type 'ps' or 'worker'; got 'chief'" in done.stderr


def test_parameter_server_program_runs_on_a_local_cluster(tmp_path, synthetic_data_dir):
    command = [sys.executable, "strategies/parameter_server.py", "--epochs=1", "--steps_per_epoch=10",
               "--log_every_steps=5", f"--model_dir={tmp_path / 'model'}",
               f"--data_dir={synthetic_data_dir}"]
    with LauncherRun(["--num_workers=2", "--num_ps=2"], command) as run:
        assert run.wait(timeout=400) == 0, run.output[-4000:]
    assert "[chief-0] embedding (4096, 16) in 2 shard(s): /job:ps/replica:0/task:0" in run.output
    assert "[chief-0] train | epoch 1 | step 10/10 |" in run.output
    assert "[chief-0] final | loss " in run.output
    assert (tmp_path / "model" / "checkpoint").exists()


@pytest.mark.full_form
def test_without_the_launcher_a_lost_ps_is_a_clear_error_on_the_chief(tmp_path):
    """Real hosts have no launcher: the chief itself must end, naming the ps."""
    ports = tfdist.launch.ports.free_ports(3)
    layout = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"],
              "ps": [f"127.0.0.1:{ports[2]}"]}

    def start(task_type, command, log):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", TF_CONFIG=json.dumps(
            {"cluster": layout, "task": {"type": task_type, "index": 0}}))
        return subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    chief_log = tmp_path / "chief.log"
    processes = []
    try:
        with open(tmp_path / "servers.log", "w") as servers, open(chief_log, "w") as log:
            processes.append(start("worker", [sys.executable, "-m", "tfdist.server"], servers))
            ps = start("ps", [sys.executable, "-m", "tfdist.server"], servers)
            processes.append(ps)
            chief = start("chief", [sys.executable, "tests/programs/train_ps.py", f"--output_dir={tmp_path}",
                                    f"--checkpoint_dir={tmp_path / 'ckpt'}", "--step_delay=0.4"], log)
            processes.append(chief)
            deadline = time.monotonic() + 240
            while "epoch 1 | step 5/5" not in chief_log.read_text():
                assert chief.poll() is None and time.monotonic() < deadline, chief_log.read_text()[-3000:]
                time.sleep(0.2)
            ps.kill()
            code = chief.wait(timeout=60)
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    output = chief_log.read_text()
    assert code != 0
    assert (f"ParameterServerLostError: Parameter server ps-0 (127.0.0.1:{ports[2]}) is unreachable"
            in output), output[-3000:]
    assert f"resumes from the latest checkpoint in {tmp_path / 'ckpt'}" in output


@pytest.mark.parametrize("own_step", [
    "penalty_loss",
    # (values returned beside the metrics: on two workers in CI, test_multi_worker.py)
    pytest.param("returns_batch_values", marks=pytest.mark.full_form)])
def test_a_models_own_step_on_one_worker_equals_one_device(tmp_path, own_step):
    """A model's own step under ParameterServerStrategy, with one worker
    exact against one device: a compute_loss override, and a train_step
    that returns values beside the metrics (reported in History as one
    device reports them)."""
    from tests.support import models

    expected = models.compiled_model({"penalty_loss": models.PenaltyLoss,
                                      "returns_batch_values": models.ReturnsBatchValues}[own_step])
    history = expected.fit(ref.global_batches(EXAMPLES, BATCH, weighted=False),
                           epochs=EPOCHS, verbose=0).history
    if own_step == "returns_batch_values":
        assert {"batch_loss", "batch_confidence", "batch_rows"} <= set(history)
    args = [f"--output_dir={tmp_path}", f"--model={own_step}"]
    with LauncherRun(["--num_workers=1", "--num_ps=1"], PROGRAM + args) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    result = _result(tmp_path)
    _assert_weights_equal_reference(result, (expected.get_weights(),))
    ref.assert_logs_close(history, result["history"])


def test_workers_share_a_data_service_pass_each_example_at_most_once_per_epoch(tmp_path):
    """2 workers, 1 ps, 2 tf.data service workers, dynamic sharding: the
    model counts (on the ps) how often each of the 70 example ids is
    trained on. Every epoch visits each example once; SIGKILL to a service
    worker mid-epoch 2: it is started again at its address, no example of
    that epoch is visited twice (its unfinished splits are lost), and
    epoch 3 visits every example once again, and so does a second fit
    (whose epochs count from 0 again)."""
    args = [f"--output_dir={tmp_path}", "--model=count_ids", "--steps_per_epoch=12",
            "--data_service=auto", "--step_delay=0.3", "--log_every_steps=2"]
    with LauncherRun(["--num_workers=2", "--num_ps=1", "--data_service_workers=2"],
                     PROGRAM + args) as run:
        run.wait_for(r"\[chief-0\] train \| epoch 2 \| step 2/12", timeout=240)
        os.kill(run.pids()["data-worker-0"], signal.SIGKILL)
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    assert "[launcher] data-worker-0 exited (exit code 137); starting it again" in run.output
    result = _result(tmp_path)
    counts = np.asarray(result["id_counts"])  # 3 epochs, then a second fit's one
    assert counts.shape == (4, 70)
    assert counts.max() == 1, counts  # at most once per epoch, also across the kill
    assert (counts[[0, 2, 3]] == 1).all(), counts
    # 12 steps per epoch, 9-10 batches of 8 (one partial per service worker):
    # the steps after each epoch's pass did nothing, and the user is told.
    batches = result["optimizer_iterations"]
    assert 3 * 9 <= batches <= 4 * 10 and result["trainer_steps"] == 48, result
    assert "found the epoch's data on the tf.data service used up" in run.output
