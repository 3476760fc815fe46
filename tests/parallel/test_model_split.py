"""A model Keras builds on its first batch (a subclassed model, a
``Sequential`` without an ``Input``) under a pipeline: the one added line
runs where plain ``fit`` runs, the stages take effect when tfdist builds
the model (`tfdist.parallel.plan`), and the run equals the same
program on one device with plain Keras. Fully sharded weights still refuse
such a model, naming the fix."""

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
def test_fully_sharded_weights_refuse_a_model_built_on_its_first_batch_naming_the_fix(build):
    strategy = tfdist.make_strategy("mirrored", num_replicas=3)
    with strategy.scope():
        model = _compiled(BUILDS[build])
    with pytest.raises(tfdist.errors.ConfigurationError, match="must be built first"):
        tfdist.attach(model, strategy, communication=FullySharded()).fit(
            *ref.classification_arrays(EXAMPLES)[:2], verbose=0)


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
