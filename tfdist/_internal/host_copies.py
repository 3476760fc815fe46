"""A background save's host copy of a value that is stored in slices.

TensorFlow's asynchronous checkpoint copies each saved object to the host
(``_copy_trackable_to_cpu(object_map)``) and writes the copies while
training goes on. An object whose value is read whole from per-replica
slices (sharded optimizer state, fully sharded weights) is copied as one
host variable of its whole value, made at the first save and assigned at
the next ones.
"""

import tensorflow as tf


def keep_host_copy(object_map: dict, trackable, whole: tf.Tensor) -> None:
    """``object_map[trackable]``: a host variable holding ``whole``."""
    if trackable not in object_map:
        with tf.device("/cpu:0"):
            object_map[trackable] = tf.Variable(whole, trainable=False)
    else:
        object_map[trackable].assign(whole)
