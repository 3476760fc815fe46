"""Keras' data adapters, as Keras' own ``fit`` reads its inputs: the
``validation_split`` split, ``class_weight`` weights, a PyDataset or a
generator as a dataset. Users: `tfdist.data.keras_inputs`, `tfdist.data.batch`.
Tested with Keras 3.15; `tests/_internal/test_keras_contract.py` pins what it reads.
"""

import keras

PyDataset = keras.utils.PyDataset


def train_validation_split(arrays, validation_split: float):
    """Keras' own split for ``validation_split``: the last fraction, unshuffled."""
    from keras.src.trainers.data_adapters import array_slicing  # pylint: disable=import-outside-toplevel

    return array_slicing.train_validation_split(arrays, validation_split=validation_split)


def class_weight_to_sample_weights(y, class_weight: dict):
    """Keras' per-example weights for ``class_weight`` (argmax of one-hot ``y``)."""
    from keras.src.trainers.data_adapters import data_adapter_utils  # pylint: disable=import-outside-toplevel

    return data_adapter_utils.class_weight_to_sample_weights(y, class_weight)


def class_weight_map_fn(class_weight: dict):
    """Keras' own ``dataset.map`` function for ``class_weight`` (its tf.data
    adapter's): adds each batch's per-example weights as sample_weight, and
    raises Keras' errors (weights already given, several outputs)."""
    from keras.src.trainers.data_adapters import tf_dataset_adapter  # pylint: disable=import-outside-toplevel

    return tf_dataset_adapter.make_class_weight_map_fn(class_weight)


def keras_data_as_dataset(x, y=None, sample_weight=None, batch_size=None, class_weight=None):
    """A `keras.utils.PyDataset` or Python generator as Keras itself reads it
    (its data adapter, ``class_weight`` included), unshuffled, as a
    tf.data.Dataset of batches."""
    from keras.src.trainers import data_adapters  # pylint: disable=import-outside-toplevel

    return data_adapters.get_data_adapter(
        x, y, sample_weight, batch_size=batch_size, shuffle=False,
        class_weight=class_weight).get_tf_dataset()
