"""Keras' data adapters, as Keras' own ``fit`` reads its inputs: the
``validation_split`` split, ``class_weight`` weights, a PyDataset or a
generator as a dataset. Users: `tfdist.data.keras_inputs`, `tfdist.data.batch`.
Tested with Keras 3.15 and 3.16; `tests/_internal/test_keras_contract.py` pins what it reads.
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
    tf.data.Dataset of batches. Lists in its batches (a multi-input model's
    inputs) become tuples (`lists_as_tuples`)."""
    from keras.src.trainers import data_adapters  # pylint: disable=import-outside-toplevel

    return data_adapters.get_data_adapter(
        lists_as_tuples(x), y, sample_weight, batch_size=batch_size, shuffle=False,
        class_weight=class_weight).get_tf_dataset()


def lists_as_tuples(source):
    """A generator or PyDataset whose batches hold lists, as one whose
    batches hold tuples in their place: tf.data takes a list for one tensor
    to stack, where Keras means a sequence of inputs (its array adapter
    makes the same change); anything else is returned as it is."""
    if isinstance(source, PyDataset):
        if source.num_batches == 0 or not _holds_lists(source[0]):
            return source
        return _TuplesPyDataset(source)
    if hasattr(source, "__next__"):
        return (keras.tree.lists_to_tuples(batch) for batch in source)
    return source


def _holds_lists(structure) -> bool:
    """Whether a batch has a list anywhere in its structure."""
    if isinstance(structure, list):
        return True
    if isinstance(structure, dict):
        structure = tuple(structure.values())
    return isinstance(structure, tuple) and any(_holds_lists(part) for part in structure)


class _TuplesPyDataset(PyDataset):
    """A PyDataset's batches with tuples for lists (`lists_as_tuples`),
    read with the same workers, processes and queue."""

    def __init__(self, inner):
        super().__init__(workers=inner.workers, use_multiprocessing=inner.use_multiprocessing,
                         max_queue_size=inner.max_queue_size)
        self._inner = inner

    def __len__(self):
        return len(self._inner)

    @property
    def num_batches(self):
        return self._inner.num_batches

    def __getitem__(self, index):
        return keras.tree.lists_to_tuples(self._inner[index])

    def on_epoch_begin(self):
        self._inner.on_epoch_begin()

    def on_epoch_end(self):
        self._inner.on_epoch_end()
