"""The one place tfdist touches Keras 3 internals.

tfdist runs its own replica step instead of ``Model.train_step`` so it can
scale losses by the true global example count. To keep Keras semantics
(compiled losses, loss weights, masks, metric names) it reads a few private
attributes of a compiled Keras 3 model. They are gathered here so a Keras
upgrade breaks one small module, and `tests/test_keras_contract.py` pins them.
Tested with Keras 3.15.
"""

import contextlib
import threading

import keras
import tensorflow as tf
from keras.src import backend as keras_backend
from keras.src import tree
from keras.src.backend.tensorflow import nn as _tf_nn

from tfdist.replica import collectives

__all__ = [
    "all_layers",
    "begin_training",
    "build_model_state",
    "callback_list",
    "class_weight_map_fn",
    "seed_generator_states",
    "class_weight_to_sample_weights",
    "clip_gradients",
    "compile_identity",
    "flatten_metrics_in_order",
    "keras_data_as_dataset",
    "train_validation_split",
    "wants_batch_logs",
    "compile_metrics",
    "flat_losses",
    "get_keras_mask",
    "host_copies_reused",
    "PyDataset",
    "output_loss_metrics",
    "statistics_over_real_rows",
    "tree",
]

get_keras_mask = keras_backend.get_keras_mask
PyDataset = keras.utils.PyDataset


def train_validation_split(arrays, validation_split: float):
    """Keras' own split for ``validation_split``: the last fraction, unshuffled."""
    from keras.src.trainers.data_adapters import array_slicing  # pylint: disable=import-outside-toplevel

    return array_slicing.train_validation_split(arrays, validation_split=validation_split)


def class_weight_to_sample_weights(y, class_weight: dict):
    """Keras' per-example weights for ``class_weight`` (argmax of one-hot ``y``)."""
    from keras.src.trainers.data_adapters import data_adapter_utils  # pylint: disable=import-outside-toplevel

    return data_adapter_utils.class_weight_to_sample_weights(y, class_weight)


def class_weight_map_fn(class_weight: dict):
    """Keras' own ``dataset.map`` function for ``class_weight`` (its tf.data
    adapter's): adds each batch's per-example weights as sample_weight, and
    raises Keras' errors (weights already given, several outputs)."""
    from keras.src.trainers.data_adapters import tf_dataset_adapter  # pylint: disable=import-outside-toplevel

    return tf_dataset_adapter.make_class_weight_map_fn(class_weight)


def keras_data_as_dataset(x, y=None, sample_weight=None, batch_size=None, class_weight=None):
    """A `keras.utils.PyDataset` or Python generator as Keras itself reads it
    (its data adapter, ``class_weight`` included), unshuffled, as a
    tf.data.Dataset of batches."""
    from keras.src.trainers import data_adapters  # pylint: disable=import-outside-toplevel

    return data_adapters.get_data_adapter(
        x, y, sample_weight, batch_size=batch_size, shuffle=False,
        class_weight=class_weight).get_tf_dataset()


def flatten_metrics_in_order(model: keras.Model, logs: dict):
    """What Keras ``evaluate(return_dict=False)`` returns for ``logs``: a
    scalar for one entry, else a list in ``model.metrics_names`` order."""
    return model._flatten_metrics_in_order(logs)


def compile_identity(model: keras.Model) -> tuple:
    """Changes whenever ``model.compile`` runs again (new loss, metrics and
    optimizer objects), so a Trainer built for the old ones can be replaced."""
    return (id(model.optimizer), id(getattr(model, "_compile_loss", None)),
            id(getattr(model, "_compile_metrics", None)))


def clip_gradients(optimizer, gradients: list) -> list:
    """Keras' own clipping (clipnorm / global_clipnorm / clipvalue) of ``gradients``."""
    return list(optimizer._clip_gradients(gradients))


_TRAIN_BATCH_HOOKS = ("on_train_batch_begin", "on_batch_begin", "on_train_batch_end",
                      "on_batch_end")


class _CallbackList(keras.callbacks.CallbackList):
    """Keras' ``CallbackList``, whose per-execution training hooks return at
    once when no callback has one (Keras marks the base class's empty hooks
    as default): Keras converts the logs for every call, ~10 us of Python
    per execution (cProfile) that no callback reads."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._train_batch_hooks = _overrides_a_hook(self.callbacks, _TRAIN_BATCH_HOOKS)

    def on_train_batch_begin(self, batch, logs=None):
        if self._train_batch_hooks:
            super().on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch, logs=None):
        if self._train_batch_hooks:
            super().on_train_batch_end(batch, logs)


def callback_list(callbacks, model, add_progbar: bool, **params) -> keras.callbacks.CallbackList:
    """``callbacks`` as Keras' fit makes them: a given ``CallbackList`` is
    used as it is; else one with a ``History`` (and Keras' progress bar)."""
    if isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks
    return _CallbackList(
        callbacks, add_history=True, add_progbar=add_progbar, model=model, **params)


def begin_training(model, callbacks, initial_epoch: int) -> int:
    """``on_train_begin`` as Keras' fit calls it; returns the epoch to
    start at: a callback may set ``model._initial_epoch`` there
    (``BackupAndRestore`` does)."""
    model.stop_training = False
    model._initial_epoch = None
    callbacks.on_train_begin()
    return model._initial_epoch or initial_epoch


def end_training(model, callbacks, epochs: int) -> None:
    """What Keras' fit does after its epochs: an optimizer with
    ``use_ema=True`` writes its moving averages into the weights
    (``finalize_variable_values``), then ``on_train_end``."""
    if isinstance(model.optimizer, keras.optimizers.Optimizer) and epochs > 0:
        model.optimizer.finalize_variable_values(model.trainable_weights)
    callbacks.on_train_end()


def _overrides_a_hook(callbacks, hooks, ignore=()) -> bool:
    """Whether one of ``callbacks`` (not of the ``ignore`` types) overrides
    one of ``hooks``: Keras marks the base class's empty hooks as default."""
    from keras.src.utils import python_utils  # pylint: disable=import-outside-toplevel

    return any(not python_utils.is_default(getattr(callback, hook))
               for callback in callbacks if not isinstance(callback, ignore)
               for hook in hooks)


def has_train_batch_hooks(callbacks: keras.callbacks.CallbackList) -> bool:
    """Whether a callback has a training-batch hook (else the Trainer may
    run the executions between log and save points back to back)."""
    if isinstance(callbacks, _CallbackList):
        return callbacks._train_batch_hooks
    return _overrides_a_hook(callbacks.callbacks, _TRAIN_BATCH_HOOKS)


def wants_batch_logs(callbacks: keras.callbacks.CallbackList) -> bool:
    """Whether a callback needs real logs at every training batch: one that
    overrides a batch-end hook. Keras' progress bar is not one: it shows
    the values of the last batch that had logs, so it does not force a
    read per batch."""
    return _overrides_a_hook(
        callbacks.callbacks, ("on_train_batch_end", "on_batch_end"),
        ignore=(keras.callbacks.ProgbarLogger, keras.callbacks.History))


def seed_generator_states(model: keras.Model) -> dict:
    """The state variables of the random layers' ``SeedGenerator``s (which
    ``tf.train.Checkpoint`` does not reach through the model), named by the
    layer's position in ``model`` and the generator's in the layer: stable
    for the same architecture, whatever Keras named the layers."""
    return {f"layer_{index}_seed_{number}": generator.state
            for index, layer in enumerate(model._flatten_layers(include_self=True))
            for number, generator in enumerate(getattr(layer, "_seed_generators", []))}


def all_layers(model: keras.Model) -> list:
    """Every layer inside ``model``, nested ones included (not the model)."""
    return list(model._flatten_layers(include_self=False))


def build_model_state(model: keras.Model, element_spec) -> None:
    """Creates model, compiled-loss, metric and optimizer variables.

    ``element_spec`` is a dataset's ``(x, y[, sample_weight])`` TensorSpecs;
    no data is read. Must run inside ``strategy.scope()`` so the variables
    become distributed variables.

    A model without ``call()`` whose layers are built (keras.io's GAN: two
    built sub-models, its own ``train_step``) cannot be run symbolically;
    on one device Keras leaves it to its first step, which builds what is
    left (its optimizers, in ``apply``): so does tfdist.
    """
    if type(model).call is keras.Model.call and all(
            layer.built for layer in model._flatten_layers(include_self=False)):
        model.built = True
    model._symbolic_build(data_batch=element_spec)


def compile_metrics(model: keras.Model):
    """The model's compiled metrics container (a Keras Metric), or None."""
    return model._compile_metrics


def flat_losses(model: keras.Model):
    """``[(path, loss_fn, loss_weight, name), ...]`` of the compiled loss.

    ``path`` indexes into the y / y_pred structure; ``loss_fn`` is a
    ``keras.losses.Loss`` whose ``call`` returns unreduced values.
    """
    compile_loss = model._compile_loss
    if compile_loss is None:
        return []
    return list(compile_loss._flat_losses)


def output_loss_metrics(model: keras.Model) -> list:
    """Keras' per-output ``<name>_loss`` Means (multi-output models only).

    Aligned with `flat_losses`; empty when the model has a single loss.
    """
    compile_loss = model._compile_loss
    if compile_loss is None or not compile_loss.built:
        return []
    return list(compile_loss.metrics)


# Batch statistics over real rows only -------------------------------------
#
# A padded batch (tfdist.data: "pad", and "exact" so that no replica is
# empty) must not move BatchNormalization's statistics. Keras computes them
# in two backend functions, `_compute_moments` (per replica) and
# `_compute_moments_sync` (synchronized: sums all-reduced over replicas).
# While `statistics_over_real_rows(mask)` is active in a thread (each
# replica traces its step in its own thread), moments over the batch axis
# weight each row by the mask; outside it Keras' functions run unchanged.

_ROW_MASK = threading.local()
_KERAS_MOMENTS = (_tf_nn._compute_moments, _tf_nn._compute_moments_sync)


def _row_weights(x, axes):
    mask = getattr(_ROW_MASK, "mask", None)
    if mask is None or 0 not in [a % x.shape.rank for a in axes]:
        return None
    shape = tf.concat([[-1], tf.ones([x.shape.rank - 1], tf.int32)], 0)
    return tf.reshape(tf.cast(mask, x.dtype), shape)


def _masked_sums(x, weights, axes):
    real = weights > 0
    total = tf.reduce_sum(tf.where(real, x, 0.0), axis=axes, keepdims=True)
    squares = tf.reduce_sum(tf.where(real, tf.square(x), 0.0), axis=axes, keepdims=True)
    count = tf.reduce_sum(weights * tf.ones_like(x), axis=axes, keepdims=True)
    return total, squares, count


def _finish(total, squares, count, axes, keepdims):
    mean = tf.math.divide_no_nan(total, count)
    variance = tf.maximum(tf.math.divide_no_nan(squares, count) - tf.square(mean), 0.0)
    if not keepdims:
        mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
    return mean, variance


def _moments(x, axes, keepdims):
    weights = _row_weights(x, axes)
    if weights is None:
        return _KERAS_MOMENTS[0](x, axes, keepdims)
    return _finish(*_masked_sums(x, weights, axes), axes, keepdims)


def _moments_sync(x, axes, keepdims):
    weights = _row_weights(x, axes)
    if weights is None or tf.distribute.get_replica_context() is None:
        return _KERAS_MOMENTS[1](x, axes, keepdims)
    # Three all-reduces, as Keras does (NCCL needs the same order everywhere).
    sums = [collectives.all_reduce_sum(value) for value in _masked_sums(x, weights, axes)]
    return _finish(*sums, axes, keepdims)


def _install_moments() -> None:
    """Puts the wrappers in place of Keras' two functions, once per process,
    on first use (never at import: ``import tfdist`` leaves Keras as it is)."""
    if _tf_nn._compute_moments is not _moments:
        _tf_nn._compute_moments = _moments
        _tf_nn._compute_moments_sync = _moments_sync


@contextlib.contextmanager
def statistics_over_real_rows(mask):
    """Within this block (in this thread), batch statistics skip rows where
    ``mask`` is 0. ``mask=None`` changes nothing."""
    if mask is not None:
        _install_moments()
    previous = getattr(_ROW_MASK, "mask", None)
    _ROW_MASK.mask = mask
    try:
        yield
    finally:
        _ROW_MASK.mask = previous


def _reuse_host_copy(self, object_map):
    """Keras' ``Variable._copy_trackable_to_cpu`` without its new variable:
    the host copy of the wrapped ``tf.Variable`` stands for the Keras one."""
    self.value._copy_trackable_to_cpu(object_map)  # pylint: disable=protected-access
    object_map[self] = object_map[self.value]


@contextlib.contextmanager
def host_copies_reused():
    """Within this block, background checkpoint saves copy Keras variables
    into the same host variables every time.

    Keras 3.15's ``Variable._copy_trackable_to_cpu`` makes a new
    ``tf.Variable`` on every call. TensorFlow's async checkpoint copies
    state in a ``tf.function``, which may create variables on its first
    trace only, so the third async save of a Keras model fails ("only
    supports singleton tf.Variables"). The wrapped variable's own copy
    (``ResourceVariable._copy_trackable_to_cpu``) is reused and assigned
    on each save, which is what the checkpoint needs.
    """
    from keras.src.backend.tensorflow import core  # pylint: disable=import-outside-toplevel

    original = core.Variable.__dict__["_copy_trackable_to_cpu"]
    core.Variable._copy_trackable_to_cpu = _reuse_host_copy  # pylint: disable=protected-access
    try:
        yield
    finally:
        core.Variable._copy_trackable_to_cpu = original  # pylint: disable=protected-access
