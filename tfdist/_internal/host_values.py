"""Numbers from the host handed to TensorFlow as numpy scalars.

TensorFlow's eager runtime caches the tensor it makes from a Python ``int``
or ``float`` scalar, keyed by the value, and does not evict it: ~0.6 KB per
distinct value (measured, one process: 24,000 ``tf.constant(i, tf.int64)``
with distinct ``i`` grew the resident memory by 13.7 MB; the same with
``np.int64(i)``, and 24,000 repeats of two fixed floats, by 0). A step number
or a loss value is new at every log point or save, so passing them as Python
numbers grew the chief of a 2-worker soak by ~2 KB per log point (the
summary step and two values) and every worker by ~1 KB per save (the
checkpoint's step counters). numpy scalars are converted, not cached.
"""

import numpy as np


def int64(value) -> np.int64:
    """``value`` as a numpy int64 (a step, an epoch, a count)."""
    return np.int64(value)


def float32(value) -> np.float32:
    """``value`` as a numpy float32 (a logged metric value)."""
    return np.float32(value)
