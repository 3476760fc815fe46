"""Issue 11, point 9: a replica without real examples gets masked padding.

TensorFlow 2.21's oneDNN convolutions return a tensor shaped like their
input on a 0-example batch (``MklConvOp::Compute`` allocates the output with
the input's shape), so the next convolution fails: "input depth must be
evenly divisible by filter depth: 1 vs 3". oneDNN kernels are on by default
on CPUs with AVX-512 VNNI / AMX, off on this machine's AVX2 CPU, so
`test_convnet_under_onednn_kernels` reruns the convnet cases with
``TF_ENABLE_ONEDNN_OPTS=1``. tfdist pads empty replicas instead. These
tests train models that would hit that (convnets, synchronized batch norm,
recurrent layers) on 3 and 4 replicas with a last global batch of 2
examples, and compare with single-device Keras ``fit`` on the same batches:
the padding must contribute nothing to losses, gradients, metrics or the
synchronized batch statistics.
"""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tests.support import short_form

EPOCHS = 2
BATCH = 8
NUM_EXAMPLES = 34  # last global batch: 2 examples -> 1 or 2 replicas empty


def _images(seed=0):
    rng = np.random.RandomState(seed)
    x = rng.randn(NUM_EXAMPLES, 6, 6, 1).astype("float32")
    y = (x[:, :3, :3, 0].mean(axis=(1, 2)) > 0).astype("int64") + (x[:, 3:, 3:, 0].mean(axis=(1, 2)) > 0.2)
    return tf.data.Dataset.from_tensor_slices((x, y.astype("int64"))).batch(BATCH)


def _sequences(seed=0):
    rng = np.random.RandomState(seed)
    x = rng.randn(NUM_EXAMPLES, 5, 2).astype("float32")
    y = (x[:, :, 0].sum(axis=1) > 0).astype("int64") + (x[:, -1, 1] > 1).astype("int64")
    w = rng.uniform(0.5, 1.5, NUM_EXAMPLES).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y, w)).batch(BATCH)


def _convnet():
    keras.utils.set_random_seed(3)
    return keras.Sequential([
        keras.Input((6, 6, 1)),
        # 1 input channel, 3 filters, no bias add to repair the shape: the
        # oneDNN kernel's empty output has 1 channel where 3 are expected.
        keras.layers.Conv2D(3, 1, use_bias=False),
        # No bias before batch norm: its exact gradient is 0, so Adam would
        # turn round-off into steps of the learning rate's size.
        keras.layers.Conv2D(3, 3, padding="same", use_bias=False),
        keras.layers.BatchNormalization(synchronized=True),
        keras.layers.Activation("relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(3, activation="softmax"),
    ])


def _recurrent(layer):
    def build():
        keras.utils.set_random_seed(4)
        return keras.Sequential([
            keras.Input((5, 2)), layer(6), keras.layers.Dense(3, activation="softmax"),
        ])
    return build


def _compile(model):
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="weighted_acc")],
    )
    return model


# CI: each model on one replica count, 4, 3, 4 (--full: both).
@pytest.mark.parametrize("build, data, num_replicas", short_form.in_turn([
    (_convnet, _images),
    (_recurrent(keras.layers.SimpleRNN), _sequences),
    (_recurrent(keras.layers.LSTM), _sequences),
], (4, 3), ids=["convnet_sync_bn", "simple_rnn", "lstm"]))
def test_models_on_empty_replicas_equal_one_device(make_strategy, num_replicas, build, data):
    dataset = data()
    expected = _compile(build())
    expected_history = expected.fit(dataset, epochs=EPOCHS, verbose=0, shuffle=False).history

    strategy = make_strategy(num_replicas)
    with strategy.scope():
        model = _compile(build())
    trainer = tfdist.Trainer(model, strategy)
    history = trainer.fit(dataset, epochs=EPOCHS, verbose=0).history

    # Weights include BatchNormalization's moving mean and variance.
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history, history)
    ref.assert_logs_close(expected.evaluate(dataset, verbose=0, return_dict=True),
                          trainer.evaluate(dataset))


def test_a_masked_average_over_a_padded_row_stays_finite(make_strategy):
    """Ids averaged over their ``mask_zero`` mask, on 3 replicas with a last
    batch of 2 rows: the third replica's padding row must be one a model
    computes on as on real ones. A row of zero ids is masked out whole and
    averages to 0 / 0: its NaN survived the mask's 0 weight (0 * NaN) into
    the weights, where one device trains on."""
    rng = np.random.RandomState(2)
    ids = rng.randint(1, 20, (NUM_EXAMPLES, 5)).astype("int32")
    ids[:, 3:] = np.where(rng.rand(NUM_EXAMPLES, 2) < 0.5, 0, ids[:, 3:])
    dataset = tf.data.Dataset.from_tensor_slices(
        (ids, rng.randn(NUM_EXAMPLES, 1).astype("float32"))).batch(BATCH)

    def build():
        keras.utils.set_random_seed(5)
        model = keras.Sequential([keras.Input((5,), dtype="int32"),
                                  keras.layers.Embedding(20, 4, mask_zero=True),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
        return model

    expected = build()
    expected_history = expected.fit(dataset, epochs=EPOCHS, verbose=0, shuffle=False).history
    strategy = make_strategy(3)
    with strategy.scope():
        model = build()
    history = tfdist.Trainer(model, strategy).fit(dataset, epochs=EPOCHS, verbose=0).history
    ref.assert_logs_close(expected_history, history)
    ref.assert_weights_close(expected, model)


def test_synchronized_statistics_skip_padded_rows(make_strategy):
    """The batch statistics themselves: one BatchNormalization layer on 4
    replicas, a batch of 2 real rows padded with large values, equals the
    statistics of the 2 rows."""
    strategy = make_strategy(4)
    with strategy.scope():
        layer = keras.layers.BatchNormalization(synchronized=True, momentum=0.0)
        layer.build((None, 1))

    rows = tf.constant([[1.0], [3.0], [100.0], [100.0]])  # last two: padding
    mask = tf.constant([1.0, 1.0, 0.0, 0.0])

    @tf.function
    def step():
        def replica():
            index = tf.distribute.get_replica_context().replica_id_in_sync_group
            with tfdist._internal.keras.batch_statistics.statistics_over_real_rows(mask[index:index + 1]):
                layer(rows[index:index + 1], training=True)
        strategy.run(replica)

    step()
    np.testing.assert_allclose(layer.moving_mean.numpy(), [2.0], atol=1e-6)
    np.testing.assert_allclose(layer.moving_variance.numpy(), [1.0], atol=1e-6)


@pytest.mark.skipif(os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "1",
                    reason="already running under oneDNN kernels")
def test_convnet_under_onednn_kernels(tmp_path):
    """The convnet cases again with oneDNN convolutions (a fresh process:
    the choice is made when TensorFlow starts)."""
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1", TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
         "-k", "convnet_sync_bn or statistics", "--full"],  # both replica counts
        env=env, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "3 passed" in result.stdout, result.stdout[-2000:]
