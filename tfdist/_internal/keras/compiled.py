"""What ``model.compile`` made: the compiled losses and metrics, their
per-output trackers, the masks Keras attaches to outputs. Users:
`tfdist.replica` (losses, metrics), `tfdist.training` (attach, evaluate).
Tested with Keras 3.15 and 3.16; `tests/_internal/test_keras_contract.py` pins what it reads.
"""

import keras
import tensorflow as tf
from keras.src import tree  # noqa: F401  (keras_compiled.tree: Keras' nest utilities)
from keras.src.backend.common import masking, variables

from tfdist import versions

get_keras_mask = masking.get_keras_mask
set_keras_mask = masking.set_keras_mask


def autocast_scope():
    """The autocast scope a layer's call runs in (mixed precision: Keras
    casts float32 weights to the layer's compute dtype where they are read
    inside it), or None; `in_autocast_scope` enters it again."""
    return variables.get_autocast_scope()


def in_autocast_scope(scope):
    """A context in which weights are read as under ``scope`` (from
    `autocast_scope`): a layer's call computed again outside ``__call__``
    (`tfdist.communication.gather_units`) reads them as the first did."""
    import contextlib  # pylint: disable=import-outside-toplevel

    return contextlib.nullcontext() if scope is None else variables.AutocastScope(scope.dtype)


def keras_masks(outputs):
    """The Keras masks of ``outputs`` (a model's output structure), as a
    structure of the same shape: each output's mask, or None (tf.function
    drops the masks Keras attaches as attributes; `with_keras_masks` puts
    them back). ``tf.nest``: None is a leaf there, not an empty node."""
    return tf.nest.map_structure(get_keras_mask, outputs)


def with_keras_masks(outputs, masks):
    """``outputs`` with the masks `keras_masks` took from them attached again."""
    def attach(output, mask):
        if mask is not None:
            set_keras_mask(output, mask)
        return output
    return tf.nest.map_structure(attach, outputs, masks)


def flatten_metrics_in_order(model: keras.Model, logs: dict):
    """What Keras ``evaluate(return_dict=False)`` returns for ``logs``: a
    scalar for one entry, else a list in ``model.metrics_names`` order."""
    return model._flatten_metrics_in_order(logs)


def compile_identity(model: keras.Model) -> tuple:
    """Changes whenever ``model.compile`` runs again (new loss, metrics and
    optimizer objects), so a Trainer built for the old ones can be replaced."""
    return (id(model.optimizer), id(getattr(model, "_compile_loss", None)),
            id(getattr(model, "_compile_metrics", None)))


def compile_metrics(model: keras.Model):
    """The model's compiled metrics container (a Keras Metric), or None."""
    return model._compile_metrics


def metric_objects_given(model: keras.Model) -> list:
    """The ``keras.metrics.Metric`` objects the user passed to ``compile``
    (``metrics`` and ``weighted_metrics``; names such as ``"accuracy"``
    become objects only when Keras builds them, inside the model's scope)."""
    container = model._compile_metrics
    if container is None:
        return []
    given = keras.tree.flatten([container._user_metrics, container._user_weighted_metrics])
    return [metric for metric in given if isinstance(metric, keras.metrics.Metric)]


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


def _steps_on_batches_taken_in_python() -> bool:
    # Keras 3.16, with steps_per_execution=1, takes each batch from the
    # iterator in Python (``get_next_as_optional``) and runs its one-step
    # function on it: TensorFlow traces that function first on the first
    # batch's static shape (then once more, relaxed, on another), and an
    # epoch of unknown length ends before a step, not inside one. Keras
    # 3.15 ran the step on the iterator inside the function.
    return versions.minor_tuple(keras.__version__) >= (3, 16)


_STEPS_ON_BATCHES_TAKEN_IN_PYTHON = _steps_on_batches_taken_in_python()  # (chosen once)


def counts_a_step_more_on_unknown_length(model: keras.Model) -> bool:
    """Whether one-device Keras ``fit``, on data of unknown length, counts
    one optimizer iteration more per epoch than it trains: Keras 3.15 with
    ``steps_per_execution=1`` (the step that meets the end of the data
    counts); Keras 3.16 counts what it trains."""
    return (not _STEPS_ON_BATCHES_TAKEN_IN_PYTHON
            and getattr(model, "steps_per_execution", 1) == 1)


def output_loss_weighs_first_shape(model: keras.Model) -> bool:
    """Whether Keras' per-output ``<name>_loss`` trackers weigh a batch by
    its rows when it has the first batch's size (and other batches by 1).

    Keras weighs each batch's per-output loss by the step's static batch
    size, or by 1 where it is unknown. Keras 3.16 with
    ``steps_per_execution=1`` traces its step on the first batch's shape,
    so batches of that size weigh their rows; Keras 3.15, and 3.16 with
    more steps per execution (a loop over the iterator in the graph),
    count every batch once.
    """
    return _STEPS_ON_BATCHES_TAKEN_IN_PYTHON and getattr(model, "steps_per_execution", 1) == 1
