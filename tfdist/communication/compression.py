"""Gradient compression: the all-reduce in 16 bits.

On a slow network the gradient all-reduce, not the step, decides the speed
of a model with tens of millions of parameters. ``Compression("bf16")`` or
``Compression("fp16")`` casts each replica's gradient to 16 bits before
the all-reduce and back to the variable's dtype after it: half the bytes
cross the network (Horovod's ``fp16`` compression, tensorflow/models'
``allreduce_precision``). It is opt-in and changes results by the rounding
of the gradients:

- ``bf16`` keeps float32's range (8 exponent bits) and 8 bits of mantissa:
  each summand is rounded to about 3 significant digits, and so is the sum.
- ``fp16`` keeps 11 bits of mantissa but a range up to 65504: each replica's
  gradient is divided by the number of replicas before the cast (so the sum
  of N values of at most 65504 cannot overflow) and the sum multiplied back
  after. A gradient element over 65504 on one replica still overflows.

Only the exchange is compressed: the optimizer gets the sum back in the
variable's dtype. On one replica nothing is exchanged, so nothing is cast.
Under parameter servers there is no all-reduce (a clear error).

It works where Keras 3 reduces gradients (``optimizer.apply_gradients``
under a strategy): tfdist's own step, a model's own ``train_step``, a
hand-written loop that calls ``apply_gradients``. `attach_to` wraps the
optimizer's all-reduce for that optimizer only.

>>> import keras, numpy as np, tensorflow as tf, tfdist
>>> strategy = tfdist.make_strategy("mirrored", num_replicas=2)
>>> with strategy.scope():
...     layer = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
...     layer.build((None, 1))
...     optimizer = keras.optimizers.SGD(learning_rate=1.0)
...     optimizer.build(layer.trainable_variables)
>>> tfdist.communication.Compression("bf16").attach_to(optimizer, strategy)
>>> def replica_step():  # two replicas' gradients: 1/3 each, summed in bfloat16
...     optimizer.apply_gradients([(tf.constant([[1 / 3]]), layer.kernel)])
>>> tf.function(lambda: strategy.run(replica_step))()
>>> float(layer.kernel.numpy()[0, 0])  # -(0.333984375 + 0.333984375), not -0.6666667
-0.66796875
"""

import tensorflow as tf

from tfdist._internal.keras import patches
from tfdist.communication.strategy_support import refuse_strategy
from tfdist.errors import ConfigurationError

_DTYPES = {"bf16": tf.bfloat16, "fp16": tf.float16}
_WRAPPED = "_tfdist_compression"


class Compression:
    """Gradients cast to ``dtype`` ("bf16" or "fp16") for the all-reduce (module doc)."""

    def __init__(self, dtype: str):
        if dtype not in _DTYPES:
            raise ConfigurationError(
                f"`Compression` dtype ({dtype!r}) must be 'bf16' (float32's range, fewer "
                "digits) or 'fp16' (more digits, range up to 65504, pre-scaled).")
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"Compression({self.dtype!r})"

    def compress(self, gradient, replicas: int):
        """A replica's gradient as it crosses the network (16 bits)."""
        if gradient is None or not gradient.dtype.is_floating:
            return gradient
        scale = 1.0 / replicas if self.dtype == "fp16" else 1.0
        return _map_values(gradient, lambda v: tf.cast(v * tf.cast(scale, v.dtype),
                                                       _DTYPES[self.dtype]))

    def restore(self, reduced, dtype, replicas: int):
        """The reduced gradient back in ``dtype`` (undoing the fp16 pre-scale)."""
        if reduced is None or reduced.dtype != _DTYPES[self.dtype]:
            return reduced
        scale = float(replicas) if self.dtype == "fp16" else 1.0
        return _map_values(reduced, lambda v: tf.cast(v, dtype) * tf.cast(scale, dtype))

    def attach_to(self, optimizer, strategy: tf.distribute.Strategy) -> None:
        """Makes ``optimizer`` (a Keras 3 optimizer, or a LossScaleOptimizer's
        inner one) all-reduce its gradients compressed. Once per optimizer."""
        refuse_strategy(self, strategy, parameter_servers=(
            "compresses the all-reduce of synchronous strategies; under "
            "ParameterServerStrategy gradients go to the ps without one."))
        target = patches.inner_optimizer(optimizer)
        if not patches.has_gradient_all_reduce(target):
            raise ConfigurationError(
                f"communication={self!r} needs a Keras 3 TensorFlow optimizer; got "
                f"{type(target).__name__}.")
        previous = getattr(target, _WRAPPED, None)
        if previous is not None and previous.dtype != self.dtype:
            raise ConfigurationError(
                f"The optimizer already all-reduces with {previous!r}; one optimizer takes "
                f"one compression (got {self!r}).")
        if previous is None:
            object.__setattr__(target, _WRAPPED, self)
            patches.replace_all_reduce_of(target, _compressed_all_reduce)


def _map_values(gradient, function):
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(function(gradient.values), gradient.indices,
                                gradient.dense_shape)
    return function(gradient)


def _compressed_all_reduce(optimizer, grads_and_vars):
    """The optimizer's class all-reduce, on 16-bit gradients."""
    all_reduce = patches.class_all_reduce(optimizer)
    context = tf.distribute.get_replica_context()
    replicas = context.num_replicas_in_sync if context else 1
    if replicas == 1:
        return all_reduce(optimizer, grads_and_vars)
    compression = getattr(optimizer, _WRAPPED)
    grads_and_vars = list(grads_and_vars)
    dtypes = [None if g is None else g.dtype for g, _ in grads_and_vars]
    compressed = [(compression.compress(g, replicas), v) for g, v in grads_and_vars]
    reduced = all_reduce(optimizer, compressed)
    return [(compression.restore(g, dtype, replicas), v)
            for (g, v), dtype in zip(reduced, dtypes)]


def attached_to(optimizer):
    """The `Compression` attached to ``optimizer`` (or its inner one), or None."""
    return getattr(patches.inner_optimizer(optimizer), _WRAPPED, None)
