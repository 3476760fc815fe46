"""Checks on what users hand the Trainer, each failing with an error that
names the argument, the value received and the fix."""

import keras

from tfdist.errors import ConfigurationError


def positive_int(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"`{name}` ({value!r}) must be a positive integer.")


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
