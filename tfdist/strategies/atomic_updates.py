"""Counters that lose no updates when parameter-server workers race.

Under ParameterServerStrategy each worker runs its steps on its own, so two
workers update the same variables on a ps at the same time. TensorFlow's
``AssignAddVariableOp`` is one locked read-add-write on the ps, but Keras
3.15's ``Variable.assign_add`` is ``assign(self + value)``: a read, then a
separate write. When two workers interleave, one increment is lost. Keras'
optimizer counts its steps that way (``optimizer.iterations``, which
learning-rate schedules and Adam's bias correction read) and every Keras
metric accumulates that way. Measured on 2 workers, 1 ps, 400 scheduled
steps: ``optimizer.iterations`` 291 and a ``keras.metrics.Sum`` of 1 per
step 289, where a ``tf.Variable.assign_add`` counted 400 (keras-team/keras
issue 18668; Keras 3 does not support parameter-server training).

While tfdist traces a parameter-server step (`atomic`), a Keras variable's
``assign_add`` / ``assign_sub`` run as TensorFlow's one-op forms, so the
counts are exact. The optimizer's slot updates (``m = b m + (1 - b) g``)
stay a read and a write, as in any asynchronous ("Hogwild") training.

The wrapper is installed on Keras' TensorFlow ``Variable`` class on first
use and defers to Keras outside `atomic`:

>>> import keras, tensorflow as tf
>>> from tfdist.strategies import atomic_updates
>>> counter = keras.Variable(0.0)
>>> @tf.function
... def count():
...     with atomic_updates.atomic():
...         counter.assign_add(2.0)
>>> count(); count()
>>> float(counter.numpy())
4.0
"""

import contextlib
import threading

import tensorflow as tf

from tfdist._internal.keras import model_state as keras_model_state, patches
from tfdist._internal.once import once

_lock = threading.Lock()
# Process-wide, not per thread: strategies may run a replica's updates in
# other threads than the one tracing the step.
_active = [0]


@contextlib.contextmanager
def atomic():
    """While tracing a step: Keras variables' ``assign_add`` /
    ``assign_sub`` are single TensorFlow ops (module doc)."""
    _install()
    with _lock:
        _active[0] += 1
    try:
        yield
    finally:
        with _lock:
            _active[0] -= 1


@once
def _install() -> None:
    patches.wrap_variable_increments(_one_op)


def _one_op(keras_method, name: str, in_stateless_scope):
    def method(self, value):
        if not _active[0] or in_stateless_scope():
            return keras_method(self, value)
        storage = keras_model_state.tensorflow_variable(self)
        return getattr(storage, name)(tf.cast(value, storage.dtype))

    method.__name__ = name
    method.__doc__ = keras_method.__doc__
    return method
