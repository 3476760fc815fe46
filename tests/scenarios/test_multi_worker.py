"""Multi-worker training with real processes, real TF_CONFIG, real signals.

Every test runs `tfdist-run` with tests/programs/train_reference_mlp.py and
compares each worker's result with single-device Keras `fit` on the same
global batches (70 examples, batch 16: a partial last batch).
"""

import json
import os
import signal
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref, short_form
from tests.support.launcher_harness import LauncherRun

PROGRAM = [sys.executable, "tests/programs/train_reference_mlp.py"]
EPOCHS, EXAMPLES, BATCH = 3, 70, 16


@pytest.fixture(scope="module")
def keras_reference():
    model, history = ref.keras_fit(ref.global_batches(EXAMPLES, BATCH), EPOCHS, "adam")
    evaluation = model.evaluate(ref.global_batches(EXAMPLES, BATCH), verbose=0, return_dict=True)
    return model.get_weights(), history, evaluation


def _results(output_dir, workers=2):
    return [json.loads((output_dir / f"worker-{i}.json").read_text()) for i in range(workers)]


def _assert_equals_reference(result, keras_reference, check_history=True):
    weights, history, evaluation = keras_reference
    for index, (expected, actual) in enumerate(zip(weights, result["weights"])):
        np.testing.assert_allclose(np.asarray(actual), expected, atol=1e-5, rtol=0, err_msg=f"weight {index}")
    if check_history:
        ref.assert_logs_close(history, result["history"])
    ref.assert_logs_close(evaluation, result["evaluate"])


@pytest.mark.parametrize("replicas_per_worker, async_checkpoint", [
    (2, False), pytest.param(1, True, marks=pytest.mark.full_form)])  # (CI: the first)
def test_workers_train_like_one_device(tmp_path, keras_reference, replicas_per_worker,
                                       async_checkpoint, monkeypatch):
    """(1 replica per worker, synchronous saves: the attach test.) With
    ``async_checkpoint`` worker-1 writes its copies in the background to a
    scratch directory under TMPDIR, removed once each write completes."""
    args = [f"--output_dir={tmp_path / 'out'}", f"--checkpoint_dir={tmp_path / 'ckpt'}",
            f"--replicas_per_worker={replicas_per_worker}"]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    if async_checkpoint:
        args += ["--async_checkpoint", "--checkpoint_every_steps=2"]
    with LauncherRun(["--num_workers=2"], PROGRAM + args) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    for result in _results(tmp_path / "out"):  # every worker has the same history
        _assert_equals_reference(result, keras_reference)
    # Only the chief wrote checkpoints and summaries; no worker temp dirs remain.
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.endswith(".index")) == (
        ["ckpt-12.index", "ckpt-14.index", "ckpt-15.index"] if async_checkpoint
        else ["ckpt-10.index", "ckpt-15.index", "ckpt-5.index"])
    assert not [p.name for p in scratch.iterdir() if p.name.startswith("tfdist-")]
    assert not list((tmp_path / "ckpt" / "logs").glob("*/events*worker-1*"))
    assert "[worker-1] train |" not in run.output and "[worker-0] train |" in run.output


def test_two_workers_read_through_a_data_service_worker_like_one_device(tmp_path,
                                                                       keras_reference):
    """``tfdist-run --data_service_workers=1``: a dispatcher and a service
    worker run beside the 2 training workers, whose global batches come from
    the service (data_service="auto"); training equals one device."""
    args = [f"--output_dir={tmp_path / 'out'}", f"--checkpoint_dir={tmp_path / 'ckpt'}",
            "--data_service=auto"]
    with LauncherRun(["--num_workers=2", "--data_service_workers=1"], PROGRAM + args) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    for result in _results(tmp_path / "out"):
        _assert_equals_reference(result, keras_reference)
    assert "[data-worker-0] tfdist.server: tf.data service data_worker serving" in run.output
    cluster = next(line for line in run.output.splitlines() if "[launcher] cluster:" in line)
    assert '"data-dispatcher@' in cluster and '"data-worker-0@' in cluster


@pytest.mark.full_form  # (CI: a killed service worker under parameter servers, test_parameter_server.py)
def test_a_killed_data_service_worker_is_named_and_a_restart_finishes_exactly(
        tmp_path, keras_reference):
    """SIGKILL to the service worker mid-epoch: the launcher names it at once
    (no training task hangs on the lost stream), starts the group again, and
    training resumes from the checkpoint to the weights of one device."""
    launcher = ["--num_workers=2", "--data_service_workers=1", "--max_restarts=1",
                "--grace_period=5"]
    with LauncherRun(launcher, PROGRAM + _slow_run_args(tmp_path) + ["--data_service=auto"]) as run:
        run.wait_for(r"\[worker-0\] train \| epoch 2 \| step 2/5", timeout=240)
        killed = time.monotonic()
        os.kill(run.pids()["data-worker-0"], signal.SIGKILL)
        run.wait_for(r"restart 1/1", timeout=90)
        assert time.monotonic() - killed < 60
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    assert "data-worker-0: exited (exit code 137)" in run.output, run.output[-3000:]
    for result in _results(tmp_path / "out"):
        _assert_equals_reference(result, keras_reference, check_history=False)


def test_local_sgd_on_two_workers_equals_a_hand_written_local_sgd(tmp_path):
    """LocalSGD(every_steps=3, DiLoCo's Nesterov outer optimizer), saves
    every 2 steps: each worker steps on its half of every global batch; both
    end with the weights of tests/communication/test_local_sgd.py's plain loop."""
    from tests.communication import test_local_sgd

    args = [f"--output_dir={tmp_path / 'out'}", f"--checkpoint_dir={tmp_path / 'ckpt'}",
            "--checkpoint_every_steps=2", "--local_sgd=3"]
    with LauncherRun(["--num_workers=2"], PROGRAM + args) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    expected = test_local_sgd._reference(2, 3, outer=True, save_every=2)  # pylint: disable=protected-access
    for result in _results(tmp_path / "out"):
        ref.assert_weight_lists_close(expected, result["weights"])


@pytest.mark.parametrize("first_stage", short_form.only(["--fully_sharded", "--sharded_state"],
                                                         in_ci=("--fully_sharded",)))
def test_sharded_optimizer_state_on_two_workers_saves_resumes_and_equals_one_device(
        tmp_path, keras_reference, first_stage):
    """FullySharded (or ShardedOptimizerState) over 2 workers x 2 replicas:
    each of the 4 replicas of the cluster keeps a quarter of Adam's state
    (and of the weights) and the workers save them in the background every
    2 steps, each worker its own slices, merged by the chief into the
    ordinary checkpoint (whole shapes, nothing left over). Two epochs,
    then a second launch on 2 workers x 1 replica with ShardedOptimizerState
    resumes from that checkpoint (each worker now keeps half of the state)
    for the third: one device's three epochs. (ShardedOptimizerState on
    2 x 2 in CI: tests/conformance/test_clusters.py.)"""
    checkpoints = f"--checkpoint_dir={tmp_path / 'ckpt'}"
    args = [f"--output_dir={tmp_path / 'first'}", "--replicas_per_worker=2", first_stage,
            "--epochs=2", checkpoints, "--async_checkpoint", "--checkpoint_every_steps=2"]
    with LauncherRun(["--num_workers=2"], PROGRAM + args) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    # Adam's two moments of a quarter of each weight, weight by weight.
    quarters = [[-(-w.size // 4)] for w in keras_reference[0] for _ in range(2)]
    for result in _results(tmp_path / "first"):
        state = [shape for shape in result["optimizer_state_shapes"] if shape]
        assert state == quarters, state
        if first_stage == "--fully_sharded":
            assert result["weight_slice_shapes"] == [[-(-w.size // 4)] for w in keras_reference[0]]
    _assert_background_saves_held_each_workers_slices(
        _results(tmp_path / "first"), keras_reference[0],
        sliced_values=3 if first_stage == "--fully_sharded" else 2)
    leftovers = [p.name for p in (tmp_path / "ckpt").iterdir() if ".part-" in p.name
                 or ".merging" in p.name]
    assert not leftovers, leftovers
    latest = tf.train.latest_checkpoint(str(tmp_path / "ckpt"))  # (the one resumed from)
    assert len(tf.io.gfile.glob(latest + ".data-*")) >= 2  # (merged: each worker's file)
    saved = dict(tf.train.list_variables(latest))  # (whole shapes)
    weights = [shape for name, shape in sorted(saved.items())
               if name.startswith("optimizer/_trainable_variables/")]
    assert weights == [list(w.shape) for w in keras_reference[0]], saved
    args = [f"--output_dir={tmp_path / 'out'}", "--replicas_per_worker=1", "--sharded_state",
            checkpoints]
    with LauncherRun(["--num_workers=2"], PROGRAM + args) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    halves = [[-(-w.size // 2)] for w in keras_reference[0] for _ in range(2)]
    for result in _results(tmp_path / "out"):
        _assert_equals_reference(result, keras_reference, check_history=False)
        assert len(result["history"]["loss"]) == 1  # (the third epoch only)
        state = [shape for shape in result["optimizer_state_shapes"] if shape]
        assert state == halves, state


def _assert_background_saves_held_each_workers_slices(results, weights, sliced_values):
    """Across 2 workers x 2 replicas, each worker's background saves held
    its own half of the ``sliced_values`` values stored in slices per weight
    (the weights and Adam's two moments, or the moments alone) on its host,
    never the whole (`tfdist.checkpoint.slice_writes`): worker-1 exactly its
    slices; the chief its slices and the values kept whole (the mirrored
    weights under sharded state; counters, metrics)."""
    chief_elements = sum(min(2 * -(-w.size // 4), w.size) for w in weights)
    total = sum(w.size for w in weights)
    chief, other = (result["background_host_bytes"] for result in results)
    assert other == 4 * sliced_values * (total - chief_elements), (other, total)
    kept_whole = 4 * total if sliced_values == 2 else 0
    assert 4 * sliced_values * chief_elements + kept_whole <= chief, chief
    assert chief <= 4 * sliced_values * chief_elements + kept_whole + 1024, (chief, total)


def test_attached_keras_fit_and_predict_on_two_workers_equal_one_device(tmp_path):
    """tfdist.attach + unchanged model.fit / evaluate / predict on arrays;
    then gradient accumulation over 2 micro-batches = one device on 2x batches.
    2 workers x 2 replicas: TensorFlow deals a batch's replica slices out
    to the workers in turn, so predict puts them back in the batch's order
    (it returned worker 0's two slices first)."""
    x, y, _ = ref.classification_arrays(EXAMPLES)
    expected = ref.compile_model(ref.build_mlp(), "adam")
    batch_logs = []
    recorder = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: batch_logs.append([batch, dict(logs)]))
    history = expected.fit(x, y, batch_size=BATCH, epochs=EPOCHS, validation_split=0.2,
                           shuffle=False, verbose=0, callbacks=[recorder]).history
    evaluation = expected.evaluate(x, y, batch_size=BATCH, verbose=0)
    predictions = expected.predict(x, batch_size=BATCH, verbose=0)
    weights_after_fit = expected.get_weights()
    on_batch = [expected.train_on_batch(x[:2], y[:2]), expected.test_on_batch(x[:5], y[:5]),
                expected.predict_on_batch(x[:3])]
    on_unions = ref.compile_model(ref.build_mlp(), "adam")
    union_history = on_unions.fit(x, y, batch_size=2 * BATCH, epochs=EPOCHS, shuffle=False,
                                  verbose=0).history

    args = [f"--output_dir={tmp_path / 'out'}", "--keras_fit", "--replicas_per_worker=2"]
    with LauncherRun(["--num_workers=2"], PROGRAM + args) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    results = _results(tmp_path / "out")
    chief_logs = [r["batch_logs"] for r in results if r["batch_logs"]]
    assert len(chief_logs) == 1 and len(chief_logs[0]) == len(batch_logs) == 3 * 4
    for (want_batch, want), (batch, got) in zip(batch_logs, chief_logs[0]):
        assert batch == want_batch
        ref.assert_logs_close(want, got)
    for result in results:  # every worker: the full result
        ref.assert_weight_lists_close(weights_after_fit, result["weights"])
        ref.assert_logs_close(history, result["history"])
        np.testing.assert_allclose(result["evaluate"], evaluation, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(result["predict"]), predictions, atol=1e-5, rtol=0)
        for want, got in zip(on_batch, result["on_batch"]):  # *_on_batch, after fit
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
        ref.assert_weight_lists_close(on_unions.get_weights(), result["accumulated"]["weights"])
        ref.assert_logs_close(union_history, result["accumulated"]["history"])


@pytest.mark.full_form  # (CI: fully sharded on two workers, and accumulation under it in one process)
def test_fully_sharded_accumulation_on_two_workers_of_two_replicas_equals_one_device(tmp_path):
    """``gradient_accumulation_steps=2`` under ``FullySharded()`` on 4
    replicas in 2 processes: each replica's slice of the summed gradients
    is kept between the micro-steps, and every second step is one device's
    step on the union of the two batches."""
    x, y, _ = ref.classification_arrays(EXAMPLES)
    expected = ref.compile_model(ref.build_mlp(), "adam")
    history = expected.fit(x, y, batch_size=2 * BATCH, epochs=EPOCHS, shuffle=False,
                           verbose=0).history
    args = [f"--output_dir={tmp_path / 'out'}", "--replicas_per_worker=2",
            "--accumulate_fully_sharded"]
    with LauncherRun(["--num_workers=2"], PROGRAM + args) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    for result in _results(tmp_path / "out"):
        ref.assert_weight_lists_close(expected.get_weights(), result["weights"])
        ref.assert_logs_close(history, result["history"])


def test_a_metric_made_outside_the_scope_is_refused_across_workers(tmp_path):
    """Its state would be each worker's own (Keras 3 metrics make their
    variables when constructed), so each worker would report its own
    examples' result: refused, naming the metric, before training."""
    args = [f"--output_dir={tmp_path / 'out'}", "--metric_made_outside_scope"]
    with LauncherRun(["--num_workers=2"], PROGRAM + args) as run:
        assert run.wait(timeout=300) != 0
    assert "The metric 'top2' given to" in run.output, run.output[-4000:]
    assert "created outside strategy.scope()" in run.output
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.json"))


def _slow_run_args(tmp_path):
    return [f"--output_dir={tmp_path / 'out'}", f"--checkpoint_dir={tmp_path / 'ckpt'}",
            "--checkpoint_every_steps=2", "--step_delay=0.4"]


@pytest.mark.parametrize("sharding", short_form.only(["none", "--fully_sharded"],
                                                      in_ci=("none",)))
def test_killed_worker_is_named_and_a_restart_finishes_exactly(tmp_path, keras_reference,
                                                               sharding):
    """SIGKILL mid-step, then the group restarts from the last checkpoint;
    with FullySharded too (each worker's slices of the weights and state
    are lost with it). (Without restarts the launcher then ends the run
    with the dead task's exit code: tests/launch/test_launcher.py, with a
    cheap program.)"""
    launcher = ["--num_workers=2", "--max_restarts=1", "--grace_period=5"]
    args = _slow_run_args(tmp_path) + ([sharding] if sharding != "none" else [])
    with LauncherRun(launcher, PROGRAM + args) as run:
        run.wait_for(r"\[worker-0\] train \| epoch 2 \| step 2/5", timeout=240)
        killed = time.monotonic()
        os.kill(run.pids()["worker-1"], signal.SIGKILL)
        run.wait_for(r"restart 1/1", timeout=90)
        assert time.monotonic() - killed < 60  # the launcher sees the exit at once
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    assert "worker-1: exited (exit code 137)" in run.output
    for result in _results(tmp_path / "out"):
        # Weights and evaluation: exact. History: only the epochs after the restart.
        _assert_equals_reference(result, keras_reference, check_history=False)


@pytest.mark.parametrize("slow", [
    # The same stop as the async case's, with synchronous saves (full form).
    pytest.param("--step_delay=0.4", marks=pytest.mark.full_form),
    # A stop inside a stretch (full form; in CI on one machine:
    # tests/loops/test_quiet_executions.py).
    pytest.param("--endless_slow_data=0.4", marks=pytest.mark.full_form),
    "--step_delay=0.4 --async_checkpoint"])
def test_sigterm_saves_a_checkpoint_and_the_run_resumes_exactly(tmp_path, keras_reference, slow):
    """Slow steps from a batch-end callback (every execution alone), or from
    endless slow data with no batch hook (executions between log points in
    stretches, `tfdist.loops.runners.base`): both workers stop at one step.
    With async saves the epoch saves run in the background and the
    preemption's is written before the process exits."""
    launcher = ["--num_workers=2", "--max_restarts=1", "--grace_period=20"]
    args = [f"--output_dir={tmp_path / 'out'}", f"--checkpoint_dir={tmp_path / 'ckpt'}",
            *slow.split()]  # epoch checkpoints only: the mid-epoch one is the preemption's
    with LauncherRun(launcher, PROGRAM + args) as run:
        run.wait_for(r"\[worker-0\] train \| epoch 2 \| step 2/5", timeout=240)
        os.kill(run.pids()["worker-1"], signal.SIGTERM)
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    preempted = [l for l in run.output.splitlines() if "preempted (SIGTERM): checkpoint saved at step" in l]
    assert preempted, run.output[-4000:]
    step = int(preempted[0].rsplit(" ", 1)[1])
    assert step % 5 != 0  # mid-epoch
    assert "exit code 143" in run.output
    _, history, _ = keras_reference
    for result in _results(tmp_path / "out"):
        _assert_equals_reference(result, keras_reference, check_history=False)
        # The restarted run's history: the epoch resumed mid-way (its metric
        # state came from the checkpoint) and the last one, as uninterrupted.
        resumed = {key: values[-2:] for key, values in history.items()}
        assert all(len(values) == 2 for values in result["history"].values()), result["history"]
        ref.assert_logs_close(resumed, result["history"])


@pytest.mark.full_form  # (CI: the launcher's resize decisions, tests/launch/test_decisions.py)
def test_elastic_shrink_continues_exactly_on_fewer_workers(tmp_path, keras_reference):
    """Issue 10, point 8: worker-2 of 3 dies mid-run, then keeps dying
    before it joins; the launcher drops it and 2 workers finish the run
    from the latest checkpoint, with the same global batches: the final
    weights equal one device's."""
    launcher = ["--num_workers=3", "--min_workers=2", "--max_restarts=2", "--grace_period=5"]
    args = [f"--output_dir={tmp_path / 'out'}", f"--checkpoint_dir={tmp_path / 'ckpt'}",
            "--checkpoint_every_steps=2", "--broken_worker=2", "--broken_at_step=7"]
    with LauncherRun(launcher, PROGRAM + args) as run:
        assert run.wait(timeout=400) == 0, run.output[-4000:]
    assert "worker-2: exited (exit code 137)" in run.output
    assert ("lost worker-2: it died again before joining the cluster; "
            "continuing with 2 workers (--min_workers=2)") in run.output, run.output[-4000:]
    assert "restart 2/2" in run.output
    assert not (tmp_path / "out" / "worker-2.json").exists()
    for result in _results(tmp_path / "out", workers=2):
        _assert_equals_reference(result, keras_reference, check_history=False)


def test_bad_tf_config_fails_before_tensorflow_starts(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 3}}')
    with pytest.raises(tfdist.errors.TFConfigError, match=r"task.index \(3\) is out of range"):
        tfdist.make_strategy("multi_worker_mirrored")


@pytest.mark.parametrize("value", [0, -5, "10"])
def test_bad_peer_timeout_is_a_clear_error(value):
    with pytest.raises(tfdist.errors.ConfigurationError, match=r"`peer_timeout_seconds` \(.*\) must be a positive"):
        tfdist.make_strategy("multi_worker_mirrored", peer_timeout_seconds=value)


def test_two_workers_train_on_a_shuffled_dataset_as_one_device_keras_does(tmp_path):
    """A dataset reshuffled every epoch (tf.data's default): both workers
    draw the orders one-device Keras ``fit`` draws (`tfdist.data.epochs`)."""
    dataset = ref.shuffled_batches(EXAMPLES, BATCH, seed=3)
    model = ref.compile_model(ref.build_mlp(), "adam")
    history = model.fit(dataset, epochs=EPOCHS, verbose=0, shuffle=False).history
    args = [f"--output_dir={tmp_path / 'out'}", "--shuffle_seed=3"]
    with LauncherRun(["--num_workers=2"], PROGRAM + args) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    for result in _results(tmp_path / "out"):
        ref.assert_weight_lists_close(model.get_weights(), result["weights"])
        ref.assert_logs_close(history, result["history"])


def test_two_workers_in_mixed_float16_skip_an_overflowing_step_together(tmp_path):
    """One worker's float16 gradient overflows (row 15: worker 1's half of
    the first batch). One device skips that update and halves the loss
    scale; under MultiWorkerMirroredStrategy Keras decides per replica, so
    the workers would take different branches (mismatched collectives).
    tfdist decides over all replicas (`tfdist.replica.loss_scaling`)."""
    model = ref.compile_model(ref.build_mlp(mixed_float16=True), "adam")
    dataset = ref.global_batches(EXAMPLES, BATCH, overflow_row=15)
    history = model.fit(dataset, epochs=EPOCHS, verbose=0, shuffle=False).history
    assert float(model.optimizer.dynamic_scale.numpy()) < 32768.0  # a step was skipped
    args = [f"--output_dir={tmp_path / 'out'}", "--mixed_float16"]
    with LauncherRun(["--num_workers=2"], PROGRAM + args) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    for result in _results(tmp_path / "out"):
        # float16 round-off (tests/replica/test_mixed_precision.py): 2e-4
        for index, (want, got) in enumerate(zip(model.get_weights(), result["weights"])):
            np.testing.assert_allclose(np.asarray(got), want, atol=2e-4, rtol=0,
                                       err_msg=f"weight {index}")
        assert len(result["history"]["loss"]) == EPOCHS
        np.testing.assert_allclose(result["history"]["loss"], history["loss"], rtol=1e-3)


@pytest.mark.parametrize("own_step", [
    # A compute_loss override alone (full form; on one machine in CI:
    # tests/replica/test_keras_overrides.py).
    # (returns_batch_values is guide_train_step returning more: CI runs it)
    pytest.param("guide_train_step", marks=pytest.mark.full_form), "returns_batch_values",
    pytest.param("penalty_loss", marks=pytest.mark.full_form)])
def test_a_models_own_step_on_two_workers_equals_one_device(tmp_path, own_step):
    """keras.io's train_step with compute_loss, and a compute_loss override,
    on 2 workers (70 rows, batch 16: the last batch splits 3 + 3)."""
    from tests.support import models

    cls = {"guide_train_step": models.GuideTrainStep,
           "penalty_loss": models.PenaltyLoss,
           "returns_batch_values": models.ReturnsBatchValues}[own_step]
    model = models.compiled_model(cls)
    x, y, _ = ref.classification_arrays(EXAMPLES)
    import tensorflow as tf

    history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH),
                        epochs=EPOCHS, verbose=0).history
    args = [f"--output_dir={tmp_path / 'out'}", f"--own_step={own_step}"]
    with LauncherRun(["--num_workers=2"], PROGRAM + args) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    for result in _results(tmp_path / "out"):
        ref.assert_weight_lists_close(model.get_weights(), result["weights"])
        ref.assert_logs_close(history, result["history"])
