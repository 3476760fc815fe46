"""Tutorial: keras.io: Multi-GPU distributed training with TensorFlow.

Its user code with tfdist's change, against the tutorial's own code on
one device (`tests/support/tutorials.py` says how these tests compare).
Published: keras-team/keras-io guides/distributed_training_with_tensorflow.py
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tests.support import tutorials
from tests.programs import tutorial_mnist_setup as mnist_setup


def keras_io_guide(make_mirrored, workdir, adopt, fault_tolerance=True):
    """The guide's code; ``make_mirrored()`` stands for
    ``tf.distribute.MirroredStrategy()``."""

    def get_compiled_model():
        # Make a simple 2-layer densely-connected neural network.
        inputs = keras.Input(shape=(784,))
        x = keras.layers.Dense(256, activation="relu")(inputs)
        x = keras.layers.Dense(256, activation="relu")(x)
        outputs = keras.layers.Dense(10)(x)
        model = keras.Model(inputs, outputs)
        model.compile(
            optimizer=keras.optimizers.Adam(),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[keras.metrics.SparseCategoricalAccuracy()],
        )
        return model

    def get_dataset():
        batch_size = 32
        num_val_samples = 40  # the guide: 10000

        # Return the MNIST dataset in the form of a `tf.data.Dataset`.
        (x_train, y_train), (x_test, y_test) = mnist_setup.load_data(240, 40, seed=5)  # test

        # Preprocess the data (these are Numpy arrays)
        x_train = x_train.reshape(-1, 784).astype("float32") / 255
        x_test = x_test.reshape(-1, 784).astype("float32") / 255
        y_train = y_train.astype("float32")
        y_test = y_test.astype("float32")

        # Reserve num_val_samples samples for validation
        x_val = x_train[-num_val_samples:]
        y_val = y_train[-num_val_samples:]
        x_train = x_train[:-num_val_samples]
        y_train = y_train[:-num_val_samples]
        return (
            tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(batch_size),
            tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(batch_size),
            tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(batch_size),
        )

    # Create a MirroredStrategy.
    strategy = make_mirrored()  # tfdist: tfdist.make_strategy("mirrored", ...)
    print("Number of devices: {}".format(strategy.num_replicas_in_sync))

    # Open a strategy scope.
    with strategy.scope():
        keras.utils.set_random_seed(tutorials.SEED)  # test
        # Everything that creates variables should be under the strategy scope.
        # In general this is only model construction & `compile()`.
        model = get_compiled_model()
        if adopt:
            tfdist.attach(model, strategy)  # tfdist: the one added line

        # Train the model on all available devices.
        train_dataset, val_dataset, test_dataset = get_dataset()
        history = model.fit(train_dataset, epochs=2, validation_data=val_dataset)

        # Test the model on all available devices.
        evaluation = model.evaluate(test_dataset)
    results = {"history": history.history, "weights": model.get_weights(),
               "evaluate": evaluation}
    if not fault_tolerance:
        return results

    # Prepare a directory to store all the checkpoints.
    checkpoint_dir = os.path.join(workdir, "ckpt")
    if not os.path.exists(checkpoint_dir):
        os.makedirs(checkpoint_dir)

    def make_or_restore_model():
        # Either restore the latest model, or create a fresh one
        # if there is no checkpoint available.
        checkpoints = [checkpoint_dir + "/" + name for name in os.listdir(checkpoint_dir)]
        if checkpoints:
            latest_checkpoint = max(checkpoints, key=os.path.getctime)
            print("Restoring from", latest_checkpoint)
            return keras.models.load_model(latest_checkpoint)
        print("Creating a new model")
        return get_compiled_model()

    def run_training(epochs=1):
        # Create a MirroredStrategy.
        strategy = make_mirrored()  # tfdist: tfdist.make_strategy("mirrored", ...)

        # Open a strategy scope and create/restore the model
        with strategy.scope():
            model = make_or_restore_model()
            if adopt:
                tfdist.attach(model, strategy)  # tfdist

            callbacks = [
                # This callback saves a SavedModel every epoch
                # We include the current epoch in the folder name.
                keras.callbacks.ModelCheckpoint(
                    filepath=checkpoint_dir + "/ckpt-{epoch}.keras",
                    save_freq="epoch",
                )
            ]
            model.fit(
                train_dataset,
                epochs=epochs,
                callbacks=callbacks,
                validation_data=val_dataset,
                verbose=2,
            )
        return model  # test

    keras.utils.set_random_seed(tutorials.SEED)  # test
    # Running the first time creates the model
    run_training(epochs=1)

    # Calling the same function again will resume from where we left off
    results["resumed"] = run_training(epochs=1).get_weights()
    return results


def test_keras_io_guide_equals_one_device_where_plain_keras_fails(make_strategy, tmp_path):
    # Global batches of 32 on 3 replicas: every batch splits unevenly (11, 11, 10).
    expected = keras_io_guide(tf.distribute.get_strategy, str(tmp_path / "one_device"),
                              adopt=False)
    actual = keras_io_guide(lambda: make_strategy(3), str(tmp_path / "tfdist"), adopt=True)
    ref.assert_weight_lists_close(expected["weights"], actual["weights"])
    ref.assert_logs_close(expected["history"], actual["history"])
    np.testing.assert_allclose(actual["evaluate"], expected["evaluate"], rtol=1e-5)
    # Stopped and restarted from the latest .keras file: the same weights.
    ref.assert_weight_lists_close(expected["resumed"], actual["resumed"])

    # The guide's code as published, on the same 3 replicas: plain Keras 3.15
    # cannot split a batch of 32 over 3 replicas (AddN: [11,784] != [10,784]).
    with pytest.raises(tf.errors.InvalidArgumentError, match="AddN"):
        keras_io_guide(lambda: make_strategy(3), str(tmp_path / "keras"), adopt=False,
                       fault_tolerance=False)
