"""Keras 3 models with sharded variables (ParameterServerStrategy).

With a variable partitioner, ParameterServerStrategy stores a large
variable as a ``ShardedVariable``: pieces on different ps tasks. Keras 3
wraps it like any ``tf.Variable`` but does not support it in two places a
training step needs:

- ``GradientTape.gradient`` with the Keras variable as a source asks for its
  ``handle``, which a ShardedVariable does not have. `gradients` takes the
  gradient with respect to the shards and joins them into one gradient of
  the full shape.
- Keras' optimizer applies each update through ``strategy.extended.update``,
  which under ParameterServerStrategy accepts only plain variables. After
  `allow_sharded_updates`, the strategy runs the update function on the
  ShardedVariable itself; its ``assign*`` methods split the new value over
  the shards, so the update is the same arithmetic as for one variable.

- Keras saves a variable as what its TensorFlow variable serializes to; a
  ShardedVariable serializes to nothing usable (saving fails). After
  `save_as_full_tensors`, it saves as one full tensor under the key a plain
  variable uses, so a checkpoint restores into any number of shards, or
  into an unsharded variable on one device, and back.
"""

from typing import List, Sequence

import tensorflow as tf

from tfdist._internal.keras import model_state as keras_model_state
from tfdist._internal.tensorflow import sharded_variables


def is_sharded(variable) -> bool:
    return sharded_variables.is_sharded_variable(keras_model_state.tensorflow_variable(variable))


def shards(variable) -> List[tf.Variable]:
    """The TensorFlow variables holding a Keras variable, in order: its
    pieces if sharded, else the one variable. Each has a ``device``."""
    storage = keras_model_state.tensorflow_variable(variable)
    return list(storage.variables) if is_sharded(variable) else [storage]


def gradients(tape: tf.GradientTape, target, variables: Sequence) -> list:
    """``tape.gradient(target, variables)`` that also handles sharded ones."""
    if not any(is_sharded(v) for v in variables):
        return tape.gradient(target, variables)
    sources = [shards(v) if is_sharded(v) else [v] for v in variables]
    flat = tape.gradient(target, [s for group in sources for s in group])
    result, start = [], 0
    for variable, group in zip(variables, sources):
        pieces = flat[start:start + len(group)]
        start += len(group)
        if not is_sharded(variable):
            result.append(pieces[0])
        elif any(p is None for p in pieces):
            result.append(None if all(p is None for p in pieces) else tf.concat(
                [tf.zeros_like(s) if p is None else tf.convert_to_tensor(p)
                 for p, s in zip(pieces, group)], 0))
        else:
            result.append(tf.concat([tf.convert_to_tensor(p) for p in pieces], 0))
    return result


def allow_sharded_updates(strategy: tf.distribute.Strategy) -> None:
    """Lets ``strategy.extended.update`` update a ShardedVariable (this
    strategy object only; `tfdist._internal.tensorflow.sharded_variables`)."""
    sharded_variables.allow_sharded_updates(strategy)


def save_as_full_tensors(variables: Sequence) -> None:
    """Makes the sharded ones among ``variables`` checkpoint as full tensors."""
    for variable in variables:
        if is_sharded(variable):
            sharded_variables.save_as_full_tensors(
                keras_model_state.tensorflow_variable(variable))
