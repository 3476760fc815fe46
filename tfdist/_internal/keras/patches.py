"""Where tfdist changes Keras' own functions, each change one function here.

tfdist keeps Keras' semantics by wrapping a few Keras 3 functions: what a
wrapper does lives with its user; this module only finds the Keras function
and puts the wrapper in its place, so every such reach into ``keras.src``
is in one file. Each ``wrap_*`` takes ``wrap(original) -> replacement`` and
runs when its user first needs it (never at import: ``import tfdist`` leaves
Keras as it is).

Users: `tfdist._internal.replica_share` (loss scaling and the gradient
all-reduce of a user's own step), `tfdist._internal.replica_random`
(per-replica seeds), `tfdist.replica.loss_scaling` (finite-gradient
agreement), `tfdist.strategies.atomic_updates` (parameter-server counters),
`tfdist.communication` (compression and local SGD on one optimizer).
Tested with Keras 3.15; `tests/_internal/test_keras_contract.py` pins what it reads.
"""

from typing import Callable

GRADIENT_ALL_REDUCE = "_all_reduce_sum_gradients"  # a Keras TensorFlow optimizer's method


def wrap_loss_scaling(wrap_scale: Callable, wrap_unscale: Callable) -> None:
    """Keras' ``scale_loss_for_distribution`` / ``unscale_loss_for_distribution``."""
    from keras.src.losses import loss as loss_module  # pylint: disable=import-outside-toplevel

    loss_module.scale_loss_for_distribution = wrap_scale(loss_module.scale_loss_for_distribution)
    loss_module.unscale_loss_for_distribution = wrap_unscale(
        loss_module.unscale_loss_for_distribution)


def wrap_optimizer_all_reduce(wrap: Callable) -> None:
    """The gradient all-reduce of every Keras TensorFlow optimizer (the class's)."""
    from keras.src.backend.tensorflow import optimizer as tf_optimizer  # pylint: disable=import-outside-toplevel

    optimizer = tf_optimizer.TFOptimizer
    setattr(optimizer, GRADIENT_ALL_REDUCE, wrap(getattr(optimizer, GRADIENT_ALL_REDUCE)))


def replace_all_reduce_of(optimizer, replacement) -> None:
    """One optimizer instance's gradient all-reduce (``replacement(optimizer,
    grads_and_vars)``, bound to it); the class's stays as it is."""
    import types  # pylint: disable=import-outside-toplevel

    object.__setattr__(optimizer, GRADIENT_ALL_REDUCE, types.MethodType(replacement, optimizer))


def class_all_reduce(optimizer) -> Callable:
    """The all-reduce of ``optimizer``'s class (what an instance's replacement calls)."""
    return getattr(type(optimizer), GRADIENT_ALL_REDUCE)


def has_gradient_all_reduce(optimizer) -> bool:
    """Whether ``optimizer`` is a Keras 3 TensorFlow optimizer (it has the all-reduce)."""
    return hasattr(type(optimizer), GRADIENT_ALL_REDUCE)


def inner_optimizer(optimizer):
    """The optimizer that applies updates: a LossScaleOptimizer's inner one, or itself."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def wrap_seed_draw(wrap: Callable) -> None:
    """The seed draw of Keras' TensorFlow random ops (``draw_seed``)."""
    from keras.src.backend.tensorflow import random as tf_random  # pylint: disable=import-outside-toplevel

    tf_random.draw_seed = wrap(tf_random.draw_seed)


def wrap_loss_scale_apply(wrap: Callable) -> None:
    """``LossScaleOptimizer.apply`` (mixed precision's finite check and update)."""
    from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer  # pylint: disable=import-outside-toplevel

    keras_apply = LossScaleOptimizer.apply
    replacement = wrap(keras_apply)
    replacement.__doc__ = keras_apply.__doc__
    LossScaleOptimizer.apply = replacement


def wrap_variable_increments(wrap: Callable) -> None:
    """Keras variables' ``assign_add`` / ``assign_sub``: ``wrap(original,
    name, in_stateless_scope)`` for each."""
    from keras.src.backend.common.stateless_scope import in_stateless_scope  # pylint: disable=import-outside-toplevel
    from keras.src.backend.tensorflow.core import Variable  # pylint: disable=import-outside-toplevel

    for name in ("assign_add", "assign_sub"):
        setattr(Variable, name, wrap(getattr(Variable, name), name, in_stateless_scope))
