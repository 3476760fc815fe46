"""The one private of Keras' ``MultiHeadAttention`` tfdist replaces: its
``_compute_attention(query, key, value, ...)``, the attention between the
projections (scores, softmax, dropout, the weighted sum), which
`tfdist.parallel.sharded_attention` runs once per model device on that
device's heads. Keras documents it as the method to override for another
attention ("Users can override this function"); tfdist replaces it on
one layer (the instance), so ``MultiHeadAttention.call``'s check for a
subclass that overrides it still sees Keras' own and keeps its causal
fast path. Tested with Keras 3.15; `tests/_internal/test_keras_contract.py`
pins it.

>>> import keras
>>> layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3)
>>> replace_compute_attention(layer, lambda original: original)
>>> callable(layer._compute_attention)
True
"""

from typing import Callable

_METHOD = "_compute_attention"


def replace_compute_attention(layer, make: Callable[[Callable], Callable]) -> None:
    """``layer._compute_attention`` (a ``MultiHeadAttention``'s) replaced by
    ``make(the original bound method)``, on this instance only."""
    original = getattr(layer, _METHOD)
    object.__setattr__(layer, _METHOD, make(original))
