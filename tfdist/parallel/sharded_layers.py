"""What a Keras layer split by a `LayoutMap` runs: its ``call`` replaced
by the Megatron-LM form of `tfdist.parallel.sharded_forms` on the
layer's shards (`tfdist.parallel.tensor_parallel` makes the shards and
wraps the layers).

A ``Dense`` layer split by columns computes its output's columns on the
model devices and returns them joined on the replica's first model
device, for the layers that read the whole output (a ``Dropout``, a
replicated layer). The parts are kept too, in `SplitActivations`: a
``Dense`` split by rows whose input is exactly that output reads the
parts where they are, so a column layer followed by a row layer moves
the batch's activations once per model device and direction, and the
join, which nothing else reads, is not computed (TensorFlow runs only
the ops a step's results need). A row layer given any other input cuts
it into its parts first (one piece sent to each model device).

>>> import keras, numpy as np, tensorflow as tf, tfdist
>>> devices = tfdist.strategies.configure_logical_cpus(2)
>>> layer = keras.layers.Dense(4, use_bias=False)
>>> layer.build((None, 3))
>>> kernels = []
>>> for device, part in zip(devices, np.split(layer.kernel.numpy(), 2, axis=1)):
...     with tf.device(device):
...         kernels.append(tf.Variable(part))
>>> split = DenseShards("column", kernels, None, SplitActivations())
>>> x = np.ones((2, 3), "float32")
>>> np.allclose(split.call(layer, tf.constant(x)), x @ layer.kernel.numpy())
True
"""

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tfdist._internal.keras import model_state as keras_model_state, placed_weights
from tfdist.parallel import sharded_forms


class SplitActivations:
    """The parts of each whole output a column layer returned, by tensor:
    what a row layer reading that output uses instead (module doc). Kept
    for the last few outputs traced (a step's trace reads them at once)."""

    def __init__(self, limit: int = 256):
        self._limit = limit
        self._parts: Dict[int, Tuple[tf.Tensor, List[tf.Tensor]]] = {}

    def keep(self, whole: tf.Tensor, parts: List[tf.Tensor]) -> None:
        self._parts.pop(id(whole), None)
        self._parts[id(whole)] = (whole, parts)
        if len(self._parts) > self._limit:  # (the oldest first)
            del self._parts[next(iter(self._parts))]

    def parts_of(self, tensor) -> Optional[List[tf.Tensor]]:
        """``tensor``'s parts when a column layer returned it, else None."""
        whole, parts = self._parts.get(id(tensor), (None, None))
        return parts if whole is tensor else None


@dataclasses.dataclass
class DenseShards:
    """One ``Dense`` layer's shards and its form.

    Attributes:
      form: ``"column"`` or ``"row"`` (`tfdist.parallel.layouts`).
      kernels: the kernel's shards, in order (Keras variables, or
        TensorFlow ones; under a strategy each replica's copy on that
        replica's model device).
      biases: the bias' shards (column form), the whole bias (row form:
        a list of one), or None.
      activations: the table column outputs are kept in.
    """

    form: str
    kernels: Sequence
    biases: Optional[Sequence]
    activations: SplitActivations

    def call(self, layer, inputs, training=None):
        """What ``layer`` (a ``Dense``) computes from ``inputs``, sharded."""
        del training  # (Dense computes the same in both phases)
        kernels = [keras_model_state.tensorflow_variable(k) for k in self.kernels]
        devices = [placed_weights.device_of(k) for k in kernels]  # (this replica's copies)
        biases = (None if self.biases is None
                  else [keras_model_state.tensorflow_variable(b) for b in self.biases])
        if self.form == "column":
            parts = sharded_forms.column(inputs, kernels, biases, devices, layer.activation)
            with tf.device(devices[0]):
                whole = tf.concat(parts, axis=-1)
            self.activations.keep(whole, parts)
            return whole
        parts = self.activations.parts_of(inputs)
        if parts is None:
            with tf.device(devices[0]):
                parts = tf.split(inputs, len(kernels), axis=-1)
        return sharded_forms.row(parts, kernels, None if biases is None else biases[0],
                                 devices[0], layer.activation, devices=devices)
