"""Losses as published programs write them, against one device: a loss
function that returns the batch's mean (a scalar), and a Keras mask that
reaches the output under XLA."""

import keras
import numpy as np
import pytest

import tfdist
from tfdist.errors import ConfigurationError


def contrastive_loss(y_true, y_pred):
    """keras.io's siamese contrastive loss, as published: a scalar mean."""
    margin = 1.0
    square_pred = keras.ops.square(y_pred)
    margin_square = keras.ops.square(keras.ops.maximum(margin - y_pred, 0))
    return keras.ops.mean((1 - y_true) * square_pred + y_true * margin_square)


def _distance_model():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                             keras.layers.Dense(1, activation="sigmoid")])


def _pairs(rows=107):
    rng = np.random.RandomState(0)
    x = rng.randn(rows, 6).astype("float32")
    return x, (x[:, 0] * x[:, 1] > 0).astype("float32")[:, None]


def _compiled(build, strategy=None, **compile_options):
    if strategy is None:
        model = build()
        model.compile(**compile_options)
        return model
    with strategy.scope():
        model = build()
        model.compile(**compile_options)
    return tfdist.attach(model, strategy)



def test_loss_returning_a_scalar_equals_one_device_on_uneven_batches(make_strategy):
    x, y = _pairs()  # 107 rows in batches of 24: the last, 11 rows, splits 4 / 4 / 3
    options = dict(loss=contrastive_loss, metrics=["accuracy"])
    reference = _compiled(_distance_model, optimizer=keras.optimizers.SGD(0.2), **options)
    expected = reference.fit(x, y, batch_size=24, epochs=2, shuffle=False, verbose=0)
    model = _compiled(_distance_model, make_strategy(3), optimizer=keras.optimizers.SGD(0.2),
                      **options)
    with pytest.warns(UserWarning, match=r"'contrastive_loss' returns a scalar.*mean over each "
                                         r"replica's examples"):
        history = model.fit(x, y, batch_size=24, epochs=2, shuffle=False, verbose=0)
    for want, got in zip(reference.get_weights(), model.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-6)
    for key, values in expected.history.items():
        np.testing.assert_allclose(history.history[key], values, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.evaluate(x, y, batch_size=24, verbose=0),
                               reference.evaluate(x, y, batch_size=24, verbose=0), rtol=1e-5)


def test_loss_returning_a_scalar_is_refused_where_padding_rows_stay(make_strategy):
    x, y = _pairs()
    model = _compiled(_distance_model, make_strategy(2), optimizer="sgd",
                      loss=contrastive_loss, jit_compile=True)
    with pytest.raises(ConfigurationError, match=r"'contrastive_loss' returns a scalar, and "
                                                 r"with jit_compile=True"):
        model.fit(x, y, batch_size=24, epochs=1, verbose=0)


def _tagger():
    keras.utils.set_random_seed(4)
    return keras.Sequential([keras.Input((8,), dtype="int32"),
                             keras.layers.Embedding(12, 4, mask_zero=True),
                             keras.layers.Dense(3, activation="softmax")])


def test_masked_outputs_evaluate_under_xla_as_one_device(make_strategy):
    """XLA returns outputs without the mask Keras attaches to them: the
    loss and metrics would count the padding steps."""
    rng = np.random.RandomState(1)
    x = np.zeros((50, 8), "int32")
    for row, length in enumerate(rng.randint(1, 9, size=50)):
        x[row, :length] = rng.randint(1, 12, size=length)
    y = (x % 3).astype("int64")
    options = dict(optimizer="sgd", loss="sparse_categorical_crossentropy",
                   metrics=["sparse_categorical_accuracy"], jit_compile=True)
    reference = _compiled(_tagger, **options)
    model = _compiled(_tagger, make_strategy(2), **options)
    model.set_weights(reference.get_weights())
    np.testing.assert_allclose(model.evaluate(x, y, batch_size=16, verbose=0),
                               reference.evaluate(x, y, batch_size=16, verbose=0), rtol=1e-5)
