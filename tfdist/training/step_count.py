"""A warning where one-device Keras counts its optimizer's steps otherwise.

Keras 3.15's ``fit`` with ``steps_per_execution=1`` (Keras 3.16 counts
what it trains: `tfdist._internal.keras.compiled.
counts_a_step_more_on_unknown_length`), on a dataset whose length tf.data
does not know (``from_generator``, ``filter``, ...) and without
``steps_per_epoch``, counts one optimizer iteration more per epoch than it
trains (two epochs
of three batches end at ``optimizer.iterations == 8``; 6 when the same
batches carry their length). tfdist counts the steps it trains, as Keras
does on data of known length. Where the optimizer's update reads the count
(Adam's bias correction, a learning-rate schedule), one device's result on
such data therefore differs from tfdist's from the second epoch on, and
the user is told so, with the one line that makes both agree
(docs/guides/semantics.md#data-of-unknown-length).
"""

import warnings
from typing import Optional

import keras

from tfdist._internal.keras import compiled as keras_compiled
from tfdist._internal.keras import optimizer as keras_optimizer


def warn_where_keras_counts_more(source, model: keras.Model, epochs: int,
                                 steps_per_epoch: Optional[int]) -> None:
    """Warns when one-device Keras ``fit`` on this data would count steps
    tfdist does not train and the model's optimizer reads the count: more
    than one epoch of a dataset of global batches whose length is unknown,
    without ``steps_per_epoch``, on a Keras that counts so.
    ``source``: a `tfdist.data.epochs.Source`."""
    optimizer = model.optimizer
    if steps_per_epoch is not None or epochs < 2 or source.per_replica:
        return
    if not keras_compiled.counts_a_step_more_on_unknown_length(model):
        return
    if source.known_steps(0) is not None or optimizer is None:
        return
    if not keras_optimizer.update_reads_step_count(optimizer):
        return
    warnings.warn(
        f"The training data's length is unknown to tf.data (e.g. from_generator or filter): "
        f"on such data one-device Keras {keras.__version__} counts one optimizer iteration "
        f"more per epoch than it trains, and {type(optimizer).__name__}'s update reads that "
        f"count (bias correction or a learning-rate schedule), so its result from the second "
        f"epoch on is not what the same batches give with their length known. tfdist counts "
        f"the steps it trains, as Keras does on data of known length. To make the two agree, "
        f"give the length: dataset.apply(tf.data.experimental.assert_cardinality(batches)).",
        stacklevel=3)
