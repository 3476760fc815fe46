"""Keras' distribution loss scaling, made exact for a user's own step.

Under a tf.distribute strategy Keras 3 divides every reduced loss by the
replica count N (``scale_loss_for_distribution``) and its optimizers SUM the
replicas' gradients. That equals one device only when every loss goes
through a Keras loss reduction and every replica holds as many examples: a
loss the user averages with ``ops.mean`` (keras.io's VAE does) is summed N
times over, and an uneven final batch weighs each replica's mean equally.

While tfdist traces a user's ``train_step`` / ``test_step`` in a replica
(`replica_share`), Keras instead scales each reduced loss by the replica's
share of the global batch, ``N * n_r / G`` (1 on equal batches; 0 on an
empty replica), unscales by the same for its loss trackers, and optimizers
AVERAGE the replicas' gradients. Then:

* every loss that goes through ``compute_loss``, a Keras loss, ``add_loss``
  or a regularizer is exact on any batches, partial ones included: the mean
  over replicas of ``N * n_r / G * mean_r`` is ``sum(losses) / G``;
* whatever a ``compute_loss`` override returns is scaled as a whole
  (`scale_compute_loss`): Keras' reductions inside it stay unscaled and
  its result is multiplied by the share, so a term the override adds
  itself (``loss + 0.1 * ops.mean(...)``) is exact on uneven batches too;
* a loss the user averages in their own ``train_step``, outside
  ``compute_loss``, is exact on equal per-replica batches; on an uneven
  final batch each replica's mean counts equally unless it is written
  with `tfdist.replica.global_mean`.

Outside such a trace the patched Keras functions do what Keras does. They
are installed on first use (`install`), never at import.
"""

import contextlib
import functools
import threading

import tensorflow as tf

from tfdist._internal import sparse_gradients
from tfdist._internal.keras import patches
from tfdist._internal.once import once
from tfdist._internal.thread_values import ThreadValue

_SHARE = ThreadValue()  # the traced replica's share, within `replica_share`
_WHOLE = ThreadValue(default=0)  # depth of `keras_losses_whole` blocks
_IN_COMPUTE_LOSS = ThreadValue(default=0)  # depth of a scaled compute_loss's calls
# Traces inside `replica_share`, over all threads. A LossScaleOptimizer
# under MirroredStrategy applies gradients through ``merge_call``, which
# runs each replica's update in a fresh thread (no thread-local share): the
# optimizers' averaging asks this count instead.
_active = {"traces": 0, "replicas": 1}
_active_lock = threading.Lock()


def current_share():
    """The share of the replica whose step is being traced, or None."""
    return _SHARE.get()


@contextlib.contextmanager
def replica_share(share: tf.Tensor, num_replicas: int):
    """Traces a user's step in one replica with ``share = N * n_r / G``."""
    install()
    with _active_lock:
        _active["traces"] += 1
        _active["replicas"] = num_replicas
    try:
        with _SHARE.set_to(share):
            yield
    finally:
        with _active_lock:
            _active["traces"] -= 1


@contextlib.contextmanager
def keras_losses_whole():
    """Within the block (tfdist's own step, traced in one replica), Keras'
    loss reductions do not divide by the replica count: tfdist weighs the
    value by the rows' share itself (a pipeline's micro-batch through a
    model's own ``compute_loss``, `tfdist.replica.own_compute_loss`)."""
    install()
    with _WHOLE.deeper():
        yield


def _by_share(original, operation):
    """``original`` outside a traced user step; inside, ``operation(value,
    share)``, except inside ``compute_loss``, whose result is scaled whole;
    within `keras_losses_whole`, the value as it is."""
    def by_share(value):
        if _WHOLE.get():
            return value
        share = current_share()
        if share is None:
            return original(value)
        if _IN_COMPUTE_LOSS.get():
            return value
        return operation(value, tf.cast(share, value.dtype))
    return by_share


def unscaled(value):
    """``value`` (something a user's step returns, traced in `replica_share`)
    as the step would compute it with a share of 1: Keras' losses in it
    (a loss object's result, ``compute_loss``'s) carry the replica's share
    ``s``, so it is ``v(s)``; for a value affine in those losses (a loss, a
    weighted sum of them plus a constant) ``v(1) = v(s) + (1 - s) * dv/ds``
    exactly, as Keras unscales its loss tracker. A value that does not
    depend on the share is returned as it is. `tfdist.replica.returned_values`
    states the assumption."""
    share = current_share()
    if share is None or tf.executing_eagerly():
        return value
    tensor = tf.cast(tf.convert_to_tensor(value), tf.float32)
    slope = tf.gradients(tensor, share)[0]
    if slope is None:
        return value
    return tensor + (1.0 - tf.cast(share, tf.float32)) * tf.cast(slope, tf.float32)


def scale_compute_loss(model) -> None:
    """Makes ``model.compute_loss`` (the model's own override, or Keras')
    return its loss times the replica's share while tfdist traces the
    model's step in `replica_share`; elsewhere it is the method as written.

    Keras' train_step divides what ``compute_loss`` returns by the share
    again for its loss tracker (``unscale_loss_for_distribution``), so the
    reported loss is the example-weighted mean. Set once per model, as an
    instance attribute (the class and its ``super()`` calls are untouched).
    """
    if patches.has_own_method(model, "compute_loss"):
        return
    compute_loss = model.compute_loss

    # Not converted by autograph (as Keras' own compute_loss is not): one
    # wrapper code object serves every model, and autograph's conversion
    # cache, keyed by code, mixed models up when a user's train_step was
    # converted ("tf__<another function>() takes 0 positional arguments").
    @tf.autograph.experimental.do_not_convert
    @functools.wraps(compute_loss)
    def compute_loss_by_share(*args, **kwargs):
        share = current_share()
        if share is None:
            return compute_loss(*args, **kwargs)
        with _IN_COMPUTE_LOSS.deeper():
            loss = compute_loss(*args, **kwargs)
        return tf.math.multiply_no_nan(loss, tf.cast(share, loss.dtype))

    patches.replace_methods_of(model, {"compute_loss": compute_loss_by_share})


def gradient_scale() -> float:
    """What a replica's gradient is multiplied by before the optimizers sum
    them: ``1 / N`` while a user's step is traced in `replica_share` (its
    loss carries the factor ``N``), else 1 (tfdist's own step: its loss is
    already divided by the global count). Local SGD, which applies a
    replica's gradient without the sum, uses it too."""
    if _active["traces"] and _active["replicas"] > 1:
        return 1.0 / _active["replicas"]
    return 1.0


def _averaging(original):
    def all_reduce_gradients(self, grads_and_vars):
        return sparse_gradients.all_reduce_in_one_device_form(
            original, self, grads_and_vars, scale=gradient_scale())
    return all_reduce_gradients


@once
def install() -> None:
    """Wraps Keras' scaling functions and its TensorFlow optimizer's gradient
    all-reduce once per process (they defer to Keras outside `replica_share`,
    except that sparse gradients always reduce to one device's form:
    `tfdist._internal.sparse_gradients`)."""
    patches.wrap_loss_scaling(lambda scale: _by_share(scale, tf.math.multiply_no_nan),
                              lambda unscale: _by_share(unscale, tf.math.divide_no_nan))
    patches.wrap_optimizer_all_reduce(_averaging)
