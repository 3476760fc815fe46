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
"""

import keras
import tensorflow as tf
from tensorflow.python.framework import device as tf_device


def _same_device(a: str, b: str) -> bool:
    """Whether ``a`` (a variable's full device) is ``b`` (a device that may
    leave out its job and task: this process's then)."""
    spec_a, spec_b = tf_device.DeviceSpec.from_string(a), tf_device.DeviceSpec.from_string(b)
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
