"""A split weight's regularizer, as the sum of its shards' terms, each on
its shard's device (`tfdist.parallel.tensor_parallel`).

Keras adds ``kernel_regularizer=L2(0.01)``'s term whenever ``model.losses``
is read, from the whole weight. A weight split over the model axis is
never whole inside a step; but Keras' ``L1``, ``L2`` and ``L1L2`` are sums
over the weight's elements, so the whole weight's term is the sum of its
shards' terms: `on_shards` gives the split weight a regularizer that
computes each shard's term on the shard's device
(`tfdist.parallel.sharded_forms.on_device`) and adds the scalars. Other
regularizers (``OrthogonalRegularizer``, a function of one's own) read
the weight whole: refused (`separable`).

tfdist's step sets the terms apart from ``model.losses``
(`tfdist.parallel.plan.ModelPlan`, `each_shard`): each shard's term and its
gradient are computed on the shard's device and the gradient added to its
layer's there, so only the scalar term crosses. Read through
``model.losses`` (a model's own ``compute_loss``), a shard's two gradients
are summed where the step takes the gradients.

>>> import keras, tensorflow as tf
>>> shards = [keras.Variable([[1.0, 2.0]]), keras.Variable([[3.0, 4.0]])]
>>> float(on_shards(keras.regularizers.L2(0.5), shards)(None))   # 0.5 x (1 + 4 + 9 + 16)
15.0
"""

from typing import Sequence

import keras
import tensorflow as tf

from tfdist._internal.keras import model_state as keras_model_state, placed_weights
from tfdist.parallel import sharded_forms

_SEPARABLE = (keras.regularizers.L1, keras.regularizers.L2, keras.regularizers.L1L2)


def separable(regularizer) -> bool:
    """Whether ``regularizer``'s term of a weight is the sum of its shards'."""
    return type(regularizer) in _SEPARABLE


class SumOverShards:
    """A split weight's regularizer (module doc): called with the weight
    (which it does not read), returns the sum of ``regularizer``'s terms of
    ``shards``."""

    def __init__(self, regularizer, shards: Sequence[keras.Variable]):
        self.regularizer = regularizer
        self.shards = list(shards)

    def __call__(self, whole) -> tf.Tensor:
        del whole  # (never read: it would gather the shards)
        terms = [sharded_forms.on_device(
                     placed_weights.device_of(keras_model_state.tensorflow_variable(shard)),
                     lambda shard=shard: self.regularizer(shard), [])
                 for shard in self.shards]
        return tf.add_n(terms)

    def __repr__(self) -> str:
        return f"SumOverShards({self.regularizer!r}, {len(self.shards)} shards)"


def on_shards(regularizer, shards: Sequence[keras.Variable]) -> SumOverShards:
    """``regularizer`` (`separable`) of a weight kept as ``shards``."""
    return SumOverShards(regularizer, shards)


def each_shard(pairs) -> list:
    """``[(weight, regularizer), ...]`` (`tfdist._internal.keras.weight_regularizers.set_apart`'s)
    with each split weight's pair made one pair per shard, so each shard's
    term and gradient are computed on its device, and its gradient added to
    its layer's there (read through ``model.losses``, the two gradients of a
    shard are summed where the step takes the gradients)."""
    flat = []
    for weight, regularizer in pairs:
        if isinstance(regularizer, SumOverShards):
            flat += [(shard, regularizer.regularizer) for shard in regularizer.shards]
        else:
            flat.append((weight, regularizer))
    return flat
