"""A model's weight regularizers, set apart from its loss and computed on
each weight's own device (`tfdist.parallel.pipeline`).

Keras computes a weight's regularization (``kernel_regularizer=...``)
whenever ``model.losses`` is read, under the device of whoever reads it:
in a pipeline's step, the last stage's, which computes the loss. A first
stage's kernel was then read by the last stage, its regularization's
gradient computed there, added there to the kernel's gradient from the
first stage, and the sum sent back: two weight-sized transfers per
micro-batch. A weight's regularization does not depend on the batch, so
its gradient is needed once per step, not once per micro-batch:
`set_apart` takes the regularizers out of ``model.losses`` while the
micro-batches are traced (``Variable.regularizer`` set to None, then
back), and `on_weight_devices` computes each term and its gradient under
its weight's device. Adding that gradient to the sum of the micro-batches'
gradients is the batch's gradient (the micro-batches' shares of a
regularization term sum to 1).
"""

import contextlib
from typing import Callable, Iterator, List, NamedTuple, Tuple

import tensorflow as tf

from tfdist._internal.keras import placed_weights


class WeightRegularization(NamedTuple):
    """The weight regularization terms' sum (a float32 scalar) and each
    regularized weight's gradient of it, by weight (``id``)."""

    value: tf.Tensor
    gradients: dict


@contextlib.contextmanager
def set_apart(model) -> Iterator[List[Tuple[object, Callable]]]:
    """Within the block, ``model.losses`` leaves out its weights'
    regularizers; yields ``[(weight, regularizer), ...]``."""
    pairs = [(weight, weight.regularizer) for weight in model.trainable_weights
             if getattr(weight, "regularizer", None) is not None]
    for weight, _ in pairs:
        weight.regularizer = None
    try:
        yield pairs
    finally:
        for weight, regularizer in pairs:
            weight.regularizer = regularizer


def on_weight_devices(pairs, scale_loss: Callable, share=None,
                      sources=None) -> WeightRegularization:
    """Each pair's term, and its gradient (of ``scale_loss(term)``, as the
    optimizer's loss scaling wants), computed under its weight's device;
    with ``share`` (a replica's share of the global batch) the gradients
    are that share of it, so the replicas' sum is one (the value stays
    whole: the metrics weigh it by the replica's rows). ``sources`` (by
    weight ``id``): the tensor a weight reads as in this step, of which its
    gradient is taken (a fully sharded weight gathered for the step)."""
    values, gradients = [], {}
    for weight, regularizer in pairs:
        source = weight if sources is None else sources[id(weight)]
        with tf.device(placed_weights.device_of(weight)):
            with tf.GradientTape() as tape:
                if sources is not None:
                    tape.watch(source)
                value = tf.cast(regularizer(weight), tf.float32)
                scaled = scale_loss(value)
            gradient = tape.gradient(scaled, source)
            gradients[id(weight)] = gradient if share is None else gradient * share
        values.append(value)
    return WeightRegularization(tf.add_n(values) if values else tf.constant(0.0), gradients)
