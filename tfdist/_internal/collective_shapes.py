"""Collectives whose shape changes between calls, under instance keys fixed
at trace time.

Why: tfdist traces its loops with TensorFlow's instance keys fixed at trace
time (`tfdist._internal.collectives.function`), so a worker's memory stays flat
over millions of host calls. But each worker's collective param resolver
keeps, per instance key, the shape the key was first used with, and a later
use of the key with another shape fails::

    Shape mismatch in the collective instance 102. Op at device ... expected
    shape [100,8] but another member in the group expected shape [640,8]

Fixed-shape collectives (a dense gradient, a count, a metric's totals) never
change shape. Variable-shaped ones do: the all-gathers that reduce sparse
gradients (an ``Embedding``'s ``IndexedSlices``: one row per looked-up id, so
their count follows the batch size and the padded sequence length), a
replica context's ``all_gather`` of per-example values, an all-reduce of a
tensor with a dynamic dimension.

What: while keys are fixed (and only then), a collective whose input shape
is not fully known at trace time is run on a flat copy padded to the next
power of two of its element count, with the instance key of that size: each
such op reserves 32 keys when traced (one per size 1, 2, 4, ... 2**31), so
its keys are as fixed as any other's, each key always carries one shape, and
a worker keeps at most 32 records per op, however many calls and shapes
follow. Every member of a collective has the same input shape at a given
step (TensorFlow's contract for these ops: ``all_gather`` and the sparse
reduction pad to the members' maximum first), so every member picks the
same key. The padding is zeros, sliced off after the gather and summed
as zeros by an all-reduce: the results are the values TensorFlow's own path
gives, at up to twice the bytes on the wire for these collectives only.

Installed once (`install`), it changes nothing while TensorFlow's default
(a new key per call) is on: users' own functions keep TensorFlow's
behaviour.
"""

import functools

import tensorflow as tf
from tensorflow.python.distribute import cross_device_utils
from tensorflow.python.ops import collective_ops

# Sizes 2**0 .. 2**31: every int32 element count has its key.
KEYS_PER_VARIABLE_SHAPE_OP = 32

_Launcher = cross_device_utils.CollectiveReplicaLauncher


def keys_fixed_at_trace() -> bool:
    """Whether collectives traced now take their instance keys at trace time
    (inside `tfdist._internal.collectives.function`)."""
    return not _Launcher._prefer_unique_instance_key  # pylint: disable=protected-access


def _shape_varies(tensor) -> bool:
    return not tf.TensorShape(tensor.shape).is_fully_defined()


def reserve_keys(launcher, count: int = KEYS_PER_VARIABLE_SHAPE_OP) -> tf.Tensor:
    """The first of ``count`` consecutive instance keys (one per padded
    size), drawn from the launcher's own counter at trace time: the same
    keys on every member, none shared with another op."""
    # pylint: disable=protected-access
    keys = [launcher._collective_keys.get_instance_key(launcher._group_key, launcher._device)
            for _ in range(count)]
    assert keys == list(range(keys[0], keys[0] + count)), keys
    return tf.constant(keys[0], tf.int32)


def padded_size_and_bucket(size: tf.Tensor):
    """The smallest power of two >= ``size`` (1 for 0) and its exponent,
    in integers: the exponent counts the powers of two below ``size``."""
    powers = tf.bitwise.left_shift(tf.constant(1, tf.int64),
                                   tf.range(KEYS_PER_VARIABLE_SHAPE_OP, dtype=tf.int64))
    bucket = tf.reduce_sum(tf.cast(powers < tf.cast(size, tf.int64), tf.int32))
    return tf.bitwise.left_shift(tf.constant(1, tf.int32), bucket), bucket


def _flat_padded(tensor):
    flat = tf.reshape(tensor, [-1])
    size = tf.size(flat, out_type=tf.int32)
    padded_size, bucket = padded_size_and_bucket(size)
    padded = tf.pad(flat, [[0, padded_size - size]])
    return padded, size, padded_size, bucket


def _all_gather_bucketed(launcher, input_tensor, options):
    """``launcher._all_gather`` of a tensor whose shape may change between
    calls: the same result, through a padded copy of a fixed size per key."""
    # pylint: disable=protected-access
    options = launcher._options.merge(options)
    with tf.device(launcher._device):
        first_key = reserve_keys(launcher)
        input_tensor = tf.convert_to_tensor(input_tensor)
        padded, size, padded_size, bucket = _flat_padded(input_tensor)
        gathered = collective_ops.all_gather_v2(
            padded, launcher._group_size, launcher._group_key, first_key + bucket,
            communication_hint=options.implementation.value, timeout=options.timeout_seconds,
            ordering_token=launcher._get_ordering_token())
        members = tf.reshape(gathered, [launcher._group_size, padded_size])[:, :size]
        shape = tf.shape(input_tensor)
        return tf.reshape(members, tf.concat([[launcher._group_size * shape[0]], shape[1:]], 0))


def _all_reduce_bucketed(launcher, input_tensor, control_input, options):
    """``launcher.all_reduce`` (a sum) of a tensor whose shape may change
    between calls, through a zero-padded copy of a fixed size per key."""
    # pylint: disable=protected-access
    options = launcher._options.merge(options)
    with tf.device(launcher._device):
        first_key = reserve_keys(launcher)
        input_tensor = tf.convert_to_tensor(input_tensor)
        padded, size, _, bucket = _flat_padded(input_tensor)
    with tf.device(launcher._device), launcher._control_input(control_input):
        reduced = collective_ops.all_reduce_v2(
            padded, launcher._group_size, launcher._group_key, first_key + bucket,
            communication_hint=options.implementation.value, timeout=options.timeout_seconds,
            ordering_token=launcher._get_ordering_token())
    with tf.device(launcher._device):
        return tf.reshape(reduced[:size], tf.shape(input_tensor))


def install() -> None:
    """Routes variable-shaped gathers and all-reduces traced under fixed keys
    through the padded, size-keyed form (idempotent)."""
    if getattr(_Launcher, "_tfdist_shape_keyed", False):
        return
    original_gather = _Launcher._all_gather  # pylint: disable=protected-access
    original_reduce = _Launcher.all_reduce

    @functools.wraps(original_gather)
    def _all_gather(self, input_tensor, options):
        if keys_fixed_at_trace() and _shape_varies(tf.convert_to_tensor(input_tensor)):
            return _all_gather_bucketed(self, input_tensor, options)
        return original_gather(self, input_tensor, options)

    @functools.wraps(original_reduce)
    def all_reduce(self, input_tensor, control_input=None, options=None):
        if keys_fixed_at_trace() and _shape_varies(tf.convert_to_tensor(input_tensor)):
            return _all_reduce_bucketed(self, input_tensor, control_input, options)
        return original_reduce(self, input_tensor, control_input, options)

    _Launcher._all_gather = _all_gather  # pylint: disable=protected-access
    _Launcher.all_reduce = all_reduce
    _Launcher._tfdist_shape_keyed = True  # pylint: disable=protected-access
