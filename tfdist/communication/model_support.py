"""What models fully sharded weights take (`tfdist.communication.FullySharded`):
the refusals that name why a model cannot be sharded and what to do."""

import keras

from tfdist._internal.keras import model_state
from tfdist.errors import ConfigurationError


def refuse_a_model_without_call(sharding, model) -> None:
    """A model without ``call()`` (keras.io's distiller, a GAN: sub-models
    and its own ``train_step``) has Keras build its optimizer in its first
    step, for whichever weights the step updates; the sharded state must be
    built before, for the model's trainable weights."""
    if type(model).call is keras.Model.call:
        raise ConfigurationError(
            f"communication={sharding!r}: {type(model).__name__} has no call() (its own "
            "train_step uses sub-models), so Keras builds its optimizer inside the first "
            "step, for the weights that step updates; sharded weights need their state "
            "built before. Drop FullySharded for this model, or give it a call().")


def refuse_an_unbuilt_model(sharding, model) -> None:
    """A model with no weights yet, attached by hand (`tfdist.attach` and
    `tfdist.Trainer` slice it when tfdist builds it)."""
    if not model_state.weights_built(model):
        raise ConfigurationError(
            f"communication={sharding!r} shards the model's weights, so the model must be "
            "built first: give it an Input (or call it once on a batch) before attaching.")
