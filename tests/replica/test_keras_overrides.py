"""A model's own Keras step (keras.io "Customizing what happens in fit()"),
honoured by `tfdist.attach` and exact against single-device Keras ``fit``
on the same data and order (`tfdist.replica.keras_steps`)."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

import tfdist
from tests.support import reference as ref
from tests.support import short_form
from tests.support.models import GuideTrainStep, PenaltyLoss, ReturnsBatchValues
from tests.support.models import compiled_model as _compiled, functional_as as _functional
from tfdist.errors import ConfigurationError

EPOCHS = 3


class OwnMean(keras.Model):
    """A VAE-style step: its own ``ops.mean`` loss and its own trackers."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.total_tracker = keras.metrics.Mean(name="total")

    @property
    def metrics(self):
        return [self.total_tracker]

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            per_example = keras.losses.sparse_categorical_crossentropy(y, y_pred)
            total = ops.mean(per_example) + ops.sum(self.losses)
        gradients = tape.gradient(total, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        self.total_tracker.update_state(total)
        return {"total": self.total_tracker.result()}


def _data(num_examples, batch):
    x, y, _ = ref.classification_arrays(num_examples)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def _fit_both(cls, num_replicas, make_strategy, num_examples, batch):
    expected = _compiled(cls)
    expected_history = expected.fit(_data(num_examples, batch), epochs=EPOCHS, verbose=0)
    strategy = make_strategy(num_replicas)
    with strategy.scope():
        model = _compiled(cls)
    tfdist.attach(model, strategy)
    history = model.fit(_data(num_examples, batch), epochs=EPOCHS, verbose=0)
    return expected, expected_history, model, history


@pytest.mark.parametrize("cls", [GuideTrainStep, PenaltyLoss])
@pytest.mark.parametrize("num_replicas", [1, 3, 4])
def test_compute_loss_steps_equal_one_device_with_partial_batches(make_strategy, cls,
                                                                  num_replicas):
    # 112 rows in batches of 24: the last batch of 16 splits 6, 6, 4 on 3.
    expected, expected_history, model, history = _fit_both(
        cls, num_replicas, make_strategy, 112, 24)
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history.history, history.history)


@pytest.mark.parametrize("cls", [GuideTrainStep, PenaltyLoss])
def test_weights_stay_exact_when_the_last_batch_leaves_a_replica_empty(make_strategy, cls):
    # 100 rows in batches of 24: the last batch of 4 splits 2, 2, 0 on 3.
    expected, expected_history, model, history = _fit_both(cls, 3, make_strategy, 100, 24)
    ref.assert_weights_close(expected, model)
    if cls is GuideTrainStep:  # a penalty outside Keras' reductions: see keras_steps
        ref.assert_logs_close(expected_history.history, history.history)


@pytest.mark.parametrize("num_replicas", [2, 4])
def test_own_mean_equals_one_device_on_equal_replica_batches(make_strategy, num_replicas):
    expected, expected_history, model, history = _fit_both(
        OwnMean, num_replicas, make_strategy, 96, 24)
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history.history, history.history)


def test_the_override_is_really_run(make_strategy):
    # The penalty changes the result: tfdist's compiled-loss step would not.
    plain = _compiled(keras.Model)
    plain.fit(_data(96, 24), epochs=EPOCHS, verbose=0)
    strategy = make_strategy(2)
    with strategy.scope():
        model = tfdist.attach(_compiled(PenaltyLoss), strategy)
    model.fit(_data(96, 24), epochs=EPOCHS, verbose=0)
    gap = max(float(np.max(np.abs(a - b)))
              for a, b in zip(plain.get_weights(), model.get_weights()))
    assert gap > 1e-3


def test_evaluate_runs_the_models_test_step(make_strategy):
    expected = _compiled(PenaltyLoss)
    strategy = make_strategy(3)
    with strategy.scope():
        model = tfdist.attach(_compiled(PenaltyLoss), strategy)
    np.testing.assert_allclose(model.evaluate(_data(54, 16), verbose=0),
                               expected.evaluate(_data(54, 16), verbose=0), rtol=1e-5)


@pytest.mark.parametrize("num_replicas,num_examples", [
    # batches of 16, the last 6 rows: 2 + 2 + 2, uneven against the full ones
    # (full form: the case below has it too, with empty replicas)
    pytest.param(3, 54, marks=pytest.mark.full_form),
    (4, 66)])  # the last batch 2 rows: 1 + 1 + 0 + 0, two empty replicas
def test_values_a_step_returns_beside_the_metrics_equal_one_device(make_strategy, num_replicas,
                                                                   num_examples):
    """keras.io's distillation pattern: a Keras-scaled loss, a plain
    ``ops.mean`` and a constant returned beside the metrics are reported in
    History (training's and ``val_``) and by evaluate as on one device."""
    expected = _compiled(ReturnsBatchValues)
    want = expected.fit(_data(num_examples, 16), validation_data=_data(num_examples, 16),
                        epochs=2, verbose=0).history
    want_evaluation = expected.evaluate(_data(num_examples, 16), verbose=0, return_dict=True)
    strategy = make_strategy(num_replicas)
    with strategy.scope():
        model = tfdist.attach(_compiled(ReturnsBatchValues), strategy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = model.fit(_data(num_examples, 16), validation_data=_data(num_examples, 16),
                        epochs=2, verbose=0).history
        got_evaluation = model.evaluate(_data(num_examples, 16), verbose=0, return_dict=True)
    assert {"batch_loss", "batch_confidence", "val_batch_rows"} <= set(want)
    ref.assert_logs_close(want, got)
    ref.assert_logs_close(want_evaluation, got_evaluation)
    stated = [str(w.message) for w in caught if "beside `model.metrics`" in str(w.message)]
    assert len(stated) == 2 and all("weighted by their rows" in s for s in stated), stated
    assert "ReturnsBatchValues.train_step returns ['batch_confidence', 'batch_loss', " \
           "'batch_rows']" in stated[0]


def test_returned_values_that_cannot_be_combined_are_named_in_a_warning(make_strategy):
    class ExtraKey(GuideTrainStep):
        def train_step(self, data):
            logs = super().train_step(data)
            return {**logs, "gradient_norm": tf.constant(0.25), "logits": self(data[0])}

    strategy = make_strategy(2)
    with strategy.scope():
        model = tfdist.attach(_compiled(ExtraKey), strategy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(_data(48, 24), epochs=1, verbose=0).history
    refused = [str(w.message) for w in caught if "not scalars" in str(w.message)]
    assert len(refused) == 1 and "['logits']" in refused[0], refused
    assert "logits" not in history and history["gradient_norm"] == [0.25]


def test_options_the_own_step_cannot_honour_are_errors(make_strategy):
    strategy = make_strategy(2)
    with strategy.scope():
        model = _compiled(GuideTrainStep)
    with pytest.raises(ConfigurationError, match="`static_shapes`.*train_step"):
        tfdist.Trainer(model, strategy, static_shapes=True)


def test_global_mean_is_a_plain_mean_outside_tfdist():
    values = tf.constant([1.0, 2.0, 6.0])
    assert float(tfdist.replica.global_mean(values)) == pytest.approx(3.0)


def test_predict_runs_the_models_predict_step(make_strategy):
    class Doubled(keras.Model):
        def predict_step(self, data):
            return 2.0 * self(data, training=False)  # Keras hands a lone input as is

    x, _, _ = ref.classification_arrays(30)
    expected = _functional(Doubled)
    strategy = make_strategy(4)
    with strategy.scope():
        model = _functional(Doubled)
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    tfdist.attach(model, strategy)
    np.testing.assert_allclose(model.predict(x, batch_size=8, verbose=0),
                               expected.predict(x, batch_size=8, verbose=0), atol=1e-6)
    np.testing.assert_allclose(model.predict(x, batch_size=8, verbose=0),
                               2.0 * np.asarray(expected(tf.constant(x))), atol=1e-6)


class GAN(keras.Model):
    """keras.io's GAN, with its noise read from the data (x = real | latent)
    so one device and N replicas see the same noise; x-only data."""

    def __init__(self, seed=3):
        super().__init__()
        keras.utils.set_random_seed(seed)
        self.discriminator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, "relu"),
                                               keras.layers.Dense(1)])
        self.generator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4)])
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

    def call(self, x):
        return self.discriminator(self.generator(x[:, 4:]))

    def train_step(self, data):
        real, latent = data[:, :4], data[:, 4:]
        fake = self.generator(latent)
        combined = ops.concatenate([fake, real], axis=0)
        labels = ops.concatenate([ops.ones((ops.shape(real)[0], 1)),
                                  ops.zeros((ops.shape(real)[0], 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(combined))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(ops.zeros((ops.shape(real)[0], 1)),
                                  self.discriminator(self.generator(latent)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


def _gan():
    model = GAN()
    model.compile(keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.01),
                  keras.losses.BinaryCrossentropy(from_logits=True))
    model(np.zeros((1, 6), "float32"))
    return model


@pytest.mark.parametrize("num_replicas", short_form.only([1, 2, 4], in_ci=(4,)))
def test_gan_on_x_only_data_with_two_optimizers_equals_one_device(make_strategy, num_replicas):
    x = np.random.RandomState(5).randn(64, 6).astype("float32")
    data = lambda: tf.data.Dataset.from_tensor_slices(x).batch(16)  # noqa: E731
    expected = _gan()
    expected_history = expected.fit(data(), epochs=EPOCHS, verbose=0)
    strategy = make_strategy(num_replicas)
    with strategy.scope():
        model = tfdist.attach(_gan(), strategy)
    history = model.fit(data(), epochs=EPOCHS, verbose=0)
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history.history, history.history)


def test_x_only_data_for_a_compiled_loss_is_a_clear_error(make_strategy):
    strategy = make_strategy(2)
    with strategy.scope():
        model = tfdist.attach(_compiled(keras.Model), strategy)
    x, _, _ = ref.classification_arrays(32)
    with pytest.raises(ConfigurationError, match="x only.*compiled loss needs targets"):
        model.fit(tf.data.Dataset.from_tensor_slices(x).batch(8), epochs=1, verbose=0)


@pytest.mark.parametrize("num_replicas", short_form.only([1, 3], in_ci=(3,)))
def test_gan_on_arrays_without_y_equals_one_device(make_strategy, num_replicas):
    """``fit(x)`` with arrays and no ``y`` (Keras accepts it for a model
    with its own step); batch 16 of 56 rows: a partial last batch."""
    x = np.random.RandomState(5).randn(56, 6).astype("float32")
    expected = _gan()
    expected_history = expected.fit(x, batch_size=16, epochs=EPOCHS, shuffle=False, verbose=0)
    strategy = make_strategy(num_replicas)
    with strategy.scope():
        model = tfdist.attach(_gan(), strategy)
    history = model.fit(x, batch_size=16, epochs=EPOCHS, shuffle=False, verbose=0)
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history.history, history.history)
