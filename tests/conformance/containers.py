"""The input-container axis: how a user hands ``x`` to ``fit``, ``evaluate``
and ``predict`` (one array, a list, a tuple, a dict, a nested structure),
fed as arrays, a ``tf.data`` dataset, a Python generator or a
``keras.utils.PyDataset``, run the same way on one device with plain Keras
(the reference) and after ``tfdist.attach``.

Each container has its model (one input, two inputs, named inputs, named
and nested inputs); the data is the same 6 features split into the
container's parts, so every model learns the same task.
"""

from typing import Optional

import keras
import numpy as np
import tensorflow as tf

import tfdist
from conformance import harness, zoo
from conformance.zoo import CLASSES

CONTAINERS = ("single", "list", "tuple", "dict", "nested")
FEEDS = ("arrays", "tf_data", "generator", "py_dataset")
BATCH = harness.GLOBAL_BATCH


def _inputs(container: str):
    """The model's inputs for ``container`` and the function that splits the
    6 feature columns into that structure."""
    if container == "single":
        return keras.Input((6,)), lambda f: f
    first, second = keras.Input((4,), name="first"), keras.Input((2,), name="second")
    if container == "list":
        return [first, second], lambda f: [f[:, :4], f[:, 4:]]
    if container == "tuple":
        return (first, second), lambda f: (f[:, :4], f[:, 4:])
    if container == "dict":
        return {"first": first, "second": second}, lambda f: {"first": f[:, :4],
                                                                "second": f[:, 4:]}
    third = keras.Input((1,), name="third")
    second = keras.Input((1,), name="second")
    return ({"first": first, "pair": (second, third)},
            lambda f: {"first": f[:, :4], "pair": (f[:, 4:5], f[:, 5:])})


def build(container: str) -> keras.Model:
    keras.utils.set_random_seed(1)
    inputs, _ = _inputs(container)
    merged = (inputs if container == "single"
              else keras.layers.Concatenate()(keras.tree.flatten(inputs)))
    hidden = keras.layers.Dense(8, activation="relu")(merged)
    return keras.Model(inputs, keras.layers.Dense(CLASSES, activation="softmax")(hidden))


def _compile(model):
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])


def arrays(container: str, examples: int):
    features, y = zoo._feature_arrays(examples)
    return _inputs(container)[1](features), y


def _rows(x, start, stop):
    return keras.tree.map_structure(lambda a: a[start:stop], x)


def _tuples(x):
    # tf.data reads a list as one tensor to stack, so its users write tuples.
    return keras.tree.lists_to_tuples(x)


class Batches(keras.utils.PyDataset):
    """A PyDataset of ``(x, y)`` batches (or ``(x,)`` with ``targets=False``)."""

    def __init__(self, x, y, targets=True):
        super().__init__()
        self.x, self.y, self.targets = x, y, targets

    def __len__(self):
        return -(-len(self.y) // BATCH)

    def __getitem__(self, index):
        x = _rows(self.x, index * BATCH, (index + 1) * BATCH)
        return (x, self.y[index * BATCH:(index + 1) * BATCH]) if self.targets else (x,)


def _generator(x, y, targets=True):
    for start in range(0, len(y), BATCH):
        rows = _rows(x, start, start + BATCH)
        yield (rows, y[start:start + BATCH]) if targets else (rows,)


def feed(kind: str, x, y):
    """``(fit and evaluate arguments, predict arguments, epochs)`` for a feed:
    a generator is read once, so it trains one epoch."""
    if kind == "arrays":
        return dict(x=x, y=y, batch_size=BATCH), dict(x=x, batch_size=BATCH), 2
    if kind == "tf_data":
        data = tf.data.Dataset.from_tensor_slices((_tuples(x), y)).batch(BATCH)
        inputs = tf.data.Dataset.from_tensor_slices((_tuples(x),)).batch(BATCH)
        return dict(x=data), dict(x=inputs), 2
    if kind == "generator":
        return dict(x=_generator(x, y)), dict(x=_generator(x, y, targets=False)), 1
    return dict(x=Batches(x, y)), dict(x=Batches(x, y, targets=False)), 2


def run(container: str, kind: str, examples: int, strategy=None,
        initial: Optional[list] = None) -> harness.Result:
    """fit, evaluate and predict with ``container`` fed as ``kind``: plain
    Keras on one device (no ``strategy``), else after ``tfdist.attach``."""
    if strategy is None:
        model = build(container)
        _compile(model)
    else:
        with strategy.scope():
            model = build(container)
            _compile(model)
        model.set_weights(initial)
        tfdist.attach(model, strategy)
    x, y = arrays(container, examples)
    fit_data, predict_data, epochs = feed(kind, x, y)
    history = model.fit(**fit_data, epochs=epochs, shuffle=False, verbose=0)
    evaluate_data = feed(kind, x, y)[0]  # (a generator is spent)
    evaluation = model.evaluate(**evaluate_data, verbose=0, return_dict=True)
    predictions = [np.asarray(p) for p in
                   keras.tree.flatten(model.predict(**predict_data, verbose=0))]
    return harness.Result(model.get_weights(), dict(history.history), evaluation, predictions)


# Keras 3.15 itself cannot read lists from a generator or a PyDataset (its
# adapter hands tf.data a list as a signature); tfdist reads them as tuples.
KERAS_FAILS = {("list", "generator"), ("list", "py_dataset")}


def reference(container: str, kind: str, examples: int):
    """(initial weights, one device's Result). Where Keras cannot read the
    container (`KERAS_FAILS`: checked here, so a Keras that can is
    noticed), the same model fed tuples (the same values) is the reference."""
    initial = build(container).get_weights()
    if (container, kind) in KERAS_FAILS:
        try:
            run(container, kind, examples)
        except TypeError as error:
            assert "output_signature" in str(error), error
        else:
            raise AssertionError(f"Keras now reads a {container} from a {kind}: take it "
                                 "off KERAS_FAILS.")
        return initial, run("tuple", kind, examples)
    return initial, run(container, kind, examples)
