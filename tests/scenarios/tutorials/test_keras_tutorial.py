"""Tutorial: Distributed training with Keras.

Its user code with tfdist's change, against the tutorial's own code on
one device (`tests/support/tutorials.py` says how these tests compare).
Published: tensorflow/docs site/en/tutorials/distribute/keras.ipynb
"""

import os
import pathlib
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tests.support import tutorials


KERAS_TUTORIAL_BATCH = 16 * tutorials.KERAS_TUTORIAL_REPLICAS  # the tutorial: 64 per replica


def keras_tutorial(strategy, batch_size, workdir, adopt):
    """The tutorial's code; ``adopt``: with tfdist's one added line."""
    os.makedirs(workdir, exist_ok=True)  # test
    mnist_train, mnist_test = tutorials.mnist_datasets(152, 40, seed=4)  # test: was tfds.load('mnist')
    num_train_examples = 152

    BUFFER_SIZE = num_train_examples  # the tutorial: 10000 (of 60000)
    BATCH_SIZE = batch_size  # test: the same global batch on one device

    def scale(image, label):
        image = tf.cast(image, tf.float32)
        image /= 255

        return image, label

    keras.utils.set_random_seed(tutorials.SEED)  # test
    # test: a seeded shuffle
    train_dataset = mnist_train.map(scale).cache().shuffle(BUFFER_SIZE, seed=tutorials.SHUFFLE_SEED).batch(
        BATCH_SIZE)
    eval_dataset = mnist_test.map(scale).batch(BATCH_SIZE)

    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.layers.Conv2D(32, 3, activation='relu', input_shape=(28, 28, 1)),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation='relu'),
            tf.keras.layers.Dense(10)
        ])

        model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optimizer=tf.keras.optimizers.Adam(learning_rate=0.001),
                      metrics=['accuracy'])
    if adopt:
        tfdist.attach(model, strategy)  # tfdist: the one added line

    # Define the checkpoint directory to store the checkpoints.
    checkpoint_dir = os.path.join(workdir, 'training_checkpoints')
    # Define the name of the checkpoint files.
    checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt_{epoch:04d}.weights.h5")

    # Define a function for decaying the learning rate.
    # You can define any decay function you need.
    def decay(epoch):
        if epoch < 3:
            return 1e-3
        elif epoch >= 3 and epoch < 7:
            return 1e-4
        else:
            return 1e-5

    # Define a callback for printing the learning rate at the end of each epoch.
    class PrintLR(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            print('\nLearning rate for epoch {} is {}'.format(
                epoch + 1, model.optimizer.learning_rate.numpy()))

    # Put all the callbacks together.
    callbacks = [
        tf.keras.callbacks.TensorBoard(log_dir=os.path.join(workdir, 'logs')),
        tf.keras.callbacks.ModelCheckpoint(filepath=checkpoint_prefix,
                                           save_weights_only=True),
        tf.keras.callbacks.LearningRateScheduler(decay),
        PrintLR()
    ]

    EPOCHS = 4  # the tutorial: 12 (4 reaches the second learning rate)

    history = model.fit(train_dataset, epochs=EPOCHS, callbacks=callbacks)
    weights = model.get_weights()

    latest_checkpoint = sorted(pathlib.Path(checkpoint_dir).glob('*'))[-1]
    model.load_weights(latest_checkpoint)
    eval_loss, eval_acc = model.evaluate(eval_dataset)

    path = os.path.join(workdir, 'my_model.keras')
    model.save(path)

    unreplicated_model = tf.keras.models.load_model(path)
    unreplicated_model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.Adam(),
        metrics=['accuracy'])
    unreplicated = unreplicated_model.evaluate(eval_dataset)

    with strategy.scope():
        replicated_model = tf.keras.models.load_model(path)
        replicated_model.compile(
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            optimizer=tf.keras.optimizers.Adam(),
            metrics=['accuracy'])
        if adopt:
            tfdist.attach(replicated_model, strategy)  # tfdist
        replicated = replicated_model.evaluate(eval_dataset)

    return {"history": history.history, "weights": weights, "evaluate": [eval_loss, eval_acc],
            "unreplicated": unreplicated, "replicated": replicated,
            "checkpoints": sorted(p.name for p in pathlib.Path(checkpoint_dir).iterdir())}


def _learning_rate_lines(text):
    return re.findall(r"Learning rate for epoch \d+ is \S+", text)


def _epoch_scalars(log_dir):
    values = {}
    for path in sorted(pathlib.Path(log_dir, "train").glob("events.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "scalars":
                    values[(value.tag, event.step)] = float(tf.make_ndarray(value.tensor))
    return values


def test_keras_tutorial_equals_one_device(make_strategy, tmp_path, capsys):
    expected = keras_tutorial(tf.distribute.get_strategy(), KERAS_TUTORIAL_BATCH,
                              str(tmp_path / "one_device"), adopt=False)
    expected_lines = _learning_rate_lines(capsys.readouterr().out)
    actual = keras_tutorial(make_strategy(tutorials.KERAS_TUTORIAL_REPLICAS), KERAS_TUTORIAL_BATCH,
                            str(tmp_path / "tfdist"), adopt=True)
    lines = _learning_rate_lines(capsys.readouterr().out)

    ref.assert_weight_lists_close(expected["weights"], actual["weights"])
    ref.assert_logs_close(expected["history"], actual["history"])
    assert actual["history"]["learning_rate"] == pytest.approx([1e-3] * 3 + [1e-4])
    assert lines == expected_lines and len(lines) == 4
    assert actual["checkpoints"] == expected["checkpoints"] == [
        f"ckpt_{epoch:04d}.weights.h5" for epoch in range(1, 5)]
    for key in ("evaluate", "unreplicated", "replicated"):
        np.testing.assert_allclose(actual[key], expected[key], rtol=1e-5, err_msg=key)
    # The same weights evaluated by tfdist on 3 replicas and by Keras on one device.
    np.testing.assert_allclose(actual["replicated"], actual["unreplicated"], rtol=1e-5)

    # TensorBoard: the epoch summaries Keras writes on one device are there, equal.
    expected_scalars = _epoch_scalars(tmp_path / "one_device" / "logs")
    scalars = _epoch_scalars(tmp_path / "tfdist" / "logs")
    assert expected_scalars and set(expected_scalars) <= set(scalars)
    for key, value in expected_scalars.items():
        np.testing.assert_allclose(scalars[key], value, rtol=1e-5, err_msg=str(key))
