"""The optimizer's internals tfdist reads: its own clipping and the loss
scale it clips under, the keys and indices it files each weight's state
under, its learning-rate variable, the state variables its ``build``
makes, and which optimizers update each weight element on its own.
Users: `tfdist.replica.gradients`, `tfdist.communication` (sharded state,
its checkpoints, local SGD).
Tested with Keras 3.15 and 3.16; `tests/_internal/test_keras_contract.py` pins what it reads.
"""

import contextlib
from typing import Callable, Iterator, List, Optional

import keras

from tfdist._internal.keras import patches

# What a Keras optimizer updates a weight with: `updates_elementwise`
# accepts a subclass of an elementwise class that keeps all three.
UPDATE_METHODS = ("update_step", "build", "_backend_update_step")


def clip_gradients(optimizer, gradients: list) -> list:
    """Keras' own clipping (clipnorm / global_clipnorm / clipvalue) of
    ``gradients``: the class's, also where the instance's was replaced
    (`patches.replace_clipping_of`)."""
    return list(getattr(type(optimizer), patches.GRADIENT_CLIP)(optimizer, gradients))


def clip_slices(optimizer, gradients: list, sum_over_slices: Callable, *,
                placed: bool = False) -> list:
    """Keras' clipping of ``gradients`` where each is one slice of a whole
    gradient whose other slices other replicas hold (fully sharded weights:
    disjoint slices, zeros past a weight's end), with the whole gradients'
    norms.

    ``sum_over_slices`` takes a vector (one squared norm per gradient, as
    Keras measures it: an ``IndexedSlices`` by its values, a repeated id
    once per occurrence) and returns its sum over the replicas. Then
    Keras' rules, as written in its ``_clip_gradients``: ``clipnorm`` scales
    each gradient by ``clipnorm / max(norm, clipnorm)`` (TensorFlow's
    ``clip_by_norm``, which keeps an ``IndexedSlices`` sparse),
    ``global_clipnorm`` multiplies each by ``clip_norm * min(1 / norm, 1 /
    clip_norm)`` (Keras' ``clip_by_global_norm``: NaN for a non-finite
    norm, and an ``IndexedSlices`` made dense, as on one device), and
    ``clipvalue``, elementwise, is Keras' own on each slice.

    ``placed``: each gradient's squared norm and its clipped value are
    computed under the gradient's own device (a pipeline's stages: only
    the scalar norms travel)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    clipnorm, global_clipnorm = optimizer.clipnorm, optimizer.global_clipnorm
    if not (clipnorm and clipnorm > 0) and not (global_clipnorm and global_clipnorm > 0):
        return clip_gradients(optimizer, gradients)
    present = [g for g in gradients if g is not None]
    if not present:
        return list(gradients)
    def on_device_of(gradient):
        return tf.device(tensor_device(gradient)) if placed else contextlib.nullcontext()

    squared_norms = []
    for gradient in present:
        with on_device_of(gradient):
            squared_norms.append(_squared_norm(gradient))
    squares = iter(tf.unstack(sum_over_slices(tf.stack(squared_norms))))
    whole = [None if g is None else next(squares) for g in gradients]
    if clipnorm and clipnorm > 0:
        clipped = []
        for gradient, squared in zip(gradients, whole):
            with on_device_of(gradient):
                clipped.append(None if gradient is None
                               else _clipped_to_norm(gradient, clipnorm, squared))
        return clipped
    use_norm = tf.sqrt(tf.add_n([w for w in whole if w is not None]))
    scale_for_finite = global_clipnorm * tf.minimum(1.0 / use_norm, 1.0 / global_clipnorm)
    scale = scale_for_finite + (use_norm - use_norm)
    clipped = []
    for gradient in gradients:
        with on_device_of(gradient):
            clipped.append(None if gradient is None else gradient * tf.cast(scale, gradient.dtype))
    return clipped


def tensor_device(gradient) -> str:
    """The device ``gradient`` (a tensor or an ``IndexedSlices``) was made on."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    return (gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient).device


def _squared_norm(gradient):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    values = gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient
    return tf.cast(tf.reduce_sum(values * values), tf.float32)


def _clipped_to_norm(gradient, clip_norm, squared):
    """TensorFlow's ``clip_by_norm`` of ``gradient`` given its whole
    squared norm (the same ops, in the same order)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    sparse = isinstance(gradient, tf.IndexedSlices)
    values = gradient.values if sparse else gradient
    squared = tf.cast(squared, values.dtype)
    positive = squared > 0
    norm = tf.where(positive, tf.sqrt(tf.where(positive, squared, tf.ones_like(squared))),
                    squared)
    clipped = tf.identity(values * clip_norm / tf.maximum(norm, clip_norm))
    return tf.IndexedSlices(clipped, gradient.indices, gradient.dense_shape) if sparse else clipped


def loss_scale(optimizer):
    """A LossScaleOptimizer's current loss scale (its gradients arrive
    multiplied by it, and its inner optimizer clips them divided by it), or
    None for any other optimizer."""
    return getattr(optimizer, "dynamic_scale", None) if hasattr(
        optimizer, "inner_optimizer") else None


def keeps_gradient_unscaled(variable) -> bool:
    """Whether a LossScaleOptimizer hands ``variable``'s gradient on as it
    is (Keras' ``overwrite_with_gradient`` variables) instead of unscaling it."""
    return bool(getattr(variable, "overwrite_with_gradient", False))


def variable_key(optimizer, variable):
    """The key ``optimizer`` files ``variable``'s state under (the same for
    a Keras variable, its TensorFlow variable and a replica's component)."""
    return optimizer._var_key(variable)


def state_index(optimizer, variable) -> int:
    """The index of ``variable`` among the weights ``optimizer`` was built for."""
    return optimizer._trainable_variables_indices[optimizer._var_key(variable)]


def set_state_index(optimizer, variable, index: int) -> None:
    """Files ``variable`` under weight ``index`` (``apply`` accepts only
    the variables it finds there), with that weight's weight decay."""
    optimizer._trainable_variables_indices[optimizer._var_key(variable)] = index
    _file_weight_decay(optimizer, variable, index)


def exclude_from_decay_like(optimizer, variables, whole_keys) -> None:
    """Before ``build``: ``variables`` (a weight's shards) excluded from
    weight decay when the weight is, by one of ``whole_keys`` (its keys
    before and after it was split) in ``exclude_from_weight_decay(var_list=...)``;
    an exclusion by name (``var_names``) applies to the shards' own names,
    the weight's."""
    excluded = getattr(optimizer, "_exclude_from_weight_decay", None)
    if excluded and any(key in excluded for key in whole_keys):
        excluded.update(optimizer._var_key(variable) for variable in variables)


def _decay_filed_at_build(optimizer, variable, index: int) -> None:
    # Keras 3.16 decides at build, per weight, whether weight decay applies
    # (``_weight_decay_by_var_key``) and looks it up in apply.
    decided = optimizer._weight_decay_by_var_key
    built_for = optimizer._trainable_variables[index]
    decided[optimizer._var_key(variable)] = decided[optimizer._var_key(built_for)]


def _decay_decided_in_apply(optimizer, variable, index: int) -> None:
    # Keras 3.15 decides in apply, from the variable's key and name, and
    # caches it by key (``_exclude_from_weight_decay_cache``): the cache
    # takes the decision for the weight ``variable`` stands for.
    built_for = optimizer._trainable_variables[index]
    decision = optimizer._use_weight_decay(built_for)
    optimizer._exclude_from_weight_decay_cache[optimizer._var_key(variable)] = decision


# One implementation per Keras, chosen once (docs/versions.md).
_file_weight_decay = (
    _decay_filed_at_build
    if hasattr(keras.optimizers.Optimizer, "_is_excluded_from_weight_decay")
    else _decay_decided_in_apply)


def learning_rate_variable(optimizer) -> Optional[keras.Variable]:
    """The variable holding ``optimizer``'s learning rate (one of its
    ``variables``), or None when the rate is a schedule or a callable."""
    rate = getattr(optimizer, "_learning_rate", None)
    return rate if isinstance(rate, keras.Variable) else None


def update_reads_step_count(optimizer) -> bool:
    """Whether ``optimizer``'s updates depend on how many steps it has
    counted (``iterations``): a learning-rate schedule or callable, or an
    ``update_step`` that reads the count (Adam's bias correction, Nadam's
    momentum schedule, ...). A LossScaleOptimizer's inner optimizer decides.

    >>> import keras
    >>> update_reads_step_count(keras.optimizers.Adam()), update_reads_step_count(keras.optimizers.SGD())
    (True, False)
    """
    optimizer = patches.inner_optimizer(optimizer)
    if learning_rate_variable(optimizer) is None:
        return True
    return "iterations" in type(optimizer).update_step.__code__.co_names


def is_weights_child(name: str) -> bool:
    """Whether an optimizer's checkpoint child ``name`` is the list of the
    model's weights it was built for (not state of its own)."""
    return name == "_trainable_variables"


@contextlib.contextmanager
def recording_state_variables(optimizer, on_made: Callable) -> Iterator[None]:
    """Within the block, ``on_made(reference_variable, state_variable)``
    after each state variable ``optimizer`` makes for a weight (Keras'
    ``add_variable_from_reference``, which ``add_optimizer_variables``
    calls too); the optimizer is as it was after the block."""
    make_one = optimizer.add_variable_from_reference

    def add_variable_from_reference(reference_variable, *args, **kwargs):
        variable = make_one(reference_variable, *args, **kwargs)
        on_made(reference_variable, variable)
        return variable

    patches.replace_methods_of(optimizer, {"add_variable_from_reference":
                                           add_variable_from_reference})
    try:
        yield
    finally:
        patches.restore_methods_of(optimizer, ("add_variable_from_reference",))


def elementwise_classes() -> tuple:
    """The Keras optimizers whose update of a weight element reads only
    that element's gradient and state (and global scalars: the step, the
    rate). AdamW is an Adam. Nadam (a momentum product shared by all
    elements, updated per step), Lamb and Adafactor (across elements),
    Muon and ScheduleFreeAdamW are not."""
    optimizers = keras.optimizers
    return (optimizers.SGD, optimizers.Adam, optimizers.RMSprop, optimizers.Adagrad,
            optimizers.Adamax, optimizers.Adadelta, optimizers.Lion)


def elementwise_base(optimizer) -> Optional[type]:
    """The elementwise Keras class ``optimizer`` is an instance of, or None."""
    return next((base for base in type(optimizer).__mro__ if base in elementwise_classes()),
                None)


def overridden_update_methods(optimizer) -> List[str]:
    """Which of `UPDATE_METHODS` ``optimizer``'s class replaces from its
    elementwise Keras base (a subclass changing one may look across
    elements): empty for the base itself and for a subclass that keeps them."""
    base = elementwise_base(optimizer)
    if base is None:
        return []
    return [name for name in UPDATE_METHODS
            if getattr(type(optimizer), name, None) is not getattr(base, name, None)]


def updates_elementwise(optimizer) -> bool:
    """Whether ``optimizer`` updates each weight element from its own
    gradient and state: an instance of an `elementwise_classes` class (a
    subclass too, ``class MyAdam(keras.optimizers.Adam)``) whose update
    methods are that class's own."""
    return elementwise_base(optimizer) is not None and not overridden_update_methods(optimizer)
