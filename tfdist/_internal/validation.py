"""Checks on what users hand the Trainer, each failing with an error that
names the argument, the value received and the fix."""

import keras
import tensorflow as tf

from tfdist._internal.keras import compiled as keras_compiled
from tfdist.errors import ConfigurationError


def positive_int(name: str, value, allow_none: bool = False, owner: str = "") -> None:
    """``owner`` (e.g. "tfdist.DataOptions") begins the message when given."""
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"{_prefix(owner)}`{name}` ({value!r}) must be a positive integer.")


def one_of(name: str, value, allowed, owner: str = "") -> None:
    if value not in allowed:
        raise ConfigurationError(
            f"{_prefix(owner)}`{name}` ({value!r}) must be one of {tuple(allowed)}.")


def _prefix(owner: str) -> str:
    return f"{owner}: " if owner else ""


def check_compiled(model) -> None:
    if not isinstance(model, keras.Model):
        raise ConfigurationError(
            f"`model` must be a keras.Model; got {type(model).__name__}."
        )
    if not getattr(model, "compiled", False) or model.optimizer is None:
        raise ConfigurationError(
            f"Model {model.name!r} is not compiled. Call `model.compile("
            "optimizer=..., loss=..., metrics=[...])` inside strategy.scope() "
            "before creating the Trainer."
        )


def check_created_in_scope(model, strategy) -> None:
    variables = list(model.variables)
    if model.optimizer.built:
        variables += list(model.optimizer.variables)
    for variable in variables:
        tf_variable = getattr(variable, "value", variable)
        if not strategy.extended.variable_created_in_scope(tf_variable):
            raise ConfigurationError(
                f"Variable {variable.path!r} of model {model.name!r} was "
                "created outside strategy.scope(). Build and compile the "
                "model inside `with strategy.scope():` so its variables are "
                "placed on every replica."
            )
    if _spans_workers(strategy):
        _check_metrics_created_in_scope(model, strategy)


def _spans_workers(strategy) -> bool:
    """Whether ``strategy``'s replicas run in more than one process."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    spec = strategy.cluster_resolver.cluster_spec().as_dict()
    return len(spec.get("chief", [])) + len(spec.get("worker", [])) > 1


def _check_metrics_created_in_scope(model, strategy) -> None:
    """A metric object made before the scope (at import, say) keeps its
    state in plain variables: Keras 3 metrics make them in ``__init__``.
    Across workers each process would then count its own examples only and
    report that, silently. (In one process the replicas add into the one
    copy, which is exact, so it is allowed there.)"""
    for metric in keras_compiled.metric_objects_given(model):
        if not metric_made_in_scope(metric, strategy):
            raise ConfigurationError(
                f"The metric {metric.name!r} given to {model.name!r}.compile was "
                "created outside strategy.scope(): its state would be each worker's "
                "own, and each worker would report its own examples' result. Create "
                "the metric inside `with strategy.scope():` (in the compile call "
                "there).")


def metric_made_in_scope(metric, strategy) -> bool:
    """Whether Keras ``metric``'s state variables were made under
    ``strategy``'s scope (a metric without variables yet: True)."""
    return all(strategy.extended.variable_created_in_scope(getattr(v, "value", v))
               for v in metric.variables)


def check_fit_arguments(epochs, steps_per_epoch, initial_epoch, validation_freq) -> None:
    """``fit``'s counts, each with its own error."""
    positive_int("epochs", epochs)
    positive_int("steps_per_epoch", steps_per_epoch, True)
    positive_int("validation_freq", validation_freq)
    if not isinstance(initial_epoch, int) or initial_epoch < 0:
        raise ConfigurationError(
            f"`initial_epoch` ({initial_epoch!r}) must be an integer >= 0: the "
            "epoch this call starts at (as in Keras, none run if it is >= epochs).")


def verbosity(verbose) -> int:
    """Keras' ``verbose``: 0, 1, 2 or "auto" (1)."""
    if verbose == "auto":
        return 1
    if verbose not in (0, 1, 2):
        raise ConfigurationError(
            f"`verbose` ({verbose!r}) must be 0 (silent), 1 (progress), 2 (one line per "
            "epoch) or 'auto' (1), as in Keras.")
    return int(verbose)
