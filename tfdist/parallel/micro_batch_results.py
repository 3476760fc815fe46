"""A pipelined step's results from its micro-batches'
(`tfdist.parallel.pipeline`): each weight's gradient summed over them on
its stage's device, the batch's loss parts from theirs, and the outputs of
every row in order (without the masked row an empty micro-batch ran on)."""

from typing import List

import tensorflow as tf

from tfdist._internal import graph_order, sparse_gradients
from tfdist._internal.keras import compiled as keras_compiled, placed_weights


def summed_gradients(per_micro_batch: List[list], variables, regularization: dict) -> list:
    """Each variable's gradient summed over the micro-batches on the
    variable's own device (its stage's): unplaced, the sums would run on
    the step's default device, and a stage's gradients would travel there
    and back (to the chief and back, with stages on other tasks). Then
    its regularization's gradient (``regularization``, by ``id``) is
    added, once.

    A dense gradient is a running sum, in micro-batch order (the order
    both schedules run the backward passes in): each micro-batch's
    gradient is added as soon as it exists and then freed. One sum of all
    m (``add_n``) would keep every micro-batch's gradient alive until the
    last backward pass: m copies of the stage's weights."""
    summed = []
    for grads, variable in zip(zip(*per_micro_batch), variables):
        present = [g for g in grads if g is not None]
        regularizing = regularization.get(id(variable))
        with tf.device(placed_weights.device_of(variable)), \
                tf.name_scope("micro_batch_gradient_sum"):
            if not present:
                total = None
            elif isinstance(present[0], tf.IndexedSlices):
                total = sparse_gradients.combine_micro_batches(present)
            else:
                total = tf.convert_to_tensor(present[0])
                for gradient in present[1:]:
                    total = total + tf.convert_to_tensor(gradient)
                    graph_order.keep_as_written(total)  # (not one AddN: graph_order)
            if regularizing is not None:  # (dense, as one device's tape adds the two)
                total = regularizing if total is None else (
                    tf.convert_to_tensor(total) + regularizing)
            summed.append(total)
    return summed


def summed_loss(parts: list, sizes: list, weight_regularization):
    """The batch's `LossParts` from its micro-batches': shares add up; the
    regularization is each micro-batch's (activity terms, ``add_loss``)
    weighted by its rows, plus the weights' (``weight_regularization``,
    computed once)."""
    rows = tf.add_n(sizes)
    regularization = tf.math.divide_no_nan(
        tf.add_n([p.regularization * size for p, size in zip(parts, sizes)]), rows)
    return parts[0]._replace(
        data_share=tf.add_n([p.data_share for p in parts]),
        output_shares=[tf.add_n(list(shares))
                       for shares in zip(*[p.output_shares for p in parts])],
        regularization=regularization + weight_regularization)


def real_rows(part, outputs):
    """``outputs`` of micro-batch ``part`` without the masked row an empty
    one ran on, their Keras masks alike."""
    masks = keras_compiled.keras_masks(outputs)
    return keras_compiled.with_keras_masks(
        part.real_outputs(outputs),
        tf.nest.map_structure(lambda m: None if m is None else m[:part.rows], masks))


def concatenated_outputs(outputs: list):
    masks = [keras_compiled.keras_masks(output) for output in outputs]
    joined = tf.nest.map_structure(lambda *parts: tf.concat(parts, 0), *outputs)

    def joined_mask(*parts):
        return None if any(m is None for m in parts) else tf.concat(parts, 0)

    return keras_compiled.with_keras_masks(
        joined, tf.nest.map_structure(joined_mask, *masks))
