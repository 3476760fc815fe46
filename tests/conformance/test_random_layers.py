"""Random layers under N replicas (docs/guides/semantics.md, "Random layers").

One device draws independent values for every row of a global batch; N
replicas cannot draw the same numbers, so "exact" for them means: every
replica draws its own values (never the same mask on all), the run is the
same from run to run with the same seed, and a resumed run draws what the
uninterrupted run draws.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist

pytestmark = pytest.mark.conformance

ROWS_PER_REPLICA, FEATURES = 2, 16


class Recorder(keras.layers.Layer):
    """Keeps what its replica's rows were in the last training step (a
    sync-on-read variable: one copy per replica, read one by one)."""

    def build(self, input_shape):
        self.seen = tf.Variable(tf.zeros([ROWS_PER_REPLICA, FEATURES]), trainable=False,
                                synchronization=tf.VariableSynchronization.ON_READ,
                                aggregation=tf.VariableAggregation.SUM)

    def call(self, inputs, training=False):
        if training:
            self.seen.assign(inputs)
        return inputs


class OwnStep(keras.Model):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(y=y, y_pred=self(x, training=True))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables),
                             self.trainable_variables)
        return {}


def _model(layer, cls=keras.Model):
    inputs = keras.Input((FEATURES,))
    recorded = Recorder()(layer(inputs))
    model = cls(inputs, keras.layers.Dense(1, kernel_initializer="ones")(recorded))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


LAYERS = {
    "dropout": lambda: keras.layers.Dropout(0.5, seed=3),
    "gaussian_noise": lambda: keras.layers.GaussianNoise(1.0, seed=3),
}


def _recorded_draws(layer_name, cls, replicas=2):
    strategy = tfdist.make_strategy("mirrored", num_replicas=replicas)
    with strategy.scope():
        model = _model(LAYERS[layer_name](), cls)
    tfdist.attach(model, strategy)
    ones = np.ones((ROWS_PER_REPLICA * replicas, FEATURES), "float32")
    model.fit(ones, np.zeros((len(ones), 1), "float32"), batch_size=len(ones), epochs=2,
              verbose=0)
    recorder = model.layers[2]
    return [np.asarray(v) for v in strategy.experimental_local_results(recorder.seen)]


@pytest.mark.parametrize("cls", [keras.Model, OwnStep], ids=["tfdist_step", "own_train_step"])
@pytest.mark.parametrize("layer_name", sorted(LAYERS))
def test_each_replica_draws_its_own_values_the_same_every_run(layer_name, cls):
    first, second = _recorded_draws(layer_name, cls)
    assert not np.allclose(first, 1.0), "the layer drew nothing (inactive?)"
    assert not np.array_equal(first, second), "every replica drew the same values"
    again = _recorded_draws(layer_name, cls)
    np.testing.assert_array_equal(np.stack([first, second]), np.stack(again))


def _dropout_mlp():
    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dropout(0.5, seed=7),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    return model


def _dropout_run(tmp_path, epochs_in_first_call, seed_offset=0):
    """3 epochs on 3 replicas with checkpoints; the first call stops after
    ``epochs_in_first_call`` epochs and a fresh process-like start (a new
    model and Trainer on the same checkpoint_dir) finishes the run."""
    rng = np.random.RandomState(0)
    x = rng.randn(75, 6).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    strategy = tfdist.make_strategy("mirrored", num_replicas=3)
    weights = None
    for epochs in (epochs_in_first_call, 3):
        with strategy.scope():
            model = _dropout_mlp()
        if seed_offset:
            model.layers[1].seed_generator.state.assign([seed_offset, 0])
        tfdist.Trainer(model, strategy, checkpointing=tfdist.CheckpointOptions(str(tmp_path))).fit(
            dataset, epochs=epochs, verbose=0)
        weights = model.get_weights()
    return weights


def test_a_resumed_run_draws_what_the_uninterrupted_run_draws(tmp_path):
    uninterrupted = _dropout_run(tmp_path / "whole", 3)
    resumed = _dropout_run(tmp_path / "resumed", 1)
    for want, got in zip(uninterrupted, resumed):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    other_draws = _dropout_run(tmp_path / "other", 3, seed_offset=99)
    assert max(float(np.abs(a - b).max()) for a, b in zip(uninterrupted, other_draws)) > 1e-3
