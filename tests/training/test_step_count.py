"""On data whose length tf.data does not know, one-device Keras counts one
optimizer iteration more per epoch than it trains; tfdist counts what it
trains (Keras' count on the same batches with their length known) and,
where the optimizer's update reads the count, warns that one device
differs (`tfdist.training.step_count`)."""

import warnings

import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tfdist._internal.keras import compiled as keras_compiled

EXAMPLES, BATCH, EPOCHS = 66, 16, 2
MESSAGE = "counts one optimizer iteration more per epoch"


def _unknown_length():
    return ref.global_batches(EXAMPLES, BATCH).filter(lambda *_: True)


def _known_length():
    return _unknown_length().apply(tf.data.experimental.assert_cardinality(-(-EXAMPLES // BATCH)))


def _keras(dataset, optimizer):
    model = ref.compile_model(ref.build_mlp(), optimizer)
    model.fit(dataset, epochs=EPOCHS, verbose=0)
    return model


def _attached(make_strategy, dataset, optimizer, **fit_options):
    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), optimizer)
    tfdist.attach(model, strategy)
    model.fit(dataset, epochs=EPOCHS, verbose=0, **fit_options)
    return model


def test_adam_on_unknown_length_equals_keras_with_the_length_known_and_warns_where_keras_differs(
        make_strategy):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = _attached(make_strategy, _unknown_length(), "adam")
    warned = any(MESSAGE in str(w.message) for w in caught)
    known, unknown = _keras(_known_length(), "adam"), _keras(_unknown_length(), "adam")
    if keras_compiled.counts_a_step_more_on_unknown_length(known):  # Keras 3.15
        # The warning is no false alarm: one device gives two results.
        assert warned
        assert int(unknown.optimizer.iterations) == int(known.optimizer.iterations) + EPOCHS
        assert ref.largest_difference(known.get_weights(), unknown.get_weights()) > 1e-4
    else:  # Keras 3.16 counts what it trains: one result, and no warning
        assert not warned
        assert int(unknown.optimizer.iterations) == int(known.optimizer.iterations)
        ref.assert_weights_close(known, unknown)
    ref.assert_weights_close(known, model)
    assert int(model.optimizer.iterations.numpy()) == int(known.optimizer.iterations)


@pytest.mark.parametrize("optimizer,dataset", [("sgd", _unknown_length), ("adam", _known_length)],
                         ids=["sgd-unknown", "adam-known"])
def test_no_warning_where_one_device_agrees(make_strategy, optimizer, dataset):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", message=".*shuffle=True.*")  # Keras' own
        model = _attached(make_strategy, dataset(), optimizer)
    ref.assert_weights_close(_keras(_known_length(), optimizer), model)


def test_steps_per_epoch_counts_what_it_trains_and_does_not_warn(make_strategy):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", message=".*shuffle=True.*")
        model = _attached(make_strategy, _unknown_length().repeat(), "adam", steps_per_epoch=2)
    assert int(model.optimizer.iterations.numpy()) == 2 * EPOCHS
