"""The model families Keras users write, each a `Case` the conformance suite
runs against single-device Keras.

A case builds an uncompiled model from a fixed seed (`Case.build`), compiles
it (`Case.compile`) and makes its data: a function of the number of examples
and the global batch size that returns a `tf.data.Dataset` of global
batches, always in the same order. Nothing here knows tfdist: the reference
run and the tfdist run both call these functions, so what differs between
them is only the strategy and tfdist.

Kept to small shapes (a handful of units, ~100 examples): the suite judges
arithmetic, not learning, and each case runs in seconds.
"""

import dataclasses
from typing import Callable, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

from tests.support import models

VOCABULARY = 21
SEQUENCE = 10
CLASSES = 3


@dataclasses.dataclass(frozen=True)
class Case:
    """One model family (or one option of `fit`) in the conformance matrix."""

    name: str
    build: Callable[[], keras.Model]
    compile: Callable[[keras.Model], None]
    dataset: Callable[[int, int], tf.data.Dataset]  # (examples, global batch) -> batches
    epochs: int = 2
    # Max |weight| difference from one device; "calibrated": Adam-like
    # optimizers amplify float32 round-off, so the bound is a small
    # multiple of what reordering each batch's rows does on one device.
    tolerance: object = 1e-5
    fit_options: dict = dataclasses.field(default_factory=dict)
    # Replica counts on which tfdist cannot equal one device by design
    # (per-replica batch statistics), with the reason and the warning it gives.
    not_exact_over_replicas: Optional[str] = None
    # Entry points beyond `attach` + fit / evaluate / predict.
    trainer: bool = True
    custom_loop: bool = False
    # Where predict / evaluate do not apply: no call() (keras.io's GAN), no
    # compiled loss for Keras' default test_step (a train_step-only model).
    predicts: bool = True
    evaluates: bool = True
    # The one-device reference when it is not the same compile on the same
    # batches: exact gradient accumulation over k batches is one step on a
    # batch k times as large (Keras' own accumulation averages the k means).
    reference_compile: Optional[Callable[[keras.Model], None]] = None
    reference_batch_factor: int = 1


def _seeded(build):
    def seeded():
        keras.utils.set_random_seed(1)
        return build()
    return seeded


def _sgd(model, **compile_options):
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss="sparse_categorical_crossentropy", **compile_options)


def _sgd_with_accuracy(model):
    _sgd(model, metrics=["accuracy"])


# Data ---------------------------------------------------------------------

def _token_arrays(examples: int, seed: int = 0):
    rng = np.random.RandomState(seed)
    x = rng.randint(1, VOCABULARY, size=(examples, SEQUENCE)).astype("int32")
    y = ((x[:, 0] + x[:, 1]) % CLASSES).astype("int64")
    return x, y


def tokens(examples: int, batch: int) -> tf.data.Dataset:
    x, y = _token_arrays(examples)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def padded_sequences(examples: int, batch: int) -> tf.data.Dataset:
    """Sequences of 2..SEQUENCE ids, zero-padded per batch to its longest:
    every batch has its own length (what ``padded_batch`` users train on)."""
    rng = np.random.RandomState(0)
    lengths = rng.randint(2, SEQUENCE + 1, size=examples)
    rows = [rng.randint(1, VOCABULARY, size=n).astype("int32") for n in lengths]
    labels = np.array([(r[0] + r[-1]) % CLASSES for r in rows], "int64")

    def generate():
        yield from zip(rows, labels)

    dataset = tf.data.Dataset.from_generator(generate, output_signature=(
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int64)))
    return dataset.padded_batch(batch)


def _feature_arrays(examples: int, features: int = 6, seed: int = 0):
    rng = np.random.RandomState(seed)
    x = rng.randn(examples, features).astype("float32")
    y = ((x[:, 0] + 0.5 * x[:, 1] > 0).astype("int64") + (x[:, 2] > 1).astype("int64"))
    return x, y


def features(examples: int, batch: int) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(_feature_arrays(examples)).batch(batch)


def weighted_features(examples: int, batch: int) -> tf.data.Dataset:
    x, y = _feature_arrays(examples)
    w = np.random.RandomState(3).uniform(0.2, 2.0, examples).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y, w)).batch(batch)


def images(examples: int, batch: int) -> tf.data.Dataset:
    rng = np.random.RandomState(0)
    x = rng.randn(examples, 8, 8, 2).astype("float32")
    y = (x[:, :4, :4, 0].mean(axis=(1, 2)) > 0).astype("int64") + (x[..., 1].mean(axis=(1, 2)) > 0.1)
    return tf.data.Dataset.from_tensor_slices((x, y.astype("int64"))).batch(batch)


def pairs(examples: int, batch: int) -> tf.data.Dataset:
    left, y = _token_arrays(examples, seed=0)
    right, _ = _token_arrays(examples, seed=1)
    return tf.data.Dataset.from_tensor_slices(((left, right), y)).batch(batch)


def dict_features(examples: int, batch: int) -> tf.data.Dataset:
    """A numeric block, a categorical id and a string: two named targets."""
    x, y = _feature_arrays(examples, features=4)
    rng = np.random.RandomState(4)
    category = rng.randint(0, 7, size=examples).astype("int32")
    colour = np.array(["red", "green", "blue", "gold"])[rng.randint(0, 4, size=examples)]
    target = (x[:, 0] * 0.5 + category * 0.1).astype("float32")[:, None]
    inputs = {"numbers": x, "category": category, "colour": colour}
    targets = {"label": y, "score": target}
    return tf.data.Dataset.from_tensor_slices((inputs, targets)).batch(batch)


# Models -------------------------------------------------------------------

def embedding_pooling():
    return keras.Sequential([
        keras.Input((SEQUENCE,), dtype="int32"), keras.layers.Embedding(VOCABULARY, 8),
        keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(CLASSES, activation="softmax")])


def embedding_recurrent(layer):
    def build():
        return keras.Sequential([
            keras.Input((None,), dtype="int32"),
            keras.layers.Embedding(VOCABULARY, 8, mask_zero=True), layer(6),
            keras.layers.Dense(CLASSES, activation="softmax")])
    return build


def embedding_time_distributed():
    return keras.Sequential([
        keras.Input((SEQUENCE,), dtype="int32"), keras.layers.Embedding(VOCABULARY, 8),
        keras.layers.TimeDistributed(keras.layers.Dense(4, activation="relu")),
        keras.layers.GlobalMaxPooling1D(), keras.layers.Dense(CLASSES, activation="softmax")])


def tied_embedding():
    """A siamese pair: one embedding, used on both inputs."""
    left = keras.Input((SEQUENCE,), dtype="int32")
    right = keras.Input((SEQUENCE,), dtype="int32")
    shared = keras.layers.Embedding(VOCABULARY, 8)
    pool = keras.layers.GlobalAveragePooling1D()
    merged = keras.layers.Concatenate()([pool(shared(left)), pool(shared(right))])
    outputs = keras.layers.Dense(CLASSES, activation="softmax")(merged)
    return keras.Model([left, right], outputs)


def transformer_encoder():
    """An encoder block: embedding, self-attention with a padding mask,
    residuals, LayerNormalization and a GELU feed-forward."""
    tokens_in = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(VOCABULARY, 8, mask_zero=True)(tokens_in)
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)(embedded, embedded)
    hidden = keras.layers.LayerNormalization()(embedded + attended)
    feed = keras.layers.Dense(8)(keras.layers.Dense(16, activation="gelu")(hidden))
    hidden = keras.layers.LayerNormalization()(hidden + feed)
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    return keras.Model(tokens_in, keras.layers.Dense(CLASSES, activation="softmax")(pooled))


def cnn(synchronized: bool):
    def build():
        return keras.Sequential([
            keras.Input((8, 8, 2)), keras.layers.Conv2D(4, 3, padding="same"),
            keras.layers.BatchNormalization(synchronized=synchronized),
            keras.layers.Activation("relu"), keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(CLASSES, activation="softmax")])
    return build


def separable_cnn():
    return keras.Sequential([
        keras.Input((8, 8, 2)), keras.layers.DepthwiseConv2D(3, padding="same"),
        keras.layers.SeparableConv2D(4, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(CLASSES, activation="softmax")])


def dict_model():
    """Named inputs and outputs: numbers normalized in the model, an
    embedded categorical id, a string through StringLookup."""
    numbers = keras.Input((4,), name="numbers")
    category = keras.Input((), dtype="int32", name="category")
    colour = keras.Input((), dtype="string", name="colour")
    normalization = keras.layers.Normalization()
    normalization.adapt(_feature_arrays(64, features=4)[0])
    lookup = keras.layers.StringLookup(vocabulary=["red", "green", "blue"], output_mode="one_hot")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(7, 3)(
        keras.layers.Reshape((1,))(category)))
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()(
        [normalization(numbers), embedded, lookup(colour)]))
    return keras.Model(
        {"numbers": numbers, "category": category, "colour": colour},
        {"label": keras.layers.Dense(CLASSES, activation="softmax", name="label")(hidden),
         "score": keras.layers.Dense(1, name="score")(hidden)})


def compile_dict(model):
    model.compile(
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss={"label": "sparse_categorical_crossentropy", "score": "mse"},
        loss_weights={"label": 1.0, "score": 0.5},
        metrics={"label": ["accuracy"], "score": [keras.metrics.MeanAbsoluteError()]})


def mlp(kernel_l2: float = 0.0, activity_l2: float = 0.0, dropout: float = 0.0):
    def build():
        layers = [keras.Input((6,)), keras.layers.Dense(
            8, activation="relu",
            kernel_regularizer=keras.regularizers.L2(kernel_l2) if kernel_l2 else None,
            activity_regularizer=keras.regularizers.L2(activity_l2) if activity_l2 else None)]
        layers.append(keras.layers.Dense(CLASSES, activation="softmax"))
        return keras.Sequential(layers)
    return build


class MeanActivityLoss(keras.layers.Layer):
    """A layer that adds a batch-dependent loss: ``rate * mean(inputs**2)``."""

    def __init__(self, rate=0.05, **kwargs):
        super().__init__(**kwargs)
        self.rate = rate

    def call(self, inputs):
        self.add_loss(self.rate * keras.ops.mean(keras.ops.square(inputs)))
        return inputs


def mlp_with_add_loss():
    return keras.Sequential([
        keras.Input((6,)), keras.layers.Dense(8, activation="relu"), MeanActivityLoss(),
        keras.layers.Dense(CLASSES, activation="softmax")])


class OwnTrainStep(models.GuideTrainStep):
    """keras.io's "Customizing what happens in fit()", first example (the
    step is `tests.support.models.GuideTrainStep`'s, which other suites train)."""


class OwnComputeLoss(keras.Model):
    """A ``compute_loss`` override adding its own batch mean."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training)
        return loss + 0.1 * tf.reduce_mean(tf.square(y_pred))


class OwnTestStep(models.GuideTestStep):
    """A ``test_step`` override that evaluates with its own loss call
    (`tests.support.models.GuideTestStep`, which other suites train)."""


class KerasIoGAN(keras.Model):
    """keras.io's GAN ("Customizing what happens in fit()"): no ``call()``,
    two built sub-models, two optimizers built by their first ``apply``,
    x-only data. Its latent noise is read from the data (columns 4..5), so
    that one device and N replicas see the same noise."""

    def __init__(self):
        super().__init__()
        self.discriminator = keras.Sequential([
            keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
        self.generator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4)])
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def compile(self, d_optimizer, g_optimizer, loss_fn):  # pylint: disable=arguments-differ
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

    def train_step(self, data):
        real, latent = data[:, :4], data[:, 4:]
        rows = keras.ops.shape(real)[0]
        combined = keras.ops.concatenate([self.generator(latent), real], axis=0)
        labels = keras.ops.concatenate([keras.ops.ones((rows, 1)), keras.ops.zeros((rows, 1))], 0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(combined))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(keras.ops.zeros((rows, 1)),
                                  self.discriminator(self.generator(latent)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


def _compile_gan(model):
    model.compile(keras.optimizers.SGD(0.05), keras.optimizers.SGD(0.05),
                  keras.losses.BinaryCrossentropy(from_logits=True))


def gan_inputs(examples: int, batch: int) -> tf.data.Dataset:
    """x only: 4 "real" features and 2 latent ones per row."""
    rng = np.random.RandomState(5)
    return tf.data.Dataset.from_tensor_slices(rng.randn(examples, 6).astype("float32")).batch(batch)


class OwnMetricsProperty(keras.Model):
    """A model listing its own trackers in ``metrics`` (keras.io's second
    train_step example): its loss tracker and a MAE tracker."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
        self.loss_fn = keras.losses.MeanSquaredError()

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_metric]

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.loss_fn(y, y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}


def regression(examples: int, batch: int) -> tf.data.Dataset:
    x, _ = _feature_arrays(examples)
    y = (x[:, :1] * 0.7 - x[:, 1:2] * 0.2).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def own_metrics_model():
    inputs = keras.Input((6,))
    return OwnMetricsProperty(inputs, keras.layers.Dense(1)(keras.layers.Dense(8, "relu")(inputs)))


def functional_as(cls):
    def build():
        inputs = keras.Input((6,))
        hidden = keras.layers.Dense(8, activation="relu")(inputs)
        return cls(inputs, keras.layers.Dense(CLASSES, activation="softmax")(hidden))
    return build


def _mixed(policy, build):
    def mixed():
        previous = keras.mixed_precision.global_policy()
        keras.mixed_precision.set_global_policy(policy)
        try:
            return build()
        finally:
            keras.mixed_precision.set_global_policy(previous)
    return mixed


def embedding_mixed():
    return keras.Sequential([
        keras.Input((SEQUENCE,), dtype="int32"), keras.layers.Embedding(VOCABULARY, 8),
        keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(8, activation="relu"),
        keras.layers.Dense(CLASSES, activation="softmax", dtype="float32")])


def _adamw(model):
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=3, decay_rate=0.9)
    model.compile(optimizer=keras.optimizers.AdamW(schedule, weight_decay=0.01,
                                                   global_clipnorm=0.5, use_ema=True),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])


def _metrics_zoo(model):
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="categorical_crossentropy",
        metrics=[keras.metrics.AUC(name="auc"), keras.metrics.Precision(name="precision"),
                 keras.metrics.Recall(name="recall"),
                 keras.metrics.F1Score(average="macro", name="f1"),
                 keras.metrics.TopKCategoricalAccuracy(2, name="top2"),
                 keras.metrics.OneHotMeanIoU(CLASSES, name="iou")])


def one_hot_features(examples: int, batch: int) -> tf.data.Dataset:
    x, y = _feature_arrays(examples)
    return tf.data.Dataset.from_tensor_slices((x, np.eye(CLASSES, dtype="float32")[y])).batch(batch)


CASES: Tuple[Case, ...] = (
    Case("embedding_pooling", _seeded(embedding_pooling), _sgd_with_accuracy, tokens,
         custom_loop=True),
    # Clipping the batch's sparse gradient as Keras does on one device (by
    # its values: a repeated id counts once per occurrence); active on the
    # 1-row last batch.
    Case("embedding_global_clipnorm", _seeded(embedding_pooling),
         lambda m: m.compile(optimizer=keras.optimizers.SGD(0.1, global_clipnorm=0.3),
                             loss="sparse_categorical_crossentropy"), tokens),
    Case("embedding_lstm_masked", _seeded(embedding_recurrent(keras.layers.LSTM)),
         _sgd_with_accuracy, padded_sequences),
    Case("embedding_gru_masked", _seeded(embedding_recurrent(keras.layers.GRU)),
         _sgd_with_accuracy, padded_sequences),
    Case("embedding_time_distributed", _seeded(embedding_time_distributed), _sgd_with_accuracy,
         tokens),
    Case("tied_embedding", _seeded(tied_embedding), _sgd_with_accuracy, pairs),
    Case("transformer_encoder", _seeded(transformer_encoder), _sgd_with_accuracy,
         padded_sequences, custom_loop=True),
    Case("cnn_batch_norm", _seeded(cnn(synchronized=False)), _sgd_with_accuracy, images,
         not_exact_over_replicas="BatchNormalization(synchronized=False) normalizes each "
                                 "replica's batch by its own statistics"),
    Case("cnn_sync_batch_norm", _seeded(cnn(synchronized=True)), _sgd_with_accuracy, images),
    Case("separable_cnn", _seeded(separable_cnn), _sgd_with_accuracy, images, custom_loop=True),
    Case("dict_multi_io", _seeded(dict_model), compile_dict, dict_features),
    Case("kernel_regularizer", _seeded(mlp(kernel_l2=0.01)), _sgd_with_accuracy, features),
    Case("activity_regularizer", _seeded(mlp(activity_l2=0.01)), _sgd_with_accuracy, features),
    Case("add_loss", _seeded(mlp_with_add_loss), _sgd_with_accuracy, features),
    Case("sample_weight", _seeded(mlp()), lambda m: _sgd(m, weighted_metrics=["accuracy"]),
         weighted_features),
    Case("own_train_step", _seeded(functional_as(OwnTrainStep)), _sgd_with_accuracy, features,
         trainer=False),
    Case("own_compute_loss", _seeded(functional_as(OwnComputeLoss)), _sgd_with_accuracy,
         features, trainer=False),
    Case("own_test_step", _seeded(functional_as(OwnTestStep)), _sgd_with_accuracy, features,
         trainer=False),
    Case("keras_io_gan", _seeded(KerasIoGAN), _compile_gan, gan_inputs, trainer=False,
         predicts=False),
    Case("own_metrics_property", _seeded(own_metrics_model),
         lambda m: m.compile(optimizer=keras.optimizers.SGD(0.05)), regression, trainer=False,
         evaluates=False),
    Case("mixed_float16_embedding", _seeded(_mixed("mixed_float16", embedding_mixed)),
         _sgd_with_accuracy, tokens, tolerance=2e-3),
    Case("mixed_bfloat16", _seeded(_mixed("mixed_bfloat16", mlp())), _sgd_with_accuracy,
         features, tolerance=2e-2),
    Case("mixed_float16_jit", _seeded(_mixed("mixed_float16", mlp())),
         lambda m: m.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=True,
                             loss="sparse_categorical_crossentropy", metrics=["accuracy"]),
         features, tolerance=2e-3),
    Case("jit_compile", _seeded(mlp(kernel_l2=0.01)),
         lambda m: m.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=True,
                             loss="sparse_categorical_crossentropy", metrics=["accuracy"]),
         features),
    Case("gradient_accumulation", _seeded(mlp()),
         lambda m: m.compile(optimizer=keras.optimizers.SGD(0.1, gradient_accumulation_steps=2),
                             loss="sparse_categorical_crossentropy"),
         features, reference_compile=lambda m: m.compile(
             optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy"),
         reference_batch_factor=2),
    Case("adamw_schedule_clipnorm_ema", _seeded(embedding_pooling), _adamw, tokens,
         tolerance="calibrated"),
    Case("metrics", _seeded(mlp()), _metrics_zoo, one_hot_features),
)

BY_NAME = {case.name: case for case in CASES}
