"""Keras weights moved onto a device: a pipeline stage's weights live on
its device (`tfdist.parallel.pipeline`).

A Keras 3 variable on TensorFlow keeps its value in a ``tf.Variable``
(``_value``) made where the model was built. `place` makes a new one on
the device, with the same value, name and trainability, and makes the
Keras variable keep its value there; everything that reads or writes the
Keras variable (its layer, ``get_weights``, checkpoints, the optimizer,
whose state Keras makes next to the variable's value) then reaches the
new storage. Tested with Keras 3.15 and 3.16; `tests/_internal/test_keras_contract.py`
pins ``_value``.

Under a strategy with replicas (the Keras variable's value is then the
strategy's mirrored variable, one copy per replica), `place_copies` puts
replica r's copy on its own device for the stage
(`tfdist._internal.tensorflow.distributed_variables`): each replica reads
and updates its copy there, and the strategy's all-reduce of a gradient
meets the copies where they are.
"""

from typing import Sequence

import keras
import tensorflow as tf

from tfdist._internal.tensorflow import distributed_variables


def _same_device(a: str, b: str) -> bool:
    """Whether ``a`` (a variable's full device) is ``b`` (a device that may
    leave out its job and task: this process's then)."""
    spec_a, spec_b = tf.DeviceSpec.from_string(a), tf.DeviceSpec.from_string(b)
    if (spec_a.device_type, spec_a.device_index) != (spec_b.device_type, spec_b.device_index):
        return False
    return all(getattr(spec_b, part) is None or getattr(spec_b, part) == getattr(spec_a, part)
               for part in ("job", "replica", "task"))


def device_of(variable) -> str:
    """Where ``variable`` (a Keras variable, or a ``tf.Variable``) keeps its value."""
    return (variable.value if isinstance(variable, keras.Variable) else variable).device


def place(variable, device: str) -> None:
    """Keeps Keras variable ``variable``'s value on ``device``."""
    old = variable._value  # pylint: disable=protected-access
    if _same_device(old.device, device):
        return
    with tf.init_scope(), tf.device(device):
        new = tf.Variable(old.read_value(), trainable=old.trainable,
                          name=old.name.split(":")[0], dtype=old.dtype)
    variable._value = new  # pylint: disable=protected-access


def place_copies(variable, devices: Sequence[str], strategy) -> None:
    """Keeps local replica r's copy of Keras variable ``variable`` on
    ``devices[r]`` when it was made under ``strategy`` with a copy per
    replica; else its one value on ``devices[0]`` (`place`)."""
    old = variable._value  # pylint: disable=protected-access
    if not distributed_variables.is_distributed(old):
        place(variable, devices[0])
        return
    copies = distributed_variables.local_copies(old)
    if all(_same_device(copy.device, device) for copy, device in zip(copies, devices)):
        return
    with tf.init_scope(), strategy.scope(), \
            distributed_variables.mirrored_on(strategy, devices):
        new = tf.Variable(copies[0].read_value(), trainable=old.trainable,
                          name=old.name.split(":")[0], dtype=old.dtype,
                          aggregation=old.aggregation, synchronization=old.synchronization)
    variable._value = new  # pylint: disable=protected-access
