"""Applying a replica's gradients, exactly, also when the optimizer clips.

Keras 3 clips gradients (``clipnorm``, ``global_clipnorm``, ``clipvalue``)
in ``optimizer.apply`` *before* it sums them across replicas. Under a
strategy each replica holds only its share of the batch's gradient, so
Keras clips the shares: measured on the test MLP over 3 epochs on 4
replicas, weights differed from one device by 0.21 (``global_clipnorm``),
0.23 (``clipnorm``) and 0.11 (``clipvalue``).

`apply_gradients` sums the shares first (one all-reduce), clips the batch's
gradient as Keras would on one device, and hands each replica 1/N of the
clipped gradient. Keras' own clip then sees norms and values N times
smaller than the limits it already satisfies (a no-op), and its sum
restores the clipped gradient. Without clipping, or on one replica, this is
plain ``optimizer.apply_gradients`` (no extra collective).
"""

import tensorflow as tf

from tfdist._internal import keras_internals as _keras
from tfdist.replica import collectives


def optimizer_clips(optimizer) -> bool:
    """Whether the optimizer clips gradients (any of Keras' three options)."""
    return any(getattr(optimizer, name, None) for name in
               ("clipnorm", "global_clipnorm", "clipvalue"))


def apply_gradients(optimizer, gradients, variables) -> None:
    """``optimizer.apply_gradients`` for one replica's gradient shares, with
    clipping applied to the sum over replicas (call in replica context).

    Two replicas hold 1.5 each of a gradient of 3.0; ``global_clipnorm=1.0``
    clips the sum to 1.0, as one device would (Keras alone clips each share
    to 1.0 and applies 2.0):

    >>> import keras, tensorflow as tf, tfdist
    >>> strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    >>> with strategy.scope():
    ...     layer = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
    ...     layer.build((None, 1))
    ...     optimizer = keras.optimizers.SGD(learning_rate=1.0, global_clipnorm=1.0)
    ...     optimizer.build(layer.trainable_variables)
    >>> def replica_step():
    ...     shares = [tf.constant([[1.5]])]
    ...     tfdist.replica.gradients.apply_gradients(optimizer, shares, layer.trainable_variables)
    >>> tf.function(lambda: strategy.run(replica_step))()
    >>> layer.kernel.numpy().tolist()
    [[-1.0]]
    """
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    gradients = list(gradients)
    if replicas > 1 and optimizer_clips(optimizer):
        dense = [None if g is None else tf.convert_to_tensor(g) for g in gradients]
        present = [g for g in dense if g is not None]
        summed = iter(collectives.all_reduce_sum(present))
        totals = [None if g is None else next(summed) for g in dense]
        clipped = _keras.clip_gradients(optimizer, totals)
        gradients = [None if g is None else g / replicas for g in clipped]
    optimizer.apply_gradients(zip(gradients, variables))
