"""The one place tfdist replaces what a Keras layer or variable runs: a
layer's ``call`` made a unit of a way of splitting the model, and a
variable's ``constraint`` replaced by the same constraint, placed.

Each way of splitting a model gives a policy and this module does the
Keras side once:

- a pipeline's stages place each unit on its stage's device and order
  its passes (`tfdist.parallel.stage_units`);
- fully sharded weights gather a unit's weights for its call and again,
  recomputing it, for its gradient (`tfdist.communication.gather_units`);
- tensor parallelism runs a split layer in its sharded form
  (`tfdist.parallel.tensor_parallel`);
- an ``Embedding`` looks its ids up by rows of its table
  (`tfdist._internal.keras.embedding_rows`): not here, but in the class's
  ``Embedding.call``, so that a subclass's ``super().call(ids)`` (keras-rs'
  ``EmbedReduce``) reaches it too (`patches.wrap_embedding_call`).

`wrap_call` replaces a layer's ``call`` (an instance attribute: Keras'
``Layer.__call__`` looks ``self.call`` up on the instance) with the
policy's function, once per policy, marked on the layer. `run_as_unit`
runs one call, traced, as a custom gradient of its dense tensors
(`tfdist._internal.tensorflow.placed_gradients`: what the call reads on
other devices stays there): the policy
gives the forward pass and, from it, the gradient; this keeps what a
custom gradient drops (the Keras masks of the outputs) and gives each
input its gradient in the input's own form. `replace_constraint` sets a
variable's ``constraint`` (Keras' ``apply`` runs it after the update).
`separate_weight_reads` marks a part of a call run as a custom gradient
of its own (a chunk of a sequence: `tfdist.parallel.sharded_sequence`):
a weight it reads is read for it, never a value another part read, so
its gradient reaches the weight (fully sharded weights gather it again).
The Keras contract test pins each (`tests/_internal/test_keras_contract.py`).

>>> import keras, numpy as np, tensorflow as tf
>>> layer = keras.layers.Dense(2)
>>> calls = []
>>> def counted(original):
...     def call(*args, **kwargs):
...         calls.append(1)
...         return original(*args, **kwargs)
...     return call
>>> wrap_call(layer, "counting", counted), wrap_call(layer, "counting", counted)
(True, False)
>>> _ = layer(np.ones((1, 3), "float32"))
>>> len(calls), is_wrapped(layer, "counting")
(1, True)
"""

import functools
from typing import Callable, Sequence, Tuple

import tensorflow as tf

from tfdist._internal.keras import compiled as keras_compiled, layer_calls
from tfdist._internal.thread_values import ThreadValue
from tfdist._internal.tensorflow import placed_gradients

# What the gradient of one unit gets and gives: (upstream gradients of the
# outputs, the variables the forward pass read) -> gradients of the
# inputs' tensors, then of the variables, in order.
Gradient = Callable[[list, list], list]


_SEPARATE_READS = ThreadValue(False)


def separate_weight_reads():
    """A context inside which each weight read is the part's own (module doc)."""
    return _SEPARATE_READS.set_to(True)


def weight_reads_separate() -> bool:
    """Whether a read now is a part's own (`separate_weight_reads`)."""
    return bool(_SEPARATE_READS.get())


def _marker(policy: str) -> str:
    return f"_tfdist_unit_{policy}"


def is_wrapped(layer, policy: str) -> bool:
    """Whether ``layer``'s call was made a unit of ``policy``."""
    return bool(getattr(layer, _marker(policy), False))


def wrap_call(layer, policy: str, make_call: Callable[[Callable], Callable]) -> bool:
    """Replaces ``layer.call`` by ``make_call(original call)``, unless
    ``policy`` (a name: ``"stage"``, ``"gather"``) already wrapped it;
    returns whether it wrapped it now."""
    if is_wrapped(layer, policy):
        return False
    original = layer.call
    layer.call = functools.wraps(original)(make_call(original))
    object.__setattr__(layer, _marker(policy), True)
    return True


def run_as_unit(call: layer_calls.LayerCall,
                forward: Callable[[tuple], Tuple[object, Gradient]],
                extra: Sequence[tf.Tensor] = ()):
    """Runs ``call`` (a `layer_calls.LayerCall` of a differentiable call)
    as one ``tf.custom_gradient`` of its tensors: ``forward(tensors)``
    returns the call's result and its `Gradient`. Returns the result with
    its Keras masks, as the layer's call returns it.

    ``extra``: tensors the call reads besides its arguments (a pipeline
    stage's fully sharded weights, gathered once per step): inputs of the
    custom gradient too, so gradients reach them; the `Gradient` then
    returns, after the inputs', one gradient per extra tensor, before the
    variables'."""
    masks_of_result = []  # (the identity custom_gradient returns drops Keras' masks)
    extra = list(extra)

    @placed_gradients.custom_gradient
    def unit(*tensors):
        inputs = tensors[:len(tensors) - len(extra)]
        result, gradient_of = forward(inputs)
        masks_of_result.append(keras_compiled.keras_masks(result))

        def gradient(*upstream, variables=None):
            variables = list(variables or [])
            grads = gradient_of(list(upstream), variables)
            read = len(inputs) + len(extra)
            return (layer_calls.input_gradients(inputs, grads[:len(inputs)])
                    + list(grads[len(inputs):read]),
                    grads[read:])

        return result, gradient

    outputs = unit(*call.tensors, *extra)
    return keras_compiled.with_keras_masks(outputs, masks_of_result.pop())


def replace_constraint(variable, make_constraint: Callable[[Callable], Callable],
                       policy: str) -> bool:
    """Replaces ``variable.constraint`` (a Keras variable's, which Keras'
    ``apply`` runs after the update) by ``make_constraint(constraint)``,
    unless it has none or ``policy`` replaced it already; returns whether
    it replaced it now."""
    constraint = getattr(variable, "constraint", None)
    if constraint is None or getattr(constraint, _marker(policy), False):
        return False
    replaced = make_constraint(constraint)
    setattr(replaced, _marker(policy), True)
    variable.constraint = replaced
    return True
