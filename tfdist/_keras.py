"""The one place tfdist touches Keras 3 internals.

tfdist runs its own replica step instead of ``Model.train_step`` so it can
scale losses by the true global example count. To keep Keras semantics
(compiled losses, loss weights, masks, metric names) it reads a few private
attributes of a compiled Keras 3 model. They are gathered here so a Keras
upgrade breaks one small module, and `tests/test_keras_contract.py` pins them.
Tested with Keras 3.15.
"""

import keras
from keras.src import backend as keras_backend
from keras.src import tree

__all__ = [
    "build_model_state",
    "compile_metrics",
    "flat_losses",
    "get_keras_mask",
    "output_loss_metrics",
    "tree",
]

get_keras_mask = keras_backend.get_keras_mask


def build_model_state(model: keras.Model, element_spec) -> None:
    """Creates model, compiled-loss, metric and optimizer variables.

    ``element_spec`` is a dataset's ``(x, y[, sample_weight])`` TensorSpecs;
    no data is read. Must run inside ``strategy.scope()`` so the variables
    become distributed variables.
    """
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
