"""Numbers from the host handed to TensorFlow as numpy scalars.

TensorFlow's eager runtime caches the tensor it makes from a Python ``int``
or ``float`` scalar, keyed by the value, and does not evict it: memory per
distinct value, never freed (numpy scalars and repeats of one value keep
nothing). A step number or a loss value is new at every log point or save,
so passing them as Python numbers grew the chief at every log point (the
summary step and two values) and every worker at every save (the
checkpoint's step counters); figures: docs/reliability.md#memory. numpy
scalars are converted, not cached.
"""

import numpy as np


def int64(value) -> np.int64:
    """``value`` as a numpy int64 (a step, an epoch, a count)."""
    return np.int64(value)


def float32(value) -> np.float32:
    """``value`` as a numpy float32 (a logged metric value)."""
    return np.float32(value)
