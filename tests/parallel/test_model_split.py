"""A model Keras builds on its first batch (a subclassed model, a
``Sequential`` without an ``Input``) under a pipeline: the one added line
runs where plain ``fit`` runs, the stages take effect when tfdist builds
the model (`tfdist.parallel.plan`), and the run equals the same
program on one device with plain Keras; so do fully sharded weights, alone
and within a pipeline's stages."""

import keras
import numpy as np
import pytest

import tfdist
from tests.support import reference as ref
from tfdist.communication import FullySharded

EXAMPLES, BATCH = 70, 16  # the last batch of 6: uneven over 3 replicas


def _dense(units, name, activation=None, seed=0):
    # Seeded initializers: the weights are made at the first batch, so
    # they must not depend on what else drew random numbers before.
    return keras.layers.Dense(units, activation, name=name,
                              kernel_initializer=keras.initializers.GlorotUniform(seed),
                              bias_initializer="zeros")


class Subclassed(keras.Model):
    """keras.io's RecommenderNet shape: layers made in __init__, used in call."""

    def __init__(self):
        super().__init__()
        self.hidden = _dense(8, "hidden", "relu", seed=1)
        self.middle = _dense(8, "middle", "tanh", seed=2)
        self.out = _dense(ref.NUM_CLASSES, "out", "softmax", seed=3)

    def call(self, inputs):
        return self.out(self.middle(self.hidden(inputs)))


def _sequential():
    return keras.Sequential([_dense(8, "hidden", "relu", seed=1),
                             _dense(8, "middle", "tanh", seed=2),
                             _dense(ref.NUM_CLASSES, "out", "softmax", seed=3)])


BUILDS = {"sequential_without_input": _sequential, "subclassed": Subclassed}


def _compiled(build):
    model = build()
    model.compile(optimizer=keras.optimizers.Adam(0.02),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _fit(model):
    x, y, _ = ref.classification_arrays(EXAMPLES)
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    return model.get_weights(), history, model.evaluate(x, y, batch_size=BATCH, verbose=0)


def _assert_equal(expected, actual):
    ref.assert_weight_lists_close(expected[0], actual[0])
    ref.assert_logs_close(expected[1], actual[1])
    np.testing.assert_allclose(actual[2], expected[2], rtol=1e-5)


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_fully_sharded_weights_of_a_model_built_on_its_first_batch_equal_one_device(build):
    """The one added line ``communication=FullySharded()`` on 3 replicas:
    the weights are sliced when tfdist builds the model (it was refused)."""
    expected = _fit(_compiled(BUILDS[build]))
    strategy = tfdist.make_strategy("mirrored", num_replicas=3)
    with strategy.scope():
        model = _compiled(BUILDS[build])
    assert not model.built
    tfdist.attach(model, strategy, communication=FullySharded())
    _assert_equal(expected, _fit(model))
    kernel = model.layers[-1].kernel.value.values  # (8 x 3 = 24 elements: 8 per replica)
    assert [tuple(c.shape) for c in kernel] == [(8,)] * 3


def test_fully_sharded_stages_of_a_model_built_on_its_first_batch_equal_one_device():
    """Data x pipeline x fully sharded on a subclassed model: 2 replicas x
    2 stages, each stage's slices on its devices once tfdist builds it."""
    expected = _fit(_compiled(Subclassed))
    strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    with strategy.scope():
        model = _compiled(Subclassed)
    tfdist.attach(model, strategy, communication=FullySharded(),
                  parallel=tfdist.parallel.Pipeline(cuts=["hidden"], micro_batches=2))
    _assert_equal(expected, _fit(model))
    kernel = model.get_layer("out").kernel.value.values
    assert [(c.device[-5:], tuple(c.shape)) for c in kernel] == [("CPU:2", (12,)),
                                                                ("CPU:3", (12,))]


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_a_pipeline_of_a_model_built_on_its_first_batch_equals_one_device(build):
    expected = _fit(_compiled(BUILDS[build]))
    model = _compiled(BUILDS[build])
    pipeline = tfdist.parallel.Pipeline(cuts=["hidden", "middle"], micro_batches=4)
    tfdist.attach(model, parallel=pipeline)
    _assert_equal(expected, _fit(model))
    # Each stage's weights on its device.
    devices = [{w.value.device for w in layer.weights} for layer in model.layers]
    assert [len(d) for d in devices] == [1, 1, 1] and len(set().union(*devices)) == 3, devices
