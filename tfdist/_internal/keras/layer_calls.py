"""One call of a Keras layer taken apart into its tensors, so that it can
run as a ``tf.custom_gradient`` of those tensors and be called again from
them: what a unit of fully sharded weights (`tfdist.communication.
gather_units`) and a pipeline stage (`tfdist.parallel.stage_units`) wrap
each top-level layer's ``call`` in.

A ``tf.custom_gradient`` takes dense tensors and drops what Keras attaches
to tensors as attributes (the masks of its inputs and outputs); the call's
other arguments (``training=``, ``mask=``, Python values) pass through
unchanged. Tested with Keras 3.15 and 3.16 (the masks, the autocast scope:
`tfdist._internal.keras.compiled`).
"""

from typing import List

import tensorflow as tf

from tfdist._internal.keras import compiled as keras_compiled


class LayerCall:
    """The arguments of one layer call: its dense tensors in order, and how
    to put arguments back together from (other) tensors.

    Attributes:
      tensors: the dense tensors among the arguments, in order.
      input_masks: each tensor's Keras mask (or None), read before the
        call (a layer may take its inputs' masks off: MultiHeadAttention).
      autocast: the autocast scope the call runs in (mixed precision).
      differentiable: False when a sparse or ragged tensor is among the
        arguments (``tf.custom_gradient`` takes dense tensors only): run
        the call as it is.
    """

    def __init__(self, args, kwargs):
        self._structure = (args, kwargs)
        self._leaves = tf.nest.flatten(self._structure)
        self.differentiable = not any(isinstance(leaf, (tf.RaggedTensor, tf.SparseTensor))
                                      for leaf in self._leaves)
        self._positions = [i for i, leaf in enumerate(self._leaves) if isinstance(leaf, tf.Tensor)]
        self.tensors: List[tf.Tensor] = [self._leaves[i] for i in self._positions]
        self.input_masks = [keras_compiled.get_keras_mask(t) for t in self.tensors]
        self.autocast = keras_compiled.autocast_scope()

    def arguments(self, tensors, *, with_masks: bool = False):
        """``(args, kwargs)`` with ``tensors`` in the tensors' places
        (``with_masks``: each given the mask its tensor had)."""
        if with_masks:
            tensors = [keras_compiled.with_keras_masks(t, mask)
                       for t, mask in zip(tensors, self.input_masks)]
        filled = list(self._leaves)
        for position, tensor in zip(self._positions, tensors):
            filled[position] = tensor
        return tf.nest.pack_sequence_as(self._structure, filled)


def input_gradients(tensors, gradients) -> list:
    """``gradients`` for ``tensors``, None for the ones that are not
    floating point (ids, masks: a custom gradient returns None there)."""
    return [None if not t.dtype.is_floating else g for t, g in zip(tensors, gradients)]
