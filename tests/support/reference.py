"""Independent references for exactness tests: plain single-device Keras.

Everything here is ordinary Keras 3 on the default (no) strategy, so a
tfdist result is always compared with something tfdist did not compute.
"""

import keras
import numpy as np
import tensorflow as tf

NUM_FEATURES = 5
NUM_CLASSES = 3


def classification_arrays(num_examples: int, seed: int = 0):
    """Features, integer labels and positive sample weights."""
    rng = np.random.RandomState(seed)
    x = rng.randn(num_examples, NUM_FEATURES).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int64") + (x[:, 2] > 1).astype("int64")
    w = rng.uniform(0.2, 2.0, num_examples).astype("float32")
    return x, y, w


def global_batches(num_examples: int, batch_size: int, weighted: bool = True,
                   overflow_row=None):
    """Batches of `classification_arrays`; ``overflow_row``: that row's
    features times 3000, so its float16 gradient overflows (mixed precision)."""
    x, y, w = classification_arrays(num_examples)
    if overflow_row is not None:
        x[overflow_row] *= 3000.0
    parts = (x, y, w) if weighted else (x, y)
    return tf.data.Dataset.from_tensor_slices(parts).batch(batch_size)


def shuffled_batches(num_examples: int, batch_size: int, seed: int = 5):
    """``(x, y)`` batches of a dataset reshuffled every epoch (tf.data's
    default), as most real pipelines are. The global seed is fixed too:
    the op seed is combined with it."""
    x, y, _ = classification_arrays(num_examples)
    tf.random.set_seed(0)
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(num_examples, seed=seed).batch(
        batch_size)


def build_mlp(seed: int = 1, l2: float = 0.01, batch_norm: bool = False,
              mixed_float16: bool = False) -> keras.Model:
    """A small MLP with L2 regularisation; same seed -> same initial weights.

    ``mixed_float16``: its hidden layers compute in float16 and the output
    layer in float32 (Keras' advice; its top-k metric needs float32), and
    compiling it wraps the optimizer in a LossScaleOptimizer.
    """
    keras.utils.set_random_seed(seed)
    previous = keras.mixed_precision.global_policy()
    if mixed_float16:
        keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        layers = [
            keras.Input((NUM_FEATURES,)),
            keras.layers.Dense(
                8, activation="relu", kernel_regularizer=keras.regularizers.L2(l2)
            ),
        ]
        if batch_norm:
            layers.append(keras.layers.BatchNormalization(synchronized=True))
        layers.append(keras.layers.Dense(NUM_CLASSES, activation="softmax", dtype="float32"))
        return keras.Sequential(layers)
    finally:
        keras.mixed_precision.set_global_policy(previous)


def make_optimizer(name: str):
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    return keras.optimizers.Adam(learning_rate=0.02)


def compile_model(model: keras.Model, optimizer: str, **compile_options) -> keras.Model:
    """``model`` compiled with the test optimizer, loss and metrics (and
    ``compile_options``, e.g. ``steps_per_execution``)."""
    model.compile(
        optimizer=make_optimizer(optimizer),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(2, name="top2")],
        # Keras applies sample weights only to these.
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="weighted_acc")],
        **compile_options,
    )
    return model


def keras_fit(dataset, epochs: int, optimizer: str = "adam", **model_kwargs):
    """Single-device Keras ``fit``; returns (model, history dict)."""
    model = compile_model(build_mlp(**model_kwargs), optimizer)
    history = model.fit(dataset, epochs=epochs, verbose=0, shuffle=False)
    return model, history.history


class CrashAtStep(keras.callbacks.Callback):
    """A crash (a preemption) once training has passed ``step`` batches:
    raises KeyboardInterrupt from the batch-end hook."""

    def __init__(self, step):
        super().__init__()
        self.step, self.seen = step, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen >= self.step:
            raise KeyboardInterrupt("simulated preemption")


def largest_difference(expected, actual) -> float:
    """The largest absolute difference between two lists of weight arrays."""
    return max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
               for a, b in zip(expected, actual))


def assert_weight_lists_close(expected, actual, atol: float = 1e-5) -> None:
    """Two lists of weight arrays (or nested lists, as a worker's JSON holds
    them), equal to ``atol``, weight by weight."""
    assert len(actual) == len(expected), (len(actual), len(expected))
    for index, (want, got) in enumerate(zip(expected, actual)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=atol,
                                   err_msg=f"weight {index}")


def assert_weights_close(model_a, model_b, atol: float = 1e-5) -> None:
    assert_weight_lists_close(model_b.get_weights(), model_a.get_weights(), atol)


def assert_weights_equal_lists(model, weights, atol: float = 1e-5) -> None:
    """``model``'s weights against ``weights`` (lists, as a worker's JSON holds them)."""
    assert_weight_lists_close(model.get_weights(), weights, atol)


def assert_logs_close(expected: dict, actual: dict, rtol: float = 1e-5) -> None:
    """Same keys; every value (or per-epoch list) equal to ``rtol``."""
    assert sorted(expected) == sorted(actual), (sorted(expected), sorted(actual))
    for key in expected:
        np.testing.assert_allclose(
            np.asarray(actual[key]), np.asarray(expected[key]), rtol=rtol, atol=1e-7,
            err_msg=key,
        )


def assert_evaluates_and_predicts_alike(expected, model, x, y, batch_size: int) -> None:
    """``model``'s ``evaluate`` logs and ``predict`` outputs on ``x``, ``y``
    equal ``expected``'s (1e-5)."""
    assert_logs_close(expected.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True),
                      model.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True))
    np.testing.assert_allclose(model.predict(x, batch_size=batch_size, verbose=0),
                               expected.predict(x, batch_size=batch_size, verbose=0), atol=1e-5)


def assert_worker_result_equals(expected, expected_history, result: dict, x, y,
                                batch_size: int) -> None:
    """A worker program's result (its JSON: ``history``, ``weights``,
    ``evaluation``, ``predictions``) equals ``expected``, one device's
    model after the fit that returned ``expected_history`` (1e-5)."""
    assert_logs_close(expected_history.history, result["history"])
    assert_weights_equal_lists(expected, result["weights"])
    assert_logs_close(expected.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True),
                      result["evaluation"])
    np.testing.assert_allclose(np.asarray(result["predictions"], np.float32),
                               expected.predict(x, batch_size=batch_size, verbose=0), atol=1e-5)


def restore_into(model, path: str) -> None:
    """The ``tf.train.Checkpoint`` of a model and its optimizer at ``path``
    read into ``model`` (built), every value consumed; its weights then
    equal the checkpoint's."""
    tf.train.Checkpoint(model=model, optimizer=model.optimizer).read(path).assert_consumed()


def assert_train_on_alike(models, x, y, batch_size: int) -> None:
    """Each of ``models`` (restored from one state) fitted one more epoch
    on ``x``, ``y`` in order: all end equal to the first."""
    for model in models:
        model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
    for other in models[1:]:
        assert_weights_close(models[0], other)
