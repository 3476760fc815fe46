"""The optimizer's own clipping, and the loss scale it clips under.
User: `tfdist.replica.gradients`.
Tested with Keras 3.15; `tests/_internal/test_keras_contract.py` pins what it reads.
"""


def clip_gradients(optimizer, gradients: list) -> list:
    """Keras' own clipping (clipnorm / global_clipnorm / clipvalue) of ``gradients``."""
    return list(optimizer._clip_gradients(gradients))


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
