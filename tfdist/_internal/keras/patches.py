"""Where tfdist changes Keras' own functions and methods, each change one
function here.

tfdist keeps Keras' semantics by wrapping a few Keras 3 functions: what a
wrapper does lives with its user; this module only finds the Keras function
and puts the wrapper in its place, so every such reach into ``keras.src``
is in one file. Each ``wrap_*`` takes ``wrap(original) -> replacement`` and
runs when its user first needs it (never at import: ``import tfdist`` leaves
Keras as it is). The ``replace_*_of`` functions change one object only (a
model's ``fit`` or ``compute_loss``, one optimizer's update or checkpoint
children), as instance attributes set past Keras' attribute tracking;
`restore_methods_of` gives the object its class's methods back.

Users: `tfdist._internal.replica_share` (loss scaling and the gradient
all-reduce of a user's own step), `tfdist._internal.replica_random`
(per-replica seeds), `tfdist.replica.loss_scaling` (finite-gradient
agreement), `tfdist.strategies.atomic_updates` (parameter-server counters),
`tfdist.communication` (compression, local SGD and sharded state on one
optimizer), `tfdist.replica.gradients` (the clipping of an optimizer a
model's own step applies), `tfdist.training.keras_fit` (``tfdist.attach``),
`tfdist._internal.keras.step_weights` (a split model's trainable weights
in its own step), `tfdist._internal.keras.embedding_rows` (lookups by rows).
Tested with Keras 3.15 and 3.16; `tests/_internal/test_keras_contract.py` pins what it reads.
"""

import functools
from typing import Callable, Dict, Iterable

import keras

GRADIENT_ALL_REDUCE = "_all_reduce_sum_gradients"  # a Keras TensorFlow optimizer's method
DISTRIBUTED_UPDATE = "_backend_update_step"  # its update of every weight, in a replica
CHECKPOINT_CHILDREN = "_trackable_children"  # what tf.train.Checkpoint saves of an object
GRADIENT_CLIP = "_clip_gradients"  # an optimizer's clipnorm / global_clipnorm / clipvalue
WEIGHT_DECAY = "_apply_weight_decay"  # its decay of every weight, before the update
TRAINABLE_LISTS = ("trainable_weights", "trainable_variables")  # a layer's properties


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


def replace_clipping_of(optimizer, replacement) -> None:
    """One optimizer instance's gradient clipping (``replacement(optimizer,
    gradients)``, bound to it; ``apply`` calls it before the all-reduce);
    the class's stays as it is."""
    import types  # pylint: disable=import-outside-toplevel

    object.__setattr__(optimizer, GRADIENT_CLIP, types.MethodType(replacement, optimizer))


def all_reduce_sum(optimizer, grads_and_vars) -> list:
    """``optimizer``'s own gradient all-reduce (summing over the replicas,
    its replacement or wrapper if it has one) of ``grads_and_vars``."""
    return getattr(optimizer, GRADIENT_ALL_REDUCE)(list(grads_and_vars))


def replace_update_of(optimizer, update: Callable) -> None:
    """One optimizer instance's distributed update of every weight:
    ``update(grads, variables, learning_rate)``, called in each replica by
    Keras' ``apply`` where Keras' own would be (``variables`` Keras
    variables or their TensorFlow variables)."""
    object.__setattr__(optimizer, DISTRIBUTED_UPDATE, update)


def replace_weight_decay_of(optimizer, decay: Callable) -> None:
    """One optimizer instance's weight decay (AdamW's ``weight_decay``):
    ``decay(variables)``, called by Keras' ``apply`` before the update."""
    object.__setattr__(optimizer, WEIGHT_DECAY, decay)


def update_of(optimizer) -> Callable:
    """``optimizer``'s distributed update as it is now (its replacement, if
    it has one): ``update(grads, variables, learning_rate)``."""
    return getattr(optimizer, DISTRIBUTED_UPDATE)


def weight_decay_of(optimizer) -> Callable:
    """``optimizer``'s weight decay as it is now: ``decay(variables)``."""
    return getattr(optimizer, WEIGHT_DECAY)


def replace_checkpoint_children_of(optimizer, wrap: Callable) -> None:
    """What a checkpoint sees of one object (its children by name, as
    ``tf.train.Checkpoint`` and background saves list them): ``wrap(children)``
    of what Keras lists."""
    keras_children = getattr(optimizer, CHECKPOINT_CHILDREN)

    def children(*args, **kwargs):
        return wrap(keras_children(*args, **kwargs))

    object.__setattr__(optimizer, CHECKPOINT_CHILDREN, children)


def replace_methods_of(obj, methods: Dict[str, Callable]) -> None:
    """Sets ``methods`` (``{name: function}``) on ``obj`` only, as instance
    attributes, past Keras' attribute tracking (a function, not a layer or
    variable); its class, and its ``super()`` calls, are untouched."""
    for name, method in methods.items():
        object.__setattr__(obj, name, method)


def restore_methods_of(obj, names: Iterable[str]) -> None:
    """Takes ``obj``'s own ``names`` away (set by `replace_methods_of`):
    its class's methods show again."""
    for name in names:
        if name in vars(obj):
            object.__delattr__(obj, name)


def has_own_method(obj, name: str) -> bool:
    """Whether ``name`` is set on ``obj`` itself (by `replace_methods_of`),
    not only on its class."""
    return name in vars(obj)


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


def wrap_trainable_weights(wrap: Callable) -> None:
    """``trainable_weights`` and ``trainable_variables`` of every Keras layer
    (the properties of ``keras.layers.Layer``, which models inherit):
    ``wrap(getter)`` for each, a getter of the layer."""
    layer = keras.layers.Layer
    for name in TRAINABLE_LISTS:
        getter = getattr(layer, name).fget
        setattr(layer, name, property(wrap(getter), doc=getter.__doc__))


def wrap_variable_increments(wrap: Callable) -> None:
    """Keras variables' ``assign_add`` / ``assign_sub``: ``wrap(original,
    name, in_stateless_scope)`` for each."""
    from keras.src.backend.common.stateless_scope import in_stateless_scope  # pylint: disable=import-outside-toplevel
    from tfdist._internal.keras import privates  # pylint: disable=import-outside-toplevel

    Variable = privates.tensorflow_ops("core").Variable  # pylint: disable=invalid-name
    for name in ("assign_add", "assign_sub"):
        setattr(Variable, name, wrap(getattr(Variable, name), name, in_stateless_scope))


def wrap_embedding_call(wrap: Callable) -> None:
    """``keras.layers.Embedding.call`` (the class's): what every
    ``Embedding`` runs, a subclass's ``super().call(ids)`` too (keras-rs'
    ``EmbedReduce``, KerasHub's ``ReversibleEmbedding``)."""
    embedding = keras.layers.Embedding
    keras_call = embedding.call
    embedding.call = functools.wraps(keras_call)(wrap(keras_call))
