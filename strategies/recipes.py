"""Building blocks shared by the example programs in ``strategies/`` (and
the benchmarks in ``scripts/``): example scaffolding, not library API.

An image-classification input pipeline over any supervised TFDS dataset
(``synthetic_patterns`` by default, ``mnist`` and friends where prepared)
and two small models, so the programs stay short enough to copy.
"""

from typing import Optional

import keras
import numpy as np
import tensorflow as tf

from tfdist import data as data_lib
from tfdist.data.datasets import load_supervised


def _to_float(image, label):
    return tf.cast(image, tf.float32) / 255.0, label


def _split_info(train: tf.data.Dataset) -> dict:
    """``input_shape``, ``num_classes`` (largest label + 1) and
    ``train_examples`` of a training split of ``(image, label)`` pairs."""
    image_spec, label_spec = train.element_spec
    labels = train.map(lambda _, label: label)
    return {
        "input_shape": tuple(image_spec.shape),
        "num_classes": int(labels.reduce(tf.constant(0, label_spec.dtype), tf.maximum)) + 1,
        "train_examples": int(train.cardinality()),
    }


def image_classification_data(
    name: str,
    *,
    global_batch_size: int,
    data_dir=None,
    seed: int = 0,
    shuffle_buffer: int = 10_000,
    train_examples: Optional[int] = None,
):
    """Returns ``(train, test, info)``.

    ``train`` is an `EpochDataset` of global batches, reshuffled
    deterministically each epoch (so a resumed job sees the same order);
    ``test`` a dataset of global batches; ``info`` has ``input_shape``,
    ``num_classes`` and ``train_examples``. ``train_examples`` keeps only
    the first that many training examples.
    """
    train = load_supervised(name, "train", data_dir=data_dir)
    if train_examples is not None:
        train = train.take(train_examples)
    train = train.map(_to_float).cache()
    test = load_supervised(name, "test", data_dir=data_dir).map(_to_float).cache()
    info = _split_info(train)
    epoch_train = data_lib.EpochDataset(
        lambda epoch: train.shuffle(
            shuffle_buffer, seed=data_lib.epoch_seed(seed, epoch),
            reshuffle_each_iteration=False,
        ).batch(global_batch_size)
    )
    return epoch_train, test.batch(global_batch_size), info


def build_model(kind: str, input_shape, num_classes: int) -> keras.Model:
    """A small ``"mlp"`` or ``"convnet"`` classifier with softmax outputs.

    Call inside ``strategy.scope()``.
    """
    inputs = keras.Input(input_shape)
    if kind == "mlp":
        hidden = keras.layers.Flatten()(inputs)
        hidden = keras.layers.Dense(128, activation="relu")(hidden)
        hidden = keras.layers.Dense(64, activation="relu")(hidden)
    elif kind == "convnet":
        hidden = keras.layers.Conv2D(16, 3, activation="relu", padding="same")(inputs)
        hidden = keras.layers.MaxPooling2D()(hidden)
        hidden = keras.layers.Conv2D(32, 3, activation="relu", padding="same")(hidden)
        hidden = keras.layers.GlobalAveragePooling2D()(hidden)
    else:
        raise ValueError(f"`kind` ({kind!r}) must be 'mlp' or 'convnet'.")
    outputs = keras.layers.Dense(num_classes, activation="softmax")(hidden)
    return keras.Model(inputs, outputs, name=kind)


PIXEL_BUCKETS = 16


def pixel_tokens(image, label, buckets: int = PIXEL_BUCKETS):
    """An image (values in [0, 1]) as tokens ``position * buckets + bucket``.

    Turns the image datasets into input for an embedding model, so the
    parameter-server program has a table large enough to shard: a 16x16
    image with 16 buckets needs 4096 rows.
    """
    flat = tf.reshape(tf.cast(image * (buckets - 1e-3), tf.int32), [-1])
    positions = tf.range(tf.shape(flat)[0])
    return positions * buckets + flat, label


def token_classification_data(name: str, *, global_batch_size: int, data_dir=None,
                              seed: int = 0, shuffle_buffer: int = 10_000):
    """Returns ``(train, test, info)`` for `build_embedding_model`.

    ``train`` is reshuffled every pass (parameter-server workers repeat it);
    ``info`` adds ``sequence_length`` and ``vocabulary`` to
    `image_classification_data`'s.
    """
    train = load_supervised(name, "train", data_dir=data_dir).map(_to_float)
    test = load_supervised(name, "test", data_dir=data_dir).map(_to_float)
    info = _split_info(train)
    length = int(np.prod(info["input_shape"]))
    info.update(sequence_length=length, vocabulary=length * PIXEL_BUCKETS)
    train = train.map(pixel_tokens).cache().shuffle(shuffle_buffer, seed=seed)
    test = test.map(pixel_tokens).cache()
    return train.batch(global_batch_size), test.batch(global_batch_size), info


def build_embedding_model(vocabulary: int, sequence_length: int, num_classes: int,
                          dimension: int = 16) -> keras.Model:
    """Embedding table -> mean over tokens -> softmax. Call inside the scope.

    The table (``vocabulary x dimension`` floats) is the variable a
    parameter-server partitioner shards.
    """
    inputs = keras.Input((sequence_length,), dtype="int32")
    embedded = keras.layers.Embedding(vocabulary, dimension, name="embedding")(inputs)
    pooled = keras.layers.GlobalAveragePooling1D()(embedded)
    outputs = keras.layers.Dense(num_classes, activation="softmax")(pooled)
    return keras.Model(inputs, outputs, name="embedding_classifier")
