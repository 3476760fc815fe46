"""Tutorial: Save and load a model using a distribution strategy.

Its user code with tfdist's change, against the tutorial's own code on
one device (`tests/support/tutorials.py` says how these tests compare).
Published: tensorflow/docs site/en/tutorials/distribute/save_and_load.ipynb
"""

import os

import keras
import numpy as np
import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tests.support import tutorials


def save_and_load_tutorial(mirrored_strategy, make_another_mirrored, workdir, adopt):
    """The tutorial's Keras and SavedModel sections (hub.KerasLayer, Keras 2's
    SavedModel format for ``model.save`` and ``save_spec`` do not exist in
    Keras 3)."""
    os.makedirs(workdir, exist_ok=True)  # test

    def get_data():
        mnist_train, mnist_test = tutorials.mnist_datasets(152, 40, seed=6)  # test: was tfds.load

        BUFFER_SIZE = 152  # the tutorial: 10000

        BATCH_SIZE = 16 * tutorials.KERAS_TUTORIAL_REPLICAS  # test: the same on one device

        def scale(image, label):
            image = tf.cast(image, tf.float32)
            image /= 255

            return image, label

        train_dataset = mnist_train.map(scale).cache().shuffle(
            BUFFER_SIZE, seed=tutorials.SHUFFLE_SEED).batch(BATCH_SIZE)
        eval_dataset = mnist_test.map(scale).batch(BATCH_SIZE)

        return train_dataset, eval_dataset

    def get_model():
        with mirrored_strategy.scope():
            model = tf.keras.Sequential([
                tf.keras.layers.Conv2D(32, 3, activation='relu', input_shape=(28, 28, 1)),
                tf.keras.layers.MaxPooling2D(),
                tf.keras.layers.Flatten(),
                tf.keras.layers.Dense(64, activation='relu'),
                tf.keras.layers.Dense(10)
            ])

            model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          optimizer=tf.keras.optimizers.Adam(),
                          metrics=[tf.metrics.SparseCategoricalAccuracy()])
            return model

    keras.utils.set_random_seed(tutorials.SEED)  # test
    model = get_model()
    if adopt:
        tfdist.attach(model, mirrored_strategy)  # tfdist
    train_dataset, eval_dataset = get_data()
    model.fit(train_dataset, epochs=2)
    results = {"trained": model.get_weights()}

    keras_model_path = os.path.join(workdir, 'keras_save.keras')
    model.save(keras_model_path)

    restored_keras_model = tf.keras.models.load_model(keras_model_path)
    ref.assert_weight_lists_close(results["trained"], restored_keras_model.get_weights(), atol=0)
    restored_keras_model.fit(train_dataset, epochs=2)
    results["restored"] = restored_keras_model.get_weights()

    another_strategy = tf.distribute.OneDeviceStrategy('/cpu:0')
    with another_strategy.scope():
        restored_keras_model_ds = tf.keras.models.load_model(keras_model_path)
        restored_keras_model_ds.fit(train_dataset, epochs=2)
    results["restored_on_one_device_strategy"] = restored_keras_model_ds.get_weights()

    # The tf.saved_model APIs, on a fresh model.
    model = get_model()  # get a fresh model
    saved_model_path = os.path.join(workdir, 'tf_save')
    tf.saved_model.save(model, saved_model_path)

    DEFAULT_FUNCTION_KEY = 'serving_default'
    loaded = tf.saved_model.load(saved_model_path)
    inference_func = loaded.signatures[DEFAULT_FUNCTION_KEY]
    # TF: a signature takes keyword arguments, named after the model's input.
    (input_name,) = inference_func.structured_input_signature[1]

    predict_dataset = eval_dataset.map(lambda image, label: image)
    for batch in predict_dataset.take(1):
        one_device = inference_func(**{input_name: batch})

    another_strategy = make_another_mirrored()  # tfdist: was tf.distribute.MirroredStrategy()
    with another_strategy.scope():
        loaded = tf.saved_model.load(saved_model_path)
        inference_func = loaded.signatures[DEFAULT_FUNCTION_KEY]

        dist_predict_dataset = another_strategy.experimental_distribute_dataset(
            predict_dataset)

        # Calling the function in a distributed manner
        for batch in dist_predict_dataset:
            result = another_strategy.run(inference_func, kwargs={input_name: batch})
            break
    (output_name,) = one_device
    distributed = np.concatenate([np.asarray(r[output_name]) for r in
                                  another_strategy.experimental_local_results(result)])
    np.testing.assert_allclose(distributed, np.asarray(one_device[output_name]), atol=1e-5)
    np.testing.assert_allclose(distributed, np.asarray(model(next(iter(predict_dataset)))),
                               atol=1e-5)
    return results


def test_save_and_load_tutorial_equals_one_device(make_strategy, tmp_path):
    one_device = tf.distribute.get_strategy()
    expected = save_and_load_tutorial(one_device, lambda: one_device,
                                      str(tmp_path / "one_device"), adopt=False)
    actual = save_and_load_tutorial(make_strategy(tutorials.KERAS_TUTORIAL_REPLICAS),
                                    lambda: make_strategy(4), str(tmp_path / "tfdist"), adopt=True)
    # Trained on 3 replicas, saved, and trained on by plain Keras after
    # loading (without a strategy, and under OneDeviceStrategy): the weights
    # of the same steps on one device throughout.
    for key in ("trained", "restored", "restored_on_one_device_strategy"):
        ref.assert_weight_lists_close(expected[key], actual[key])
