"""TensorFlow's ``ShardedVariable`` (a ParameterServerStrategy variable
split over ps tasks) where Keras 3 does not take it: the class to test
against, a strategy's update of one, and its checkpoint form
(`tfdist.strategies.sharded` is the public side).

- The class has no public name: `sharded_variable_class` returns it, or
  None if TensorFlow moved it (nothing is sharded then).
- Keras' optimizer applies each update through ``strategy.extended.update``,
  which under ParameterServerStrategy accepts only plain variables:
  `allow_sharded_updates` makes one strategy object's private ``_update``
  run the update function on a ShardedVariable itself (whose ``assign*``
  methods split the new value over its pieces).
- A ShardedVariable serializes to nothing a checkpoint can restore:
  `save_as_full_tensors` gives one the checkpoint protocol's two methods
  for a whole tensor under the key a plain variable uses.

Pinned by `tests/_internal/test_tensorflow_contract.py` (listed in
`privates`) and by the parameter-server tutorial's test, which trains and
saves sharded tables on 2 ps tasks
(`tests/scenarios/tutorials/test_parameter_server_tutorial.py`).
"""

from typing import Optional

import tensorflow as tf

try:  # ShardedVariable has no public class to test against.
    from tensorflow.python.distribute.sharded_variable import (  # pylint: disable=no-name-in-module
        ShardedVariable as _ShardedVariable,
    )
except ImportError:  # pragma: no cover - TF moved it; nothing is sharded then.
    _ShardedVariable = None

_FULL_TENSOR = "_tfdist_full_tensor"  # marks a variable `save_as_full_tensors` changed
_VALUE = "VARIABLE_VALUE"  # the key a plain variable's value is saved under


def sharded_variable_class() -> Optional[type]:
    """TensorFlow's ShardedVariable class, or None where it has none."""
    return _ShardedVariable


def is_sharded_variable(storage) -> bool:
    """Whether ``storage`` (a TensorFlow variable) is a ShardedVariable."""
    return _ShardedVariable is not None and isinstance(storage, _ShardedVariable)


def allow_sharded_updates(strategy: tf.distribute.Strategy) -> None:
    """Lets ``strategy.extended.update`` update a ShardedVariable; changes
    only this strategy object and defers to it for everything else."""
    extended = strategy.extended
    original = extended._update  # pylint: disable=protected-access

    def update(var, fn, args, kwargs, group):
        if not is_sharded_variable(var):
            return original(var, fn, args, kwargs, group)
        select = extended._select_single_value  # pylint: disable=protected-access
        result = fn(var, *select(args), **select(kwargs))
        if group:
            return result
        return tf.nest.map_structure(extended._local_results, result)  # pylint: disable=protected-access

    extended._update = update  # pylint: disable=protected-access


def save_as_full_tensors(storage) -> None:
    """Makes ShardedVariable ``storage`` checkpoint as one full tensor (once)."""
    if getattr(storage, _FULL_TENSOR, False):
        return

    def serialize():
        return {_VALUE: tf.concat([tf.convert_to_tensor(v) for v in storage.variables], 0)}

    def restore(tensors):
        return storage.assign(tensors[_VALUE])

    storage._serialize_to_tensors = serialize  # pylint: disable=protected-access
    storage._restore_from_tensors = restore  # pylint: disable=protected-access
    setattr(storage, _FULL_TENSOR, True)
