"""Exact gradient accumulation (Keras' ``optimizer.gradient_accumulation_steps``):
batch B with k steps under tfdist equals one-device Keras on batches of k·B,
with the epoch's last, smaller union applied at the epoch end."""

import warnings

import keras
import numpy as np
import pytest

import tfdist
from tests.support import reference as ref
from tests.support import short_form, step_progress

ROWS, MICRO, K = 37, 8, 3  # micro-batches 8,8,8 | 8,5 -> one device: 24 | 13


def _accumulating_model(strategy, optimizer="adam", **options):
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), optimizer)
        model.optimizer.gradient_accumulation_steps = K
        for name, value in options.items():
            setattr(model.optimizer, name, value)
    return model


def _one_device_on_unions(optimizer="adam", epochs=3, **options):
    x, y, _ = ref.classification_arrays(ROWS)
    expected = ref.compile_model(ref.build_mlp(), optimizer)
    for name, value in options.items():
        setattr(expected.optimizer, name, value)
    history = expected.fit(x, y, batch_size=MICRO * K, epochs=epochs, shuffle=False, verbose=0)
    return expected, history


@pytest.mark.parametrize("num_replicas", short_form.only([1, 2, 4], in_ci=(4,)))
def test_accumulation_equals_one_device_on_the_union_batches(make_strategy, num_replicas):
    x, y, _ = ref.classification_arrays(ROWS)
    expected, expected_history = _one_device_on_unions()
    model = tfdist.attach(_accumulating_model(make_strategy(num_replicas)))
    history = model.fit(x, y, batch_size=MICRO, epochs=3, shuffle=False, verbose=0)
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history.history, history.history)


def test_keras_own_accumulation_is_what_tfdist_replaces():
    """Keras averages micro-batch means and counts micro-batches as steps."""
    x, y, _ = ref.classification_arrays(ROWS)
    expected, _ = _one_device_on_unions()
    keras_model = ref.compile_model(ref.build_mlp(), "adam")
    keras_model.optimizer.gradient_accumulation_steps = K
    keras_model.fit(x, y, batch_size=MICRO, epochs=3, shuffle=False, verbose=0)
    difference = max(np.abs(a - b).max()
                     for a, b in zip(expected.get_weights(), keras_model.get_weights()))
    assert difference > 1e-2


def test_accumulation_with_clipping_and_executions_that_straddle_updates(make_strategy):
    dataset = ref.global_batches(ROWS, MICRO, weighted=False)
    expected, expected_history = _one_device_on_unions("sgd", global_clipnorm=0.05)
    strategy = make_strategy(4)
    model = _accumulating_model(strategy, "sgd", global_clipnorm=0.05)
    model.steps_per_execution = 2  # as model.compile(steps_per_execution=2) sets it
    history = tfdist.Trainer(model, strategy).fit(
        dataset, epochs=3, verbose=0)
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history.history, history.history)


def test_resume_mid_accumulation_on_another_replica_count(make_strategy, tmp_path):
    dataset = ref.global_batches(ROWS, MICRO, weighted=False)
    expected, expected_history = _one_device_on_unions(epochs=2)
    first_strategy = make_strategy(4)
    first = _accumulating_model(first_strategy)
    with pytest.raises(KeyboardInterrupt):
        # Saved at step 7 (epoch 2, micro-batch 2 of 3), stopped before step 8.
        tfdist.Trainer(first, first_strategy,
            checkpointing=tfdist.CheckpointOptions(str(tmp_path), every_steps=7)).fit(
            dataset, epochs=2, verbose=0, callbacks=[step_progress.interrupt_at(1, 2)])
    strategy = make_strategy(2)
    model = _accumulating_model(strategy)
    trainer = tfdist.Trainer(model, strategy, checkpointing=tfdist.CheckpointOptions(str(tmp_path)))
    history = trainer.fit(dataset, epochs=2, verbose=0)
    assert trainer.step == 10 and history.epoch == [1]
    ref.assert_weights_close(expected, model)
    np.testing.assert_allclose(history.history["loss"], expected_history.history["loss"][1:],
                               rtol=1e-5)


def _embedding_model(optimizer, accumulate):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(20, 4),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3)])
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    if accumulate:
        model.optimizer.gradient_accumulation_steps = K
    return model


def _token_data():
    rng = np.random.RandomState(0)
    return rng.randint(0, 20, size=(ROWS, 6)).astype("int32"), rng.randint(0, 3, ROWS)


@pytest.mark.parametrize("optimizer,replicas,communication", [
    ("sgd", 2, None), ("adam", 2, None),
    # each replica sums its slice of the table's gradient (`FullySharded`)
    ("sgd", 3, tfdist.communication.FullySharded), ("adam", 3, tfdist.communication.FullySharded)],
    ids=["sgd-2", "adam-2", "sgd-3-fully_sharded", "adam-3-fully_sharded"])
def test_sparse_gradients_accumulate_exactly_or_warn_naming_the_weight(
        make_strategy, optimizer, replicas, communication):
    """An Embedding's sparse gradient (under `FullySharded`, each replica's
    slice of it) is summed dense over the micro-batches: exact for SGD; Adam
    squares a sparse gradient's entries before duplicate ids are summed, so
    it differs from one device on the larger batch and says so."""
    x, y = _token_data()
    expected = _embedding_model(optimizer, accumulate=False)
    expected.fit(x, y, batch_size=MICRO * K, epochs=2, shuffle=False, verbose=0)
    strategy = make_strategy(replicas)
    with strategy.scope():
        model = _embedding_model(optimizer, accumulate=True)
    model.set_weights(_embedding_model(optimizer, accumulate=False).get_weights())
    tfdist.attach(model, strategy, communication=communication() if communication else None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=MICRO, epochs=2, shuffle=False, verbose=0)
    about_entries = [w for w in caught if "squares each entry" in str(w.message)]
    difference = ref.largest_difference(expected.get_weights(), model.get_weights())
    if optimizer == "sgd":
        assert not about_entries
        assert difference < 1e-5, difference
    else:
        assert about_entries and "embeddings" in str(about_entries[0].message)
        assert difference > 1e-4, difference  # the warning is not a false alarm
