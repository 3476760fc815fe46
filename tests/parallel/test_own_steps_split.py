"""A model's own ``train_step`` and ``test_step`` on weights split over the
model axis (`tfdist._internal.keras.step_weights`): keras.io's step, written
with ``self.trainable_variables`` and ``self.optimizer.apply``, trains on
the shards, as one device trains the whole weights (weights, History,
evaluate, predict to 1e-5) on meshes of 1 x 2 and 2 x 2, and 2 x 2 with the
shards sliced over the replicas (``FullySharded``); a GAN's two sub-models
and optimizers too. What it cannot run is refused by name: a pipeline (it
cuts tfdist's step into micro-batches), and a whole read of a split weight
in the user's step (it would gather the shards)."""

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.parallel import test_model_pipeline as stacked, test_tensor_parallel as flat
from tests.support import models, reference as ref
from tests.support.strategy_columns import collectives_bounded
from tfdist.communication import FullySharded
from tfdist.errors import ConfigurationError
from tfdist.parallel import tensor_parallel

BATCH = flat.BATCH


class OwnSteps(models.GuideTrainStep, models.GuideTestStep):
    """keras.io's ``train_step`` and a ``test_step`` of its own."""


class ReadsAKernelWhole(models.GuideTrainStep):
    """A step that adds a penalty on ``d1``'s kernel by hand (a whole read)."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(y=y, y_pred=self(x, training=True))
            loss += 0.01 * tf.reduce_sum(tf.square(self.get_layer("d1").kernel))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables),
                             self.trainable_variables)
        return {}


def _own(cls=OwnSteps, optimizer="adam", clipnorm=None):
    mlp = flat._mlp()  # pylint: disable=protected-access
    model = flat._compiled(cls(mlp.inputs, mlp.outputs), optimizer)  # pylint: disable=protected-access
    model.optimizer.clipnorm = clipnorm
    return model


def _split(data, build, communication=None):
    devices = tfdist.strategies.configure_logical_cpus(4)
    strategy = (tfdist.make_strategy("mirrored", devices=devices[:2 * data:2]) if data > 1
                else tf.distribute.get_strategy())
    with strategy.scope():
        model = build()
    tfdist.attach(model, strategy if data > 1 else None, communication=communication,
                  parallel=flat._layout(data, 2, devices[:2 * data], flat.MEGATRON))  # pylint: disable=protected-access
    return model, strategy


@pytest.mark.parametrize("data,optimizer,clipnorm,sharded", [
    (1, "adam", None, False),
    (2, "sgd", 0.05, False),   # (clipnorm binds: each split weight by its whole norm)
    (2, "adam", 0.05, True),   # (the shards sliced over the replicas)
])
def test_own_steps_on_split_weights_equal_one_device(data, optimizer, clipnorm, sharded):
    x, y = flat._data()  # pylint: disable=protected-access
    expected = _own(optimizer=optimizer, clipnorm=clipnorm)
    expected_history = expected.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    model, strategy = _split(data, lambda: _own(optimizer=optimizer, clipnorm=clipnorm),
                             FullySharded() if sharded else None)
    with collectives_bounded(strategy, seconds=120):
        history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    kernel = model.get_layer("d1").kernel
    assert [tuple(s.shape) for s in tensor_parallel.shards_of(kernel)] == [(5, 4), (5, 4)]
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history.history, history.history)
    np.testing.assert_allclose(model.predict(x, batch_size=BATCH, verbose=0),
                               expected.predict(x, batch_size=BATCH, verbose=0), atol=1e-5)
    ref.assert_logs_close(expected.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True),
                          model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True))
    # Outside the step the model lists its weights whole, as Keras does.
    assert [tuple(w.shape) for w in model.trainable_weights][:2] == [(5, 8), (8,)]


def test_a_whole_read_of_a_split_weight_in_the_own_step_is_refused_by_name():
    model, _ = _split(1, lambda: _own(ReadsAKernelWhole))
    # (TensorFlow's conversion of the read wraps tfdist's error in a ValueError)
    with pytest.raises((ConfigurationError, ValueError),
                       match=r"weight 'd1/kernel' is split over the model axis"):
        model.fit(*flat._data(), batch_size=BATCH, verbose=0)  # pylint: disable=protected-access


def test_an_own_step_with_a_pipeline_is_refused_by_name():
    with pytest.raises(ConfigurationError, match=r"own train_step, test_step together with a "
                                                 r"pipeline"):
        model = stacked._composed(_own(), ["d2"], 2, rules=flat.MEGATRON)  # pylint: disable=protected-access
        model.fit(*flat._data(), batch_size=BATCH, verbose=0)  # pylint: disable=protected-access
