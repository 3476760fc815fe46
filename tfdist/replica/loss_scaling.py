"""Mixed precision's loss-scale check, decided over all replicas.

Under ``mixed_float16`` Keras wraps the optimizer in a
``keras.optimizers.LossScaleOptimizer``: it multiplies the loss by a
dynamic scale and, before each update, checks that the gradients are
finite; if not, it skips the update and halves the scale. On one device the
check sees the whole batch's gradient. Under a strategy Keras 3.15 checks
each replica's LOCAL gradient share, before the all-reduce:

* MirroredStrategy takes the first replica's answer for all: when only
  another replica's share overflowed, the update applies infinite
  gradients (measured: weights ``inf`` on 2 and 4 replicas, where one
  device skipped the step);
* MultiWorkerMirroredStrategy decides per replica, so replicas can take
  different branches of the check, one all-reducing gradients and the
  other not: the collectives no longer match.

While tfdist runs a replica's step (`agreement`), a loss-scale optimizer's
``apply`` first all-reduces one number, how many replicas hold a non-finite
gradient; if any does, every replica's gradients become NaN, so every
replica's check fails and all skip the update and halve the scale together,
as one device does. Finite gradients pass unchanged (``g + 0``). The cost is
one scalar all-reduce per step, only for loss-scale optimizers.

The wrapper is installed on ``LossScaleOptimizer`` on first use and defers
to Keras outside `agreement` (plain Keras runs unchanged).
"""

import contextlib

import tensorflow as tf

from tfdist._internal import collectives
from tfdist._internal.keras import patches
from tfdist._internal.once import once
from tfdist._internal.thread_values import ThreadValue

_AGREEING = ThreadValue(default=False)  # within `agreement`


@contextlib.contextmanager
def agreement():
    """While tracing a tfdist replica step: loss-scale checks agree."""
    _install()
    with _AGREEING.set_to(True):
        yield


def agree_on_finite(gradients):
    """``gradients`` (one replica's; None, tensors or IndexedSlices) as
    they are when every replica's are finite, else all NaN on every replica.

    Call in replica context. One scalar all-reduce.
    """
    present = [_values(g) for g in gradients if g is not None]
    if not present:
        return list(gradients)
    finite = tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(v)) for v in present]))
    non_finite_replicas = collectives.all_reduce_sum(1.0 - tf.cast(finite, tf.float32))
    poison = tf.where(non_finite_replicas > 0, float("nan"), 0.0)
    return [None if g is None else _plus(g, poison) for g in gradients]


def _values(gradient):
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def _plus(gradient, poison):
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values + tf.cast(poison, gradient.values.dtype),
                                gradient.indices, gradient.dense_shape)
    return gradient + tf.cast(poison, gradient.dtype)


def _needs_agreement() -> bool:
    if not _AGREEING.get() or tf.distribute.in_cross_replica_context():
        return False
    strategy = tf.distribute.get_strategy()
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return False  # asynchronous: each worker's step stands alone
    return strategy.num_replicas_in_sync > 1


@once
def _install() -> None:
    def agreeing(keras_apply):
        def apply(self, grads, trainable_variables=None):
            if _needs_agreement():
                grads = agree_on_finite(list(grads))
            return keras_apply(self, grads, trainable_variables)
        return apply

    patches.wrap_loss_scale_apply(agreeing)
