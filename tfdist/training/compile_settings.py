"""What ``model.compile`` owns, read once for `tfdist.Trainer` and `tfdist.attach`.

Keras' ``compile`` takes ``steps_per_execution`` and ``jit_compile``; tfdist
reads them there and nowhere else, so a program says each once, where Keras
users already say it.

>>> import keras, tfdist
>>> from tfdist.training import compile_settings
>>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
>>> model.compile(optimizer="sgd", loss="mse", steps_per_execution=4)
>>> compile_settings.read(model)
CompileSettings(steps_per_execution=4, jit_compile=False)
"""

import dataclasses
import warnings

import keras

from tfdist._internal import validation
from tfdist.replica.keras_steps import overridden


@dataclasses.dataclass(frozen=True)
class CompileSettings:
    """The step settings a compiled model carries.

    Attributes:
      steps_per_execution: steps run per host call in a device-side loop.
      jit_compile: XLA for the forward and backward pass (Keras' resolved
        value: ``"auto"`` is off on CPUs and under a distribution strategy).
    """

    steps_per_execution: int
    jit_compile: bool


def read(model: keras.Model) -> CompileSettings:
    """``model.compile``'s ``steps_per_execution`` and ``jit_compile``.

    A model with its own ``train_step`` / ``compute_loss`` runs its step as
    written, without XLA: ``jit_compile=True`` then warns (the numbers are
    the same; only the speed differs), as it cannot be honoured.
    """
    steps = 1 if model.steps_per_execution is None else model.steps_per_execution
    validation.positive_int("steps_per_execution", steps, owner="model.compile")
    jit_compile = bool(model.jit_compile)
    if jit_compile and overridden(model):
        warnings.warn(
            f"model.jit_compile is True, but {type(model).__name__} overrides "
            f"{', '.join(overridden(model))}: tfdist runs the model's own step without XLA.",
            stacklevel=3)
        jit_compile = False
    return CompileSettings(steps_per_execution=steps, jit_compile=jit_compile)
