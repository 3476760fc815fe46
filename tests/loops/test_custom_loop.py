"""A custom loop on tfdist's layer (strategies/custom_loop.py) equals
single-device Keras ``fit``: weights, per-epoch loss and accuracy, with
partial and empty-replica batches; docs/guides/custom-loops.md shows that loop verbatim."""

import json
import os
import pathlib
import re
import signal
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tests.support.launcher_harness import LauncherRun
from tests.support.program_loader import load_program

REPO = pathlib.Path(__file__).resolve().parents[2]
custom_loop = load_program("custom_loop")
recipes = load_program("recipes")  # strategies/recipes.py, the examples' data and models
EPOCHS, BATCH = 3, 16


@pytest.mark.parametrize("num_replicas, num_examples", [
    (1, 70), (2, 70), (4, 70), (4, 66)])  # 70: a partial last batch; 66: 2 rows on 4 replicas
def test_custom_loop_equals_single_device_keras(make_strategy, num_replicas, num_examples):
    dataset = ref.global_batches(num_examples, BATCH)
    expected_model, expected_history = ref.keras_fit(dataset, EPOCHS, "adam")

    strategy = make_strategy(num_replicas)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    history = custom_loop.train(strategy, model, dataset, EPOCHS)

    ref.assert_weights_close(expected_model, model)
    ref.assert_logs_close({k: expected_history[k] for k in ("loss", "accuracy")}, history)


def test_custom_loop_on_a_dataset_fn_equals_single_device_keras(make_strategy):
    """Per-replica batches of 8 from a ``dataset_fn``: consecutive batches go
    to the 2 replicas, so each step's union is Keras' global batch of 16; the
    last step (rows 64-69) leaves replica 1 empty. The global count is then
    all-reduced (a dataset_fn's batches do not carry it)."""
    x, y, w = ref.classification_arrays(70)
    expected_model, expected_history = ref.keras_fit(ref.global_batches(70, BATCH), EPOCHS, "adam")

    def dataset_fn(input_context):
        per_replica = input_context.get_per_replica_batch_size(BATCH)
        return tf.data.Dataset.from_tensor_slices((x, y, w)).batch(per_replica)

    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    history = custom_loop.train(strategy, model, dataset_fn, EPOCHS)
    ref.assert_weights_close(expected_model, model)
    ref.assert_logs_close({k: expected_history[k] for k in ("loss", "accuracy")}, history)


def test_readme_shows_the_programs_loop():
    source = (REPO / "strategies" / "custom_loop.py").read_text()
    loop = re.search(r"# \[custom-loop\]\n(.*?)# \[/custom-loop\]", source, re.S).group(1)
    assert loop.strip() in (REPO / "docs" / "guides" / "custom-loops.md").read_text()


def test_replica_loss_rejects_an_averaged_loss(make_strategy):
    batch = tfdist.Batch(x=tf.ones([2, 1]), y=tf.ones([2]))
    with pytest.raises(tfdist.errors.ConfigurationError,
                       match=r"`per_example_loss` is a scalar.*reduction=None"):
        tfdist.replica.losses.replica_loss(tf.constant(0.5), batch)


def test_replica_loss_ignores_padded_rows_and_uses_the_carried_count():
    batch = tfdist.Batch(
        x=tf.zeros([4, 1]), y=tf.zeros([4]), sample_weight=tf.constant([1.0, 2.0, 5.0, 5.0]),
        mask=tf.constant([1.0, 1.0, 0.0, 0.0]), global_examples=tf.fill([4], 3.0),
    )
    loss = tfdist.replica.losses.replica_loss(tf.constant([1.0, 1.0, np.nan, 7.0]), batch)
    np.testing.assert_allclose(float(loss), (1.0 + 2.0) / 3.0, rtol=1e-6)


# -- accumulation, the host loop and the static-shape path -------------------


def test_accumulation_over_host_loop_executions_equals_one_device_on_unions(make_strategy):
    """k=3 micro-batches of 8 (37 rows: unions 24 | 13), 2 steps per host
    call (executions straddle updates), 4 replicas: one device on the unions."""
    x, y, _ = ref.classification_arrays(37)
    expected = ref.compile_model(ref.build_mlp(), "adam")
    expected_history = expected.fit(x, y, batch_size=24, epochs=EPOCHS, shuffle=False,
                                    verbose=0).history
    strategy = make_strategy(4)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
        model.optimizer.gradient_accumulation_steps = 3
    history = custom_loop.train(strategy, model, ref.global_batches(37, 8, weighted=False),
                                EPOCHS, steps_per_execution=2)
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close({k: expected_history[k] for k in ("loss", "accuracy")}, history)


def test_static_shape_path_equals_single_device_keras(make_strategy):
    """Padded full-size batches and an XLA-compiled forward/backward pass (the
    TPU path) on 4 replicas; 66 rows leave a last batch of 2."""
    dataset = ref.global_batches(66, BATCH)
    expected_model, expected_history = ref.keras_fit(dataset, EPOCHS, "adam")
    strategy = make_strategy(4)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    history = custom_loop.train(strategy, model, dataset, EPOCHS, static_shapes=True,
                                steps_per_execution=4)
    ref.assert_weights_close(expected_model, model)
    ref.assert_logs_close({k: expected_history[k] for k in ("loss", "accuracy")}, history)


# -- stop and resume ----------------------------------------------------------


def _sigterm_at_batch(dataset, index):
    """``dataset``, sending this process SIGTERM (once) when batch ``index`` is
    read: a real signal at a moment inside the first epoch."""
    sent = []

    def maybe_signal(position):
        if int(position) == index and not sent:
            sent.append(index)
            os.kill(os.getpid(), signal.SIGTERM)
        return position

    def with_signal(position, element):
        with tf.control_dependencies([tf.py_function(maybe_signal, [position], tf.int64)]):
            return tuple(tf.identity(part) for part in element)

    return dataset.enumerate().map(with_signal)


def test_sigterm_saves_mid_epoch_and_resumes_on_another_replica_count(make_strategy, tmp_path):
    dataset = ref.global_batches(70, BATCH)  # 5 steps per epoch
    expected_model, expected_history = ref.keras_fit(dataset, EPOCHS, "adam")

    strategy = make_strategy(4)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    with pytest.raises(tfdist.Preempted) as stopped:
        custom_loop.train(strategy, model, _sigterm_at_batch(dataset, 2), EPOCHS,
                          checkpoint_dir=str(tmp_path))
    assert stopped.value.code == 143 and stopped.value.saved
    assert 0 < stopped.value.step < 5, stopped.value.step  # inside the first epoch

    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(seed=5), "adam")  # other weights: restored
    history = custom_loop.train(strategy, model, dataset, EPOCHS, checkpoint_dir=str(tmp_path))
    ref.assert_weights_close(expected_model, model)
    # The resumed first epoch reports the uninterrupted epoch's loss and accuracy.
    ref.assert_logs_close({k: expected_history[k] for k in ("loss", "accuracy")}, history)


# -- bad use ------------------------------------------------------------------


def _replica_step_error(strategy, replica_step):
    loop = tfdist.loops.host_loop.HostLoop(strategy, replica_step)
    batches = tfdist.data.distribute(strategy, ref.global_batches(8, 4))
    with pytest.raises(tfdist.errors.ConfigurationError) as error:
        loop.run(iter(batches))
    return str(error.value)


def test_a_batch_unpacked_as_a_tuple_is_a_clear_error(make_strategy):
    def replica_step(batch):
        x, y = batch  # noqa: F841
    message = _replica_step_error(make_strategy(2), replica_step)
    assert "not a tuple" in message and "`batch.x`, `batch.y`" in message


def test_a_dataset_element_passed_as_the_batch_is_a_clear_error(make_strategy):
    strategy = make_strategy(2)

    @tf.function
    def step(element):
        strategy.run(lambda e: tfdist.replica.losses.replica_loss(tf.ones([2]), e), args=(element,))

    batches = tfdist.data.distribute(strategy, ref.global_batches(8, 4))
    # (In the user's own tf.function autograph wraps tfdist's error in its own.)
    with pytest.raises(Exception) as error:
        step(next(iter(batches)))
    assert re.search(r"ConfigurationError: `batch` of replica_loss is a dict, not a tfdist.Batch: "
                     r"wrap the dataset element first: `batch = tfdist.Batch.from_structure"
                     r"\(element\)`", str(error.value)), error.value


def test_a_metric_created_outside_the_scope_is_a_clear_error(make_strategy):
    strategy = make_strategy(2)
    accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")  # outside the scope
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")

    def replica_step(batch):
        tfdist.replica.metrics.update_metrics([accuracy], batch, model(batch.x))
    message = _replica_step_error(strategy, replica_step)
    assert "'accuracy' was created outside `strategy.scope()`" in message
    assert "with strategy.scope():" in message


@pytest.mark.parametrize("steps", [0, 2.5, True])
def test_host_loop_rejects_a_bad_steps_per_execution(make_strategy, steps):
    with pytest.raises(tfdist.errors.ConfigurationError,
                       match=rf"`steps_per_execution` \({steps!r}\) must be a positive integer"):
        tfdist.loops.host_loop.HostLoop(make_strategy(1), lambda batch: None, steps_per_execution=steps)


# -- the program on 2 workers, stopped and resumed ------------------------------

TRAIN_EXAMPLES, PROGRAM_BATCH, PROGRAM_EPOCHS = 4096, 16, 2  # 256 steps per epoch


def _keras_on_the_programs_data(data_dir):
    """Single-device Keras ``fit`` on the program's data, batches and model,
    with ``--optimizer=sgd``. (With Adam(1e-3) this trajectory amplifies
    float32 round-off: one-device Keras itself, its weights nudged by 1e-7
    after epoch 1, ends epoch 2 2.8e-2 away; SGD stays within 4e-7.)"""
    train, _, info = recipes.image_classification_data(
        "synthetic_patterns", global_batch_size=PROGRAM_BATCH, data_dir=data_dir,
        train_examples=TRAIN_EXAMPLES)
    keras.utils.set_random_seed(0)
    model = recipes.build_model("mlp", info["input_shape"], info["num_classes"])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    for epoch in range(PROGRAM_EPOCHS):
        model.fit(train.make_dataset(epoch), epochs=1, verbose=0, shuffle=False)
    return model.get_weights()


def test_program_on_two_workers_stopped_by_sigterm_resumes_and_equals_one_device(
        tmp_path, synthetic_data_dir):
    expected = _keras_on_the_programs_data(synthetic_data_dir)
    command = [sys.executable, "strategies/custom_loop.py", "--strategy=multi_worker_mirrored",
               "--num_replicas=1", "--optimizer=sgd", f"--epochs={PROGRAM_EPOCHS}",
               f"--batch_size={PROGRAM_BATCH}",
               f"--train_examples={TRAIN_EXAMPLES}", f"--data_dir={synthetic_data_dir}",
               f"--checkpoint_dir={tmp_path / 'ckpt'}",
               f"--result_json={tmp_path}/{{task}}.json"]
    launcher = ["--num_workers=2", "--max_restarts=1", "--grace_period=20"]
    with LauncherRun(launcher, command) as run:
        run.wait_for(r"\[worker-0\] custom loop \| epoch 1 \|", timeout=240)
        os.kill(run.pids()["worker-1"], signal.SIGTERM)
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    assert "preempted (SIGTERM): checkpoint saved at step" in run.output, run.output[-4000:]
    assert "exit code 143" in run.output and "restart 1/1" in run.output
    for task in ("worker-0", "worker-1"):
        weights = json.loads((tmp_path / f"{task}.json").read_text())["weights"]
        for index, (want, got) in enumerate(zip(expected, weights)):
            np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=0,
                                       err_msg=f"{task} weight {index}")
