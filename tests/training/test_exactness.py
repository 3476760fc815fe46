"""N replicas == one device: tfdist.Trainer against single-device Keras fit.

Every test trains the same initial weights on the same batches in the same
order, once with plain Keras ``model.fit`` on the default strategy (the
reference) and once with tfdist under a strategy, then compares final
weights (1e-5 absolute), per-epoch loss and metrics (1e-5 relative) and
``evaluate``.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tests.support import short_form

EPOCHS = 3
BATCH = 16
# 70 examples: last global batch of 6 (partial, every replica gets some).
# 66 examples: last global batch of 2 (3 or 4 replicas -> empty replicas).
PARTIAL, SMALLER_THAN_REPLICAS = 70, 66


def _tfdist_fit(strategy, dataset, optimizer, epochs=EPOCHS, trainer_kwargs=None,
                model_kwargs=None, fit_kwargs=None, compile_kwargs=None):
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(**(model_kwargs or {})), optimizer,
                                  **(compile_kwargs or {}))
    trainer = tfdist.Trainer(model, strategy, **(trainer_kwargs or {}))
    history = trainer.fit(dataset, epochs=epochs, verbose=0, **(fit_kwargs or {}))
    return model, trainer, history.history


# Every replica count with both data sizes where they differ, both
# optimizers; the other test files add more combinations (keras_fit,
# static_shapes, clipping, empty_replicas).
# CI runs the first four: each replica count, each optimizer and each size
# twice (--full: all eight).
@pytest.mark.parametrize("num_replicas, optimizer, num_examples", [
    (1, "adam", PARTIAL), (2, "sgd", PARTIAL), (3, "adam", SMALLER_THAN_REPLICAS),
    (4, "sgd", SMALLER_THAN_REPLICAS),
    *[pytest.param(*row, marks=pytest.mark.full_form) for row in [
        (2, "adam", SMALLER_THAN_REPLICAS), (3, "sgd", PARTIAL), (4, "adam", PARTIAL),
        (4, "adam", SMALLER_THAN_REPLICAS)]],
])
def test_fit_equals_single_device_keras(make_strategy, num_replicas, optimizer, num_examples):
    dataset = ref.global_batches(num_examples, BATCH)
    expected_model, expected_history = ref.keras_fit(dataset, EPOCHS, optimizer)

    model, trainer, history = _tfdist_fit(make_strategy(num_replicas), dataset, optimizer)

    ref.assert_weights_close(expected_model, model)
    ref.assert_logs_close(expected_history, history)
    ref.assert_logs_close(
        expected_model.evaluate(dataset, verbose=0, return_dict=True),
        trainer.evaluate(dataset),
    )


@pytest.mark.parametrize("num_replicas", [2, 4])
def test_steps_per_execution_equals_single_device(make_strategy, num_replicas):
    # 8 global batches + 1 partial: the data ends inside an execution of 4.
    dataset = ref.global_batches(8 * BATCH + 3, BATCH)
    expected_model, expected_history = ref.keras_fit(dataset, EPOCHS, "adam")

    model, _, history = _tfdist_fit(
        make_strategy(num_replicas), dataset, "adam",
        compile_kwargs={"steps_per_execution": 4},
    )

    ref.assert_weights_close(expected_model, model)
    ref.assert_logs_close(expected_history, history)


@pytest.mark.parametrize("num_replicas", [2, 4])
def test_static_size_batches_without_weights_equal_single_device_keras(make_strategy, num_replicas):
    # (x, y) batches of one static size take tfdist.data's path without a
    # per-batch function: the global count is a constant column zipped in.
    x, y, _ = ref.classification_arrays(64)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)
    expected_model, expected_history = ref.keras_fit(dataset, EPOCHS, "adam")

    model, trainer, history = _tfdist_fit(make_strategy(num_replicas), dataset, "adam")

    ref.assert_weights_close(expected_model, model)
    ref.assert_logs_close(expected_history, history)
    ref.assert_logs_close(
        expected_model.evaluate(dataset, verbose=0, return_dict=True),
        trainer.evaluate(dataset),
    )


# The "pad" policy with jit_compile (the static-shape path) is tested in
# tests/replica/test_static_shapes.py.


def test_drop_policy_equals_keras_on_full_batches(make_strategy):
    x, y, w = ref.classification_arrays(PARTIAL)
    full_only = tf.data.Dataset.from_tensor_slices((x, y, w)).batch(BATCH, drop_remainder=True)
    expected_model, expected_history = ref.keras_fit(full_only, EPOCHS, "sgd")

    model, _, history = _tfdist_fit(
        make_strategy(4), ref.global_batches(PARTIAL, BATCH), "sgd",
        trainer_kwargs={"input_pipeline": tfdist.DataOptions(partial_batch="drop")},
    )

    ref.assert_weights_close(expected_model, model)
    ref.assert_logs_close(expected_history, history)


def test_dataset_fn_of_per_replica_batches_equals_global_batches(make_strategy):
    replicas, per_replica = 4, 4
    x, y, w = ref.classification_arrays(64)
    examples = tf.data.Dataset.from_tensor_slices((x, y, w))

    def dataset_fn(input_context):
        assert input_context.num_replicas_in_sync == replicas
        return examples.batch(input_context.get_per_replica_batch_size(replicas * per_replica))

    # With one input pipeline, replica r of step k gets batch k * replicas + r,
    # so the global batch is examples [16k, 16k + 16).
    expected_model, expected_history = ref.keras_fit(examples.batch(16), EPOCHS, "adam")

    model, _, history = _tfdist_fit(make_strategy(replicas), dataset_fn, "adam")

    ref.assert_weights_close(expected_model, model)
    ref.assert_logs_close(expected_history, history)


def test_epoch_dataset_reshuffles_per_epoch_like_keras_epoch_by_epoch(make_strategy):
    x, y, w = ref.classification_arrays(PARTIAL)
    examples = tf.data.Dataset.from_tensor_slices((x, y, w))

    def make_dataset(epoch):
        seed = tfdist.data.epoch_seed(5, epoch)
        return examples.shuffle(100, seed=seed, reshuffle_each_iteration=False).batch(BATCH)

    expected_model = ref.compile_model(ref.build_mlp(), "adam")
    expected_losses = []
    for epoch in range(EPOCHS):
        history = expected_model.fit(make_dataset(epoch), epochs=1, verbose=0)
        expected_losses += history.history["loss"]

    model, _, history = _tfdist_fit(
        make_strategy(3), tfdist.data.EpochDataset(make_dataset), "adam"
    )

    ref.assert_weights_close(expected_model, model)
    np.testing.assert_allclose(history["loss"], expected_losses, rtol=1e-5)


def test_validation_data_gives_keras_val_entries(make_strategy):
    train, val = ref.global_batches(PARTIAL, BATCH), ref.global_batches(SMALLER_THAN_REPLICAS, 8)
    expected = ref.compile_model(ref.build_mlp(), "adam")
    expected_history = expected.fit(train, epochs=2, validation_data=val, verbose=0).history

    _, _, history = _tfdist_fit(
        make_strategy(4), train, "adam", epochs=2, fit_kwargs={"validation_data": val}
    )

    ref.assert_logs_close(expected_history, history)


def test_synchronized_batch_norm_on_4_replicas_equals_one_device(make_strategy):
    dataset = ref.global_batches(PARTIAL, BATCH)
    expected_model, expected_history = ref.keras_fit(
        dataset, EPOCHS, "adam", batch_norm=True
    )

    model, trainer, history = _tfdist_fit(
        make_strategy(4), dataset, "adam", model_kwargs={"batch_norm": True}
    )

    # Includes BatchNormalization's moving mean and variance.
    ref.assert_weights_close(expected_model, model)
    ref.assert_logs_close(expected_history, history)
    ref.assert_logs_close(
        expected_model.evaluate(dataset, verbose=0, return_dict=True),
        trainer.evaluate(dataset),
    )


def test_keras_fit_itself_is_off_with_partial_batches(make_strategy):
    """Why tfdist exists: Keras fit under MirroredStrategy misweights replicas.

    If this ever starts failing, Keras fixed it; the other tests still pin
    tfdist's own exactness.
    """
    dataset = ref.global_batches(SMALLER_THAN_REPLICAS, BATCH, weighted=False)
    expected_model, _ = ref.keras_fit(dataset, EPOCHS, "adam")
    strategy = make_strategy(4)
    with strategy.scope():
        keras_model = ref.compile_model(ref.build_mlp(), "adam")
    keras_model.fit(dataset, epochs=EPOCHS, verbose=0)
    difference = max(
        np.abs(a - b).max()
        for a, b in zip(expected_model.get_weights(), keras_model.get_weights())
    )
    assert difference > 1e-4


def _two_output_model():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((ref.NUM_FEATURES,))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    classes = keras.layers.Dense(ref.NUM_CLASSES, activation="softmax", name="classes")(hidden)
    value = keras.layers.Dense(1, name="value")(hidden)
    model = keras.Model(inputs, {"classes": classes, "value": value})
    model.compile(
        optimizer=keras.optimizers.Adam(0.02),
        loss={"classes": "sparse_categorical_crossentropy", "value": "mse"},
        loss_weights={"classes": 1.0, "value": 0.3},
        metrics={"classes": ["accuracy"]},
    )
    return model


@pytest.mark.parametrize("num_examples", short_form.only([4 * BATCH, SMALLER_THAN_REPLICAS],
                                                         in_ci=(SMALLER_THAN_REPLICAS,)))
@pytest.mark.parametrize("num_replicas", [1, 4])
def test_multi_output_loss_weights_equal_single_device(make_strategy, num_replicas, num_examples):
    x, y, w = ref.classification_arrays(num_examples)
    targets = {"classes": y, "value": x[:, :1] * 2.0}
    dataset = tf.data.Dataset.from_tensor_slices((x, targets, w)).batch(BATCH)
    expected = _two_output_model()
    expected_history = expected.fit(dataset, epochs=EPOCHS, verbose=0).history

    strategy = make_strategy(num_replicas)
    with strategy.scope():
        model = _two_output_model()
    trainer = tfdist.Trainer(model, strategy)
    history = trainer.fit(dataset, epochs=EPOCHS, verbose=0).history

    ref.assert_weights_close(expected, model)
    pairs = [
        (expected_history, history),
        (expected.evaluate(dataset, verbose=0, return_dict=True), trainer.evaluate(dataset)),
    ]
    # Per-output `<name>_loss` as Keras 3 reports them (the mean of batch
    # means: its trackers weigh a batch by the static batch size, unknown
    # when the last batch is partial), partial batches included.
    for expected_logs, logs in pairs:
        ref.assert_logs_close(expected_logs, logs)


def test_repeated_fit_calls_without_checkpoint_train_like_keras(make_strategy):
    dataset = ref.global_batches(PARTIAL, BATCH)
    expected = ref.compile_model(ref.build_mlp(), "sgd")
    for _ in range(2):
        expected_history = expected.fit(dataset, epochs=1, verbose=0).history

    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "sgd")
    trainer = tfdist.Trainer(model, strategy)
    for _ in range(2):
        history = trainer.fit(dataset, epochs=1, verbose=0).history

    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history, history)


def test_repeated_fit_calls_with_steps_per_epoch_restart_the_data_like_keras(make_strategy):
    dataset = ref.global_batches(8 * BATCH, BATCH, weighted=False).repeat()
    expected = ref.compile_model(ref.build_mlp(), "sgd")
    for _ in range(2):
        expected.fit(dataset, epochs=2, steps_per_epoch=3, verbose=0)

    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "sgd")
    trainer = tfdist.Trainer(model, strategy)
    for _ in range(2):
        trainer.fit(dataset, epochs=2, steps_per_epoch=3, verbose=0)

    ref.assert_weights_close(expected, model)
