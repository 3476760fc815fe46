"""The optimizer's own clipping. User: `tfdist.replica.gradients`.
Tested with Keras 3.15; `tests/_internal/test_keras_contract.py` pins what it reads.
"""


def clip_gradients(optimizer, gradients: list) -> list:
    """Keras' own clipping (clipnorm / global_clipnorm / clipvalue) of ``gradients``."""
    return list(optimizer._clip_gradients(gradients))
