"""Mixed-precision models, data and one-device references shared by
tests/replica/test_mixed_precision.py (which says how the tolerance is
measured) and tests/communication/test_local_sgd.py."""

import contextlib

import keras
import numpy as np
import tensorflow as tf

import tfdist
from tests.support import models, reference as ref

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
        return models.metrics_updated(self, loss, y, y_pred)


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
