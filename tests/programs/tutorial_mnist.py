"""``mnist.py`` of TensorFlow's "Multi-worker training with a custom training
loop" tutorial (tensorflow/docs,
site/en/tutorials/distribute/multi_worker_with_ctl.ipynb), on generated data
(`tutorial_mnist_setup.load_data`), for tests/scenarios/tutorials/.

`NUM_TRAIN` = 143 examples: sharded over 2 workers they are 72 and 71, so in
per-replica batches of 16 each worker's pass is 5 steps whose last batch has
8 and 7 rows: one uneven global batch of 15 per pass.
"""

import numpy as np
import tensorflow as tf

from tests.programs.tutorial_mnist_setup import SEED, SHUFFLE_SEED, load_data

__all__ = ["SEED", "build_cnn_model", "dataset_fn", "mnist_dataset", "one_device_batches"]

NUM_TRAIN = 143


# -- the tutorial's mnist.py -----------------------------------------------------


def mnist_dataset(batch_size):
    del batch_size  # (unused in the tutorial too)
    (x_train, y_train), _ = load_data(NUM_TRAIN)  # test: was tf.keras.datasets.mnist.load_data()
    # The `x` arrays are in uint8 and have values in the range [0, 255].
    # You need to convert them to float32 with values in the range [0, 1]
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    # test: shuffle(60000) unseeded -> seeded, so the workers' shards (every
    # worker shuffles, then keeps its shard) never overlap.
    train_dataset = tf.data.Dataset.from_tensor_slices(
        (x_train, y_train)).shuffle(NUM_TRAIN, seed=SHUFFLE_SEED)
    return train_dataset


def dataset_fn(global_batch_size, input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = mnist_dataset(batch_size)
    dataset = dataset.shard(input_context.num_input_pipelines,
                            input_context.input_pipeline_id)
    dataset = dataset.batch(batch_size)
    return dataset


def build_cnn_model():
    regularizer = tf.keras.regularizers.L2(1e-5)
    return tf.keras.Sequential([
        tf.keras.Input(shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3,
                               activation='relu',
                               kernel_regularizer=regularizer),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128,
                              activation='relu',
                              kernel_regularizer=regularizer),
        tf.keras.layers.Dense(10, kernel_regularizer=regularizer)
    ])


# -- for the one-device reference ---------------------------------------------------


def one_device_batches(global_batch_size, num_workers=2):
    """The global batches the workers' ``dataset_fn`` shards make together:
    step t is worker 0's batch t, then worker 1's, ... (each pipeline built
    anew, as each worker builds its own). Iterate once per epoch, as the
    tutorial makes one iterator per epoch."""
    shards = [dataset_fn(global_batch_size, tf.distribute.InputContext(
        num_input_pipelines=num_workers, input_pipeline_id=index,
        num_replicas_in_sync=num_workers)) for index in range(num_workers)]

    def concat(*parts):
        return (tf.concat([x for x, _ in parts], 0), tf.concat([y for _, y in parts], 0))

    return tf.data.Dataset.zip(tuple(shards)).map(concat)
