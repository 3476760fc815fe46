"""Weights kept as several variables whose gradients share one norm, for
Keras' ``clipnorm``.

Keras' ``clipnorm`` scales each weight's gradient by ``clipnorm /
max(norm, clipnorm)``, the norm of that weight's whole gradient. A weight
tensor parallelism keeps as shards (`tfdist.parallel.tensor_parallel`) is
updated shard by shard, so the optimizer sees one gradient per shard: each
shard's norm alone would clip the weight otherwise than one device does.
`share_one_norm` marks the shards as one weight's; `summed_squares` gives
`tfdist._internal.keras.optimizer.clip_slices` the whole weights' squared
norms from the shards' (each shard's sum of squares computed on its device,
only the scalars summed), so the clipped gradients are one device's.

Keras' ``apply`` clips the gradients it kept (those that are not None, of
variables it does not overwrite with their gradient), without their variables; `clipping` (around an ``apply``) says which
variables those are, and `clipped_variables` reads them back where the
clipping runs.

>>> import tensorflow as tf
>>> a, b, c = tf.Variable([3.0]), tf.Variable([4.0]), tf.Variable([1.0])
>>> share_one_norm([a, b])
>>> sums = summed_squares([a, b, c])
>>> sums(tf.constant([9.0, 16.0, 1.0])).numpy().tolist()      # a's and b's norm: 5
[25.0, 25.0, 1.0]
>>> summed_squares([c]) is None                                  # nothing shared
True
"""

import contextlib
import itertools
from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from tfdist._internal.thread_values import ThreadValue
from tfdist.errors import ConfigurationError

_GROUP = "_tfdist_norm_group"
_GROUPS = itertools.count()
_CLIPPED = ThreadValue()  # the variables of the `apply` running on this thread


def share_one_norm(variables: Sequence) -> None:
    """Marks ``variables`` (one weight's shards) as one weight for ``clipnorm``."""
    group = next(_GROUPS)
    for variable in variables:
        object.__setattr__(variable, _GROUP, group)


def group_of(variable) -> Optional[int]:
    """The weight ``variable`` is a shard of (`share_one_norm`), or None."""
    return getattr(variable, _GROUP, None)


def summed_squares(variables: Sequence) -> Optional[Callable]:
    """For gradients of ``variables`` (in order): a function from their
    squared norms (a vector) to their whole weights' squared norms (each
    shard's entry the sum over its weight's shards); None when no two of
    them share a weight."""
    keys = [group_of(v) for v in variables]
    if all(key is None for key in keys):
        return None
    index = {}
    ids = [index.setdefault(("shared", key) if key is not None else ("own", position),
                            len(index))
           for position, key in enumerate(keys)]

    def summed(squares):
        sums = tf.math.unsorted_segment_sum(squares, ids, len(index))
        return tf.gather(sums, ids)

    return summed


@contextlib.contextmanager
def clipping(gradients: Sequence, variables: Sequence):
    """Within the block (an optimizer's ``apply`` of ``gradients`` to
    ``variables``), `clipped_variables` gives the variables whose gradients
    Keras clips: those whose gradient is not None, as Keras keeps them."""
    kept = [v for g, v in zip(gradients, variables)
            if g is not None and not getattr(v, "overwrite_with_gradient", False)]
    with _CLIPPED.set_to(kept):
        yield


def clipped_variables(gradients: Sequence) -> Optional[List]:
    """The variables of ``gradients`` (what Keras' clipping got, inside
    `clipping`), or None outside an ``apply`` that said. Where Keras kept
    other gradients than `clipping` expected and some weight is kept as
    shards, an error: a shard's gradient would be clipped by its own norm."""
    variables = _CLIPPED.get()
    if variables is None:
        return None
    if len(variables) != len(gradients):
        if any(group_of(v) is not None for v in variables):
            raise ConfigurationError(
                f"clipnorm: the optimizer clips {len(gradients)} gradients, but tfdist "
                f"expected {len(variables)} (the weights with a gradient), so it cannot tell "
                "which shards form one weight, whose norm clipnorm takes. Use "
                "global_clipnorm (exact on split weights), or report this with the model.")
        return None
    return variables
