"""What Keras ``fit`` / ``evaluate`` / ``predict`` accept, as tfdist data.

Keras takes NumPy arrays and tensors (also dicts and lists of them, for
multi-input and multi-output models) with ``batch_size``, ``shuffle``,
``sample_weight``, ``class_weight`` and ``validation_split``; tf.data
datasets; ``keras.utils.PyDataset``; and Python generators. This module turns
each into what the Trainer reads: datasets of GLOBAL batches, or an
`EpochDataset` when the order changes per epoch.

Shuffling is seeded per epoch (`tfdist.data.epochs.epoch_seed`) and done on the
host, so every worker and any replica count sees the same order, and a
resumed run sees the order an uninterrupted one would. (Keras' own
shuffle draws from its random state, which differs between processes.)
``validation_split`` and ``class_weight`` use Keras' own helpers, so they
mean exactly what they mean in Keras.
"""

from typing import Optional

import numpy as np
import tensorflow as tf

from tfdist._internal.keras import compiled as keras_compiled, data_adapters as keras_data
from tfdist.data.epochs import epoch_seed, EpochDataset
from tfdist.errors import ConfigurationError

DEFAULT_BATCH_SIZE = 32  # Keras' default
SHUFFLE_CHOICES = (True, False, "batch")


def is_arrays(x) -> bool:
    """NumPy arrays or tensors, possibly nested in dicts / lists / tuples."""
    leaves = keras_compiled.tree.flatten(x)
    return bool(leaves) and all(isinstance(leaf, (np.ndarray, tf.Tensor)) for leaf in leaves)


def as_tensors(structure):
    """``structure``'s arrays as tensors, its lists as tuples.

    tf.data reads a list as one tensor to stack (``fit([x1, x2], y)`` would
    stack two inputs of different widths), Keras reads it as a sequence of
    inputs or outputs: lists become tuples first, as Keras' own array
    adapter does, and models take either.
    """
    return tf.nest.map_structure(tf.convert_to_tensor,
                                 keras_compiled.tree.lists_to_tuples(structure))


def num_rows(structure) -> int:
    """Rows of arrays (x, y and weights must agree)."""
    counts = {int(leaf.shape[0]) for leaf in keras_compiled.tree.flatten(structure) if leaf is not None}
    if len(counts) != 1:
        raise ConfigurationError(
            f"x, y and sample_weight must have the same number of rows; got {sorted(counts)}.")
    return counts.pop()


def epoch_order(num_rows: int, batch_size: int, shuffle, seed: int, epoch: int) -> np.ndarray:
    """Row indices for ``epoch``: in order, shuffled, or (``"batch"``) full
    batches in shuffled order with the partial last batch kept last."""
    if shuffle is False:
        return np.arange(num_rows)
    rng = np.random.RandomState(epoch_seed(seed, epoch))
    if shuffle is True:
        return rng.permutation(num_rows)
    full = num_rows // batch_size
    batches = rng.permutation(full)
    order = (batches[:, None] * batch_size + np.arange(batch_size)[None, :]).reshape(-1)
    return np.concatenate([order, np.arange(full * batch_size, num_rows)])


def check_shuffle(shuffle) -> None:
    if not (shuffle is True or shuffle is False or shuffle == "batch"):
        raise ConfigurationError(
            f"`shuffle` ({shuffle!r}) must be True, False or 'batch'.")


def with_class_weight(y, sample_weight, class_weight: Optional[dict]):
    """Keras' per-example weights for ``class_weight`` (one output); like
    Keras, not together with ``sample_weight``."""
    if class_weight is None:
        return sample_weight
    if sample_weight is not None:
        raise ConfigurationError(
            "`class_weight` and `sample_weight` were both given; Keras accepts one. "
            "Fold the class weights into sample_weight.")
    if not isinstance(class_weight, dict):
        raise ConfigurationError(
            f"`class_weight` must be a dict {{class index: weight}}; got {type(class_weight).__name__}.")
    leaves = keras_compiled.tree.flatten(y)
    if len(leaves) != 1:
        raise ConfigurationError(
            f"`class_weight` applies to a model with one output; y has {len(leaves)} "
            "targets. Pass per-output `sample_weight` instead.")
    weights = np.asarray(keras_data.class_weight_to_sample_weights(leaves[0], class_weight),
                         "float32")
    return weights


def array_batches(x, y, sample_weight, *, batch_size: Optional[int], shuffle=False,
                  seed: int = 0, targets: bool = True):
    """Global batches of arrays: a dataset when unshuffled, else an
    `EpochDataset` whose order is seeded per epoch. Without ``targets``
    (a model with its own step, as Keras allows) ``y`` may be None: batches
    of ``(x,)``."""
    if y is None and (targets or sample_weight is not None):
        hint = (f" `x` is a tuple of {len(x)}: call fit(x, y), not fit((x, y)) (a tuple `x` "
                "holds a multi-input model's inputs)." if isinstance(x, tuple) else "")
        raise ConfigurationError(
            f"`y` is None: tfdist trains on (x, y) pairs. Pass targets as `y=`.{hint}")
    check_shuffle(shuffle)
    batch_size = batch_size or DEFAULT_BATCH_SIZE
    parts = (x,) if y is None else (x, y) if sample_weight is None else (x, y, sample_weight)
    total_rows = num_rows(parts)
    tensors = as_tensors(parts)

    def batches(order):
        indices = tf.data.Dataset.from_tensor_slices(order).batch(batch_size)
        return indices.map(lambda i: tf.nest.map_structure(lambda t: tf.gather(t, i), tensors))

    if shuffle is False:
        return batches(np.arange(total_rows))
    return EpochDataset(lambda epoch: batches(
        epoch_order(total_rows, batch_size, shuffle, seed, epoch)))


def to_training_data(x, y=None, sample_weight=None, *, batch_size=None, shuffle=False,
                     seed=0, class_weight=None, what="x", targets=True):
    """Any Keras input as global batches (see module docstring); arrays
    without ``y`` only when not ``targets`` (`array_batches`)."""
    if is_arrays(x):
        sample_weight = with_class_weight(y, sample_weight, class_weight)
        return array_batches(x, y, sample_weight, batch_size=batch_size, shuffle=shuffle,
                             seed=seed, targets=targets)
    if isinstance(x, (tf.data.Dataset, EpochDataset)):
        for name, value in (("y", y), ("sample_weight", sample_weight), ("batch_size", batch_size)):
            if value is not None:
                raise ConfigurationError(
                    f"`{name}` must be None when `{what}` is a dataset: the dataset yields "
                    "batches of (x, y[, sample_weight]).")
        return with_class_weight_map(x, class_weight)
    if isinstance(x, keras_data.PyDataset) and shuffle and _finite(x):
        return with_class_weight_map(shuffled_py_dataset(x, seed), class_weight)
    if isinstance(x, keras_data.PyDataset) or _is_generator(x):
        return keras_data.keras_data_as_dataset(x, y, sample_weight, batch_size, class_weight)
    if callable(x) and y is None and sample_weight is None:
        if class_weight is not None:
            raise ConfigurationError(
                "`class_weight` is not supported with a dataset_fn(input_context) (per-replica "
                "batches): map the weights into its batches as a third element "
                "(x, y, sample_weight), or pass a dataset of global batches.")
        return x  # a dataset_fn(input_context) of per-replica batches (`tfdist.data.epochs`)
    raise ConfigurationError(
        f"`{what}` is a {type(x).__name__}; tfdist takes NumPy arrays or tensors (or dicts / "
        "lists of them), a tf.data.Dataset, a keras.utils.PyDataset, a Python generator "
        "or a dataset_fn(input_context).")


def with_class_weight_map(data, class_weight: Optional[dict]):
    """A dataset (or `EpochDataset`) of (x, y) batches with Keras'
    per-example ``class_weight`` weights added as their sample_weight, as
    Keras' dataset adapter adds them."""
    if class_weight is None:
        return data
    if not isinstance(class_weight, dict):
        raise ConfigurationError(
            f"`class_weight` must be a dict {{class index: weight}}; got {type(class_weight).__name__}.")
    weigh = keras_data.class_weight_map_fn(class_weight)
    if isinstance(data, EpochDataset):
        return EpochDataset(lambda epoch: data.make_dataset(epoch).map(weigh))
    return data.map(weigh)


def fit_data(x, y=None, sample_weight=None, *, batch_size=None, shuffle=True, seed=0,
             class_weight=None, validation_split=0.0, validation_data=None,
             validation_batch_size=None, targets=True):
    """Keras ``fit``'s data arguments as (training data, validation data or
    None), each global batches (or a dataset_fn) for `tfdist.data.epochs`."""
    if validation_split and validation_data is None:
        (x, y, sample_weight), validation_data = split_for_validation(
            x, y, sample_weight, validation_split)
    data = to_training_data(x, y, sample_weight, batch_size=batch_size, shuffle=shuffle,
                            seed=seed, class_weight=class_weight, targets=targets)
    if validation_data is not None:
        validation_data = validation_batches(validation_data, validation_batch_size or batch_size)
    return data, validation_data


def _finite(py_dataset) -> bool:
    return py_dataset.num_batches is not None


def shuffled_py_dataset(py_dataset, seed: int) -> EpochDataset:
    """A `keras.utils.PyDataset` read with its batches in a seeded order per
    epoch (Keras' ``shuffle`` for a PyDataset shuffles batch order), then
    ``on_epoch_end`` as Keras calls it. Batches are read in this process."""
    py_dataset = keras_data.lists_as_tuples(py_dataset)
    spec = keras_data.keras_data_as_dataset(py_dataset).element_spec
    count = py_dataset.num_batches

    def batches(epoch):
        order = np.random.RandomState(epoch_seed(seed, epoch)).permutation(count)

        def read():
            for index in order:
                yield keras_compiled.tree.map_structure(np.asarray, tuple(py_dataset[int(index)]))
            py_dataset.on_epoch_end()

        return tf.data.Dataset.from_generator(read, output_signature=spec)

    return EpochDataset(batches)


def _is_generator(x) -> bool:
    import inspect  # pylint: disable=import-outside-toplevel

    return inspect.isgenerator(x)


def split_for_validation(x, y, sample_weight, validation_split: float):
    """Keras' ``validation_split``: ((x, y, w) to train, (x, y, w) to validate)."""
    if not isinstance(validation_split, (int, float)) or not 0 <= validation_split < 1:
        raise ConfigurationError(
            f"`validation_split` ({validation_split!r}) must be a float in [0, 1).")
    if not is_arrays(x):
        raise ConfigurationError(
            f"`validation_split` needs arrays; x is a {type(x).__name__}. Pass "
            "`validation_data=` instead.")
    return keras_data.train_validation_split((x, y, sample_weight), validation_split)


def validation_batches(validation_data, batch_size):
    """``validation_data``: a dataset, or a tuple (x, y[, sample_weight])."""
    if isinstance(validation_data, (tuple, list)):
        if len(validation_data) not in (2, 3):
            raise ConfigurationError(
                f"`validation_data` must be (x, y) or (x, y, sample_weight); got a "
                f"{type(validation_data).__name__} of {len(validation_data)}.")
        x, y, *weight = validation_data
        return to_training_data(x, y, weight[0] if weight else None,
                                batch_size=batch_size, what="validation_data")
    return to_training_data(validation_data, what="validation_data")


def prediction_batches(x, batch_size=None):
    """``predict``'s input as a dataset of global batches of x.

    Arrays become batches of ``(x,)``: as in Keras, a tuple or list ``x``
    holds a multi-input model's inputs, never ``(x, y)``.
    """
    if is_arrays(x):
        return tf.data.Dataset.from_tensor_slices((as_tensors(x),)).batch(
            batch_size or DEFAULT_BATCH_SIZE)
    if isinstance(x, tf.data.Dataset):
        return x
    if isinstance(x, keras_data.PyDataset) or _is_generator(x):
        return keras_data.keras_data_as_dataset(x, batch_size=batch_size)
    raise ConfigurationError(
        f"`x` is a {type(x).__name__}; predict takes arrays, a tf.data.Dataset, a "
        "keras.utils.PyDataset or a generator.")
