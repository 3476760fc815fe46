"""What a layer's ``trainable_weights`` lists while tfdist traces a model's
own step: each weight split over the model axis replaced by its shards
(`tfdist.parallel.tensor_parallel`), so a user's ``train_step`` written as
keras.io writes it differentiates and updates what its layers read.

keras.io's ``train_step`` takes ``tape.gradient(loss,
self.trainable_variables)`` and calls ``self.optimizer.apply(grads,
self.trainable_variables)`` (a GAN: ``self.discriminator.trainable_weights``).
A split weight's Keras variable is a view, read whole outside a step; in
the step its layer reads the shards instead, so a tape watching the view
would get no gradient, and the optimizer, built for the shards, would not
know it. Within `listed_as` (the trace of the model's own step, and
nothing else: ``get_weights``, saving and callbacks list the whole weights)
the two properties return ``replace(what Keras lists)``.

>>> import keras
>>> layer = keras.layers.Dense(2, name="d")
>>> layer.build((None, 3))
>>> with listed_as(lambda weights: weights[:1]):  # (tfdist's: each split weight's shards)
...     inside = [w.path for w in layer.trainable_weights]
>>> inside, [w.path for w in layer.trainable_weights]
(['d/kernel'], ['d/kernel', 'd/bias'])
"""

import contextlib
import threading
from typing import Callable

from tfdist._internal.keras import patches
from tfdist._internal.once import once

# Process-wide, not per thread: MirroredStrategy traces each replica's step
# in a thread of its own, which must see the replacement its caller set.
_ACTIVE = {"replace": None, "depth": 0}
_LOCK = threading.Lock()


@contextlib.contextmanager
def listed_as(replace: Callable[[list], list]):
    """Within the block every layer's ``trainable_weights`` and
    ``trainable_variables`` return ``replace(listed)``, ``listed`` being what
    Keras lists (module doc). Nested blocks must give the same ``replace``."""
    _install()
    with _LOCK:
        if _ACTIVE["depth"] and _ACTIVE["replace"] is not replace:
            raise RuntimeError("step_weights.listed_as: a block with another replacement "
                               "is open (two split models' steps traced at once).")
        _ACTIVE["replace"] = replace
        _ACTIVE["depth"] += 1
    try:
        yield
    finally:
        with _LOCK:
            _ACTIVE["depth"] -= 1
            if not _ACTIVE["depth"]:
                _ACTIVE["replace"] = None


def _listing(getter: Callable) -> Callable:
    def listed(layer):
        weights = getter(layer)
        replace = _ACTIVE["replace"]
        return weights if replace is None else replace(weights)
    return listed


@once
def _install() -> None:
    patches.wrap_trainable_weights(_listing)
