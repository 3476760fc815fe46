"""Batch statistics over real rows only: BatchNormalization's moments skip
padding rows. User: `tfdist.replica.step` (and the TPU preflight).
Tested with Keras 3.15 and 3.16; `tests/_internal/test_keras_contract.py` pins what it reads.
"""

import contextlib

import tensorflow as tf

from tfdist._internal import collectives
from tfdist._internal.keras import privates
from tfdist._internal.thread_values import ThreadValue

_tf_nn = privates.tensorflow_ops("nn")  # Keras' TensorFlow backend's nn module

# Batch statistics over real rows only -------------------------------------
#
# A padded batch (tfdist.data: "pad", and "exact" so that no replica is
# empty) must not move BatchNormalization's statistics. Keras computes them
# in two backend functions, `_compute_moments` (per replica) and
# `_compute_moments_sync` (synchronized: sums all-reduced over replicas).
# While `statistics_over_real_rows(mask)` is active in a thread (each
# replica traces its step in its own thread), moments over the batch axis
# weight each row by the mask; outside it Keras' functions run unchanged.

_ROW_MASK = ThreadValue()  # within `statistics_over_real_rows`
_KERAS_MOMENTS = (_tf_nn._compute_moments, _tf_nn._compute_moments_sync)


def _row_weights(x, axes):
    mask = _ROW_MASK.get()
    if mask is None or 0 not in [a % x.shape.rank for a in axes]:
        return None
    shape = tf.concat([[-1], tf.ones([x.shape.rank - 1], tf.int32)], 0)
    return tf.reshape(tf.cast(mask, x.dtype), shape)


def _masked_sums(x, weights, axes):
    real = weights > 0
    total = tf.reduce_sum(tf.where(real, x, 0.0), axis=axes, keepdims=True)
    squares = tf.reduce_sum(tf.where(real, tf.square(x), 0.0), axis=axes, keepdims=True)
    count = tf.reduce_sum(weights * tf.ones_like(x), axis=axes, keepdims=True)
    return total, squares, count


def _finish(total, squares, count, axes, keepdims):
    mean = tf.math.divide_no_nan(total, count)
    variance = tf.maximum(tf.math.divide_no_nan(squares, count) - tf.square(mean), 0.0)
    if not keepdims:
        mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
    return mean, variance


def _moments(x, axes, keepdims):
    weights = _row_weights(x, axes)
    if weights is None:
        return _KERAS_MOMENTS[0](x, axes, keepdims)
    return _finish(*_masked_sums(x, weights, axes), axes, keepdims)


def _moments_sync(x, axes, keepdims):
    weights = _row_weights(x, axes)
    if weights is None or tf.distribute.get_replica_context() is None:
        return _KERAS_MOMENTS[1](x, axes, keepdims)
    # Three all-reduces, as Keras does (NCCL needs the same order everywhere).
    sums = [collectives.all_reduce_sum(value) for value in _masked_sums(x, weights, axes)]
    return _finish(*sums, axes, keepdims)


def _install_moments() -> None:
    """Puts the wrappers in place of Keras' two functions, once per process,
    on first use (never at import: ``import tfdist`` leaves Keras as it is)."""
    if _tf_nn._compute_moments is not _moments:
        _tf_nn._compute_moments = _moments
        _tf_nn._compute_moments_sync = _moments_sync


@contextlib.contextmanager
def statistics_over_real_rows(mask):
    """Within this block (in this thread), batch statistics skip rows where
    ``mask`` is 0. ``mask=None`` changes nothing."""
    if mask is not None:
        _install_moments()
    with _ROW_MASK.set_to(mask):
        yield
