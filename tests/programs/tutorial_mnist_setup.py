"""``mnist_setup.py`` of TensorFlow's "Multi-worker training with Keras"
tutorial (tensorflow/docs, site/en/tutorials/distribute/multi_worker_with_keras.ipynb),
on generated data of MNIST's shapes, for tests/scenarios/tutorials/.

`load_data` stands in for ``tf.keras.datasets.mnist.load_data()`` (no
downloads) in every tutorial port: uint8 images 28x28 and uint8 labels
0-9, a few hundred examples. The tutorial shuffles without a seed; here the
shuffle is seeded (`SHUFFLE_SEED`, with ``keras.utils.set_random_seed``
fixing the global seed), so one device and every worker draw the same order.
"""

import numpy as np
import tensorflow as tf

SEED = 1  # keras.utils.set_random_seed(SEED) before data and model, everywhere
SHUFFLE_SEED = 7
NUM_TRAIN = 256


def load_data(num_train: int = NUM_TRAIN, num_test: int = 64, seed: int = 0):
    """``((x_train, y_train), (x_test, y_test))`` with MNIST's shapes and dtypes."""
    rng = np.random.RandomState(seed)

    def split(count):
        images = rng.randint(0, 256, size=(count, 28, 28)).astype(np.uint8)
        labels = rng.randint(0, 10, size=count).astype(np.uint8)
        return images, labels

    return split(num_train), split(num_test)


# -- the tutorial's mnist_setup.py ---------------------------------------------


def mnist_dataset(batch_size):
    (x_train, y_train), _ = load_data()  # test: was tf.keras.datasets.mnist.load_data()
    # The `x` arrays are in uint8 and have values in the [0, 255] range.
    # You need to convert them to float32 with values in the [0, 1] range.
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices(
        (x_train, y_train)).shuffle(NUM_TRAIN, seed=SHUFFLE_SEED).repeat().batch(batch_size)
    return train_dataset  # (test: shuffle(60000) -> seeded, over NUM_TRAIN)


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3, activation='relu'),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dense(10)
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
        metrics=['accuracy'])
    return model
