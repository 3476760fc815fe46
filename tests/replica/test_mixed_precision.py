"""Mixed precision under tfdist equals one-device Keras (issue 33, point 4).

``mixed_float16`` (Keras wraps the optimizer in a ``LossScaleOptimizer``)
and ``mixed_bfloat16`` (no loss scaling), dense and sparse (embedding)
gradients, tfdist's step and a model's own ``train_step``, on 1 to 4
replicas, against plain Keras ``fit`` on one device, same data and order.

Tolerance. Layers compute in 16 bits, so a replica's gradient is a sum of
its rows' terms rounded to 11 (float16) or 8 (bfloat16) significant bits;
splitting the batch over replicas regroups those sums. That is the same
kind of error as computing in 16 bits at all, and measured it is of the
same size or smaller: on the LSTM below, after 12 steps, tfdist on 3 and 4
replicas is 6e-5..1e-4 (float16, SGD and Adam) and 2.1e-3..2.8e-3
(bfloat16) from one device, where one device in 16 bits is 2.1e-4..6e-4
(float16) and 2.3e-3 (bfloat16) from float32. So each test allows twice
the 16-bit-vs-float32 difference of its own run (4.2e-4, 1.2e-3, 4.5e-3). A
gradient twice too large (summed over 2 replicas instead of averaged, the
classic distribution bug) moves the weights by 6e-2, far outside. On one
replica the results are identical (0.0).
"""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref

_REFERENCES = {}
EXAMPLES, BATCH, EPOCHS = 96, 16, 2


@contextlib.contextmanager
def global_policy(name: str):
    """Layers built inside take the dtype policy ``name``, as after
    ``keras.mixed_precision.set_global_policy(name)``."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def tokens():
    """Token sequences and labels: embedding gradients are IndexedSlices."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 50, size=(EXAMPLES, 7)).astype("int32")
    y = (x[:, 0] % 3).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def features_with_an_overflow():
    """Dense features; one row is so large that its float16 gradient
    overflows at the first loss scale: the last replica's row of the first
    batch, whatever the replica count."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype("float32")
    y = rng.integers(0, 3, 64)
    x[BATCH - 1] *= 3000.0
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def sequence_model(policy: str, optimizer: str):
    keras.utils.set_random_seed(1)
    with global_policy(policy or "float32"):
        model = keras.Sequential([
            keras.Input((7,), dtype="int32"),
            keras.layers.Embedding(50, 8),
            keras.layers.LSTM(8),
            keras.layers.Dense(3),
            keras.layers.Activation("softmax", dtype="float32"),
        ])
    make = {"sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
            "adam": lambda: keras.optimizers.Adam(0.01)}[optimizer]
    model.compile(optimizer=make(), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


class OwnStep(keras.Sequential):
    """keras.io's custom train_step: the loss scaled and gradients applied
    by the model's own code (``optimizer.apply`` scales and checks)."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
            scaled = self.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def dense_model(cls=keras.Sequential):
    keras.utils.set_random_seed(1)
    with global_policy("mixed_float16"):
        model = cls([
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(3),
            keras.layers.Activation("softmax", dtype="float32"),
        ])
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss="sparse_categorical_crossentropy")
    return model


def one_device(build, data):
    model = build()
    model.fit(data, epochs=EPOCHS, verbose=0, shuffle=False)
    return model


def with_tfdist(build, data, strategy):
    with strategy.scope():
        model = build()
    tfdist.attach(model, strategy)
    model.fit(data, epochs=EPOCHS, verbose=0)
    return model


def max_difference(model_a, model_b) -> float:
    return ref.largest_difference(model_a.get_weights(), model_b.get_weights())


def references(policy: str, optimizer: str):
    """(one-device model in ``policy``, its tolerance: twice its distance
    from the same run in float32), computed once per process."""
    key = (policy, optimizer)
    if key not in _REFERENCES:
        mixed = one_device(lambda: sequence_model(policy, optimizer), tokens())
        full = one_device(lambda: sequence_model("float32", optimizer), tokens())
        _REFERENCES[key] = mixed, 2 * max_difference(mixed, full)
    return _REFERENCES[key]


@pytest.mark.parametrize("replicas", [1, 3, 4])
@pytest.mark.parametrize("policy, optimizer", [
    ("mixed_float16", "sgd"), ("mixed_float16", "adam"), ("mixed_bfloat16", "sgd")])
def test_embedding_and_lstm_in_mixed_precision_equal_one_device(
        policy, optimizer, replicas, make_strategy):
    """Sparse embedding gradients through a LossScaleOptimizer (a crash in
    the optimizer's condition once: CollectiveGatherV2 on 2 and 3 replicas)."""
    expected, tolerance = references(policy, optimizer)
    actual = with_tfdist(lambda: sequence_model(policy, optimizer), tokens(),
                         make_strategy(replicas))
    assert type(actual.optimizer) is type(expected.optimizer)
    assert max_difference(expected, actual) <= (1e-6 if replicas == 1 else tolerance)


def test_the_tolerance_would_catch_a_wrongly_scaled_gradient():
    """Not vacuous: a gradient twice too large (2 replicas' gradients
    summed instead of averaged, as the learning rate 0.2) ends far outside
    every tolerance above."""
    for (policy, optimizer) in [("mixed_float16", "sgd"), ("mixed_bfloat16", "sgd")]:
        expected, tolerance = references(policy, optimizer)

        def too_fast():
            model = sequence_model(policy, optimizer)
            model.optimizer.learning_rate = 0.2
            return model

        difference = max_difference(expected, one_device(too_fast, tokens()))
        assert difference > 5 * tolerance


@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("cls", [keras.Sequential, OwnStep], ids=["tfdist step", "own step"])
def test_an_overflow_on_one_replica_skips_the_step_on_all_as_one_device_does(
        cls, replicas, make_strategy):
    """One replica's gradient overflows: one device skips the update and
    halves the scale; so must every replica (Keras alone applied the
    infinite gradient: weights inf)."""
    expected = one_device(lambda: dense_model(cls), features_with_an_overflow())
    actual = with_tfdist(lambda: dense_model(cls), features_with_an_overflow(),
                         make_strategy(replicas))
    scale = float(expected.optimizer.dynamic_scale.numpy())
    assert scale < 32768.0  # one device did skip steps (the initial scale is 2**15)
    assert float(actual.optimizer.dynamic_scale.numpy()) == scale
    assert max_difference(expected, actual) < 2e-4  # float16's tolerance above


def test_plain_keras_outside_tfdist_keeps_its_own_check(make_strategy):
    """The agreement is scoped to tfdist's steps: a Keras fit under a
    strategy, outside tfdist, runs Keras' own LossScaleOptimizer.apply
    (which applies the other replica's overflow: weights not finite)."""
    strategy = make_strategy(2)
    with_tfdist(dense_model, features_with_an_overflow(), strategy)  # installs the wrapper
    with strategy.scope():
        model = dense_model()
    model.fit(features_with_an_overflow(), epochs=1, verbose=0)
    assert not all(np.isfinite(w).all() for w in model.get_weights())
