"""What each replica adds: losses scaled by the true global example count.

On one device Keras computes a batch loss as
``sum(sample_weight * per_example_loss) / number_of_loss_elements`` plus the
model's regularization losses. Under a synchronous strategy the replica
gradients are SUMMED, so replica ``r`` must contribute

    sum_r(sample_weight * per_example_loss) / GLOBAL_count  +  reg / num_replicas

where GLOBAL_count comes with a global-batch dataset's data
(`tfdist.data.batch.Batch.with_global_count`) or is all-reduced across replicas. Dividing by the local batch
times the number of replicas (what ``tf.nn.compute_average_loss`` does
without ``global_batch_size``, and what Keras 3 ``fit`` effectively does) is
wrong whenever replicas hold different numbers of examples: a partial last
batch over-weights the short replicas. An empty replica contributes exactly
0 loss and 0 gradient (never NaN).

A hand-written loop calls `replica_loss` in its replica step, with the
step's `tfdist.Batch` (``tfdist.Batch.from_structure(element)`` for an
element of `tfdist.data.distribute`, or ``tfdist.Batch.from_element((x, y))``
for a pipeline of its own). ``scaled_loss`` is its deprecated former name
for the second case.
"""

import dataclasses
import warnings
from typing import List, Optional

import tensorflow as tf

from tfdist._internal import keras_internals as _keras
from tfdist.data.batch import Batch, require_batch
from tfdist.errors import ConfigurationError
from tfdist.replica import collectives

_MEAN_REDUCTIONS = ("sum_over_batch_size", "mean")


@dataclasses.dataclass
class LossTerms:
    """One replica's loss, before division by global counts.

    ``numerators[k]`` is output k's weighted local loss sum;
    ``denominators[k]`` its local count (None for ``reduction="sum"``),
    ``loss_weights[k]`` its compile-time weight (None for 1).
    """

    numerators: List[tf.Tensor]
    denominators: List[Optional[tf.Tensor]]
    loss_weights: List[Optional[float]]
    elements_per_example: List[int]
    reductions: List[str]
    masked: bool

    def local_denominators(self) -> tf.Tensor:
        """The denominators that exist, stacked for one all-reduce."""
        present = [d for d in self.denominators if d is not None]
        return tf.stack(present) if present else tf.zeros([0])

    def output_shares(self, global_denominators: tf.Tensor) -> List[tf.Tensor]:
        """Per output, this replica's share of its unweighted global loss."""
        shares = []
        index = 0
        for numerator, denominator in zip(self.numerators, self.denominators):
            share = numerator
            if denominator is not None:
                share = tf.math.divide_no_nan(share, global_denominators[index])
                index += 1
            shares.append(tf.cast(share, tf.float32))
        return shares

    def combine(self, shares: List[tf.Tensor]) -> tf.Tensor:
        """This replica's share of the global data loss (see module doc)."""
        total = tf.constant(0.0)
        for share, weight in zip(shares, self.loss_weights):
            total = total + (share if weight is None else share * weight)
        return total


def _resolve(structure, path):
    for key in path:
        structure = structure[key]
    return structure


def _align_structure(y_true, y_pred):
    tree = _keras.tree
    if not tree.is_nested(y_pred):
        return y_true
    try:
        tree.assert_same_structure(y_pred, y_true)
        return y_true
    except (ValueError, TypeError):
        return tree.pack_sequence_as(y_pred, tree.flatten(y_true))


def _to_rank(tensor, values, name: str = "sample_weight", loss_name: str = "the loss"):
    """Squeezes trailing 1-dims or appends them so ``tensor`` (named
    ``name`` in errors) broadcasts against ``values`` along the leading
    (batch) dimensions."""
    original = tensor.shape
    while tensor.shape.rank > values.shape.rank and tensor.shape[-1] == 1:
        tensor = tf.squeeze(tensor, axis=-1)
    while tensor.shape.rank < values.shape.rank:
        tensor = tf.expand_dims(tensor, axis=-1)
    if tensor.shape.rank != values.shape.rank:
        raise ConfigurationError(
            f"`{name}` has shape {original}, which does not fit the per-example "
            f"values of {loss_name}, shape {values.shape}. Give `{name}` one value "
            f"per example (shape [batch]) or the values' shape ({values.shape})."
        )
    return tensor


def _output_terms(loss_fn, y_true, y_pred, sample_weight, example_mask):
    dtype = loss_fn.dtype or "float32"
    name = f"loss {loss_fn.name!r}"
    in_mask = _keras.get_keras_mask(y_pred)
    values = loss_fn.call(tf.cast(y_true, dtype), tf.cast(y_pred, dtype))
    out_mask = _keras.get_keras_mask(values)
    values = tf.convert_to_tensor(values)
    if values.shape.rank == 0:
        raise ConfigurationError(
            f"Loss {loss_fn.name!r} returned a scalar; tfdist needs per-example "
            "values (a Loss whose `call` returns shape [batch, ...])."
        )
    masks = [m for m in (in_mask, out_mask) if m is not None]
    reduction = loss_fn.reduction
    if reduction not in _MEAN_REDUCTIONS + ("mean_with_sample_weight", "sum"):
        raise ConfigurationError(
            f"Loss {loss_fn.name!r} has reduction {reduction!r}; tfdist "
            "supports 'sum_over_batch_size', 'mean', 'mean_with_sample_weight' "
            "and 'sum'."
        )
    if not masks and example_mask is None:
        # The common case, kept to a few ops: every element is valid.
        valid = None
        weights = (
            None if sample_weight is None
            else _to_rank(tf.cast(sample_weight, values.dtype), values, loss_name=name)
        )
        numerator = tf.reduce_sum(values if weights is None else values * weights)
    else:
        valid = tf.ones_like(values)
        for mask in masks:
            valid = valid * _to_rank(tf.cast(mask, values.dtype), values, "Keras mask", name)
        if example_mask is not None:
            valid = valid * _to_rank(
                tf.cast(example_mask, values.dtype), values, "padding mask", name)
        weights = valid
        if sample_weight is not None:
            weights = valid * _to_rank(
                tf.cast(sample_weight, values.dtype), values, loss_name=name)
        # `where` keeps NaN/inf from padded or masked entries out of the sum.
        numerator = tf.reduce_sum(tf.where(weights != 0, values * weights, 0.0))
    if reduction in _MEAN_REDUCTIONS:
        denominator = (
            tf.cast(tf.size(values), values.dtype) if valid is None
            else tf.reduce_sum(valid)
        )
    elif reduction == "mean_with_sample_weight":
        denominator = (
            tf.cast(tf.size(values), values.dtype) if weights is None
            else tf.reduce_sum(weights * tf.ones_like(values))
        )
    else:
        denominator = None
    per_example = 1
    for dim in values.shape[1:]:
        per_example *= dim if dim is not None else 1
    return numerator, denominator, per_example, reduction, bool(masks)


def compute_loss_terms(
    model, y, y_pred, sample_weight=None, example_mask=None
) -> LossTerms:
    """Per-output local sums and counts of ``model``'s compiled loss."""
    losses = _keras.flat_losses(model)
    if not losses:
        raise ConfigurationError(
            "The model has no compiled loss. Call "
            "`model.compile(optimizer=..., loss=...)` before training."
        )
    y = _align_structure(y, y_pred)
    tree = _keras.tree
    terms = LossTerms([], [], [], [], [], False)
    for path, loss_fn, loss_weight, _ in losses:
        weight = sample_weight
        if sample_weight is not None and tree.is_nested(sample_weight):
            weight = _resolve(sample_weight, path)
        numerator, denominator, per_example, reduction, masked = _output_terms(
            loss_fn, _resolve(y, path), _resolve(y_pred, path), weight,
            example_mask,
        )
        terms.numerators.append(numerator)
        terms.denominators.append(denominator)
        terms.loss_weights.append(loss_weight)
        terms.elements_per_example.append(per_example)
        terms.reductions.append(reduction)
        terms.masked = terms.masked or masked
    return terms


def counts_follow_from_examples(terms: LossTerms) -> bool:
    """True when every global denominator is global examples x elements.

    Keras masks and ``mean_with_sample_weight`` make denominators depend on
    the data's contents; then they must be all-reduced.
    """
    return not terms.masked and "mean_with_sample_weight" not in terms.reductions


def example_count_denominators(terms: LossTerms, global_examples) -> tf.Tensor:
    """Global denominators derived from the global example count alone.

    Exact when `counts_follow_from_examples`; raises otherwise.
    """
    if not counts_follow_from_examples(terms):
        raise ConfigurationError(
            "jit_compile=True supports losses without Keras masks and with "
            "reduction 'sum_over_batch_size', 'mean' or 'sum'; use "
            "jit_compile=False for this model."
        )
    counts = [
        tf.cast(global_examples, tf.float32) * per_example
        for per_example, denominator in zip(
            terms.elements_per_example, terms.denominators
        )
        if denominator is not None
    ]
    return tf.stack(counts) if counts else tf.zeros([0])


def regularization_loss(model) -> tf.Tensor:
    """``sum(model.losses)`` of this replica's forward pass (each replica
    adds its `regularization_share` to its loss)."""
    if not model.losses:
        return tf.constant(0.0)
    return tf.add_n([tf.cast(tf.reduce_sum(l), tf.float32) for l in model.losses])


def regularization_share(regularization, local_examples, global_examples) -> tf.Tensor:
    """This replica's part of the global batch's ``sum(model.losses)``:
    its own ``regularization`` weighted by its share of the global batch,
    ``n_r / G``.

    Exact, after the optimizers' gradient SUM, for both kinds of terms in
    ``model.losses``: a kernel regularizer is the same on every replica and
    the shares sum to 1; an activity regularizer (Keras divides it by the
    batch size) or a layer's ``add_loss(ops.mean(...))`` averages the
    replica's rows, and ``sum(n_r / G * mean_r)`` is the global batch's mean,
    on uneven batches too. An empty replica (its rows only padding) adds 0.
    (``1 / num_replicas``, the weight before, is exact for the first kind only.)

    >>> import tensorflow as tf, tfdist
    >>> shares = [tfdist.replica.losses.regularization_share(tf.constant(m), n, 5.0)
    ...           for m, n in ((2.0, 3.0), (7.0, 2.0), (9.0, 0.0))]   # means of 3, 2, 0 rows
    >>> round(float(tf.add_n(shares)), 6)      # (3 * 2 + 2 * 7) / 5
    4.0
    """
    regularization = tf.convert_to_tensor(regularization)
    share = tf.math.divide_no_nan(tf.cast(local_examples, regularization.dtype),
                                  tf.cast(global_examples, regularization.dtype))
    return regularization * share


def replica_loss(per_example_loss, batch, model=None) -> tf.Tensor:
    """This replica's share of the global batch's loss, from a `tfdist.Batch`.

    ``sum(sample_weight * mask * per_example_loss) / (global examples x loss
    elements per example)`` plus, with ``model``, its `regularization_share`
    (``sum(model.losses)`` x this replica's examples / global examples): what Keras computes on one device for the whole global
    batch (reduction "sum_over_batch_size"), split so that the optimizer's
    gradient SUM over replicas is exact. Padded rows (``batch.mask``) count
    nowhere; the global count comes with the batch (no collective) when the
    data carries it, else one all-reduce. An empty replica returns 0.

    Three examples over two replicas (2 and 1 rows); the replicas' shares
    sum to the global batch's mean, as one device computes it:

    >>> import tensorflow as tf, tfdist
    >>> strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    >>> dataset = tf.data.Dataset.from_tensor_slices(([[1.0], [2.0], [3.0]], [0, 0, 0])).batch(3)
    >>> def replica_step(element):
    ...     batch = tfdist.Batch.from_structure(element)
    ...     per_example = batch.x[:, 0]        # a loss with reduction=None in a real step
    ...     return tfdist.replica.losses.replica_loss(per_example, batch)
    >>> element = next(iter(tfdist.data.distribute(strategy, dataset)))
    >>> shares = strategy.run(replica_step, args=(element,))
    >>> float(strategy.reduce("sum", shares, axis=None))
    2.0
    """
    batch = require_batch(batch, "replica_loss")
    values = tf.convert_to_tensor(per_example_loss)
    if values.shape.rank == 0:
        raise ConfigurationError(
            f"`per_example_loss` is a scalar ({values}); replica_loss needs one value "
            "per example. Build the loss with reduction=None, e.g. "
            "keras.losses.SparseCategoricalCrossentropy(reduction=None)."
        )
    weights = None
    for name, weight in (("sample_weight", batch.sample_weight), ("padding mask", batch.mask)):
        if weight is not None:
            weight = _to_rank(tf.cast(weight, values.dtype), values, name)
            weights = weight if weights is None else weights * weight
    numerator = (tf.reduce_sum(values) if weights is None
                 else tf.reduce_sum(tf.where(weights != 0, values * weights, 0.0)))
    elements = 1
    for dim in values.shape[1:]:
        elements *= dim if dim is not None else 1
    global_examples = batch.carried_global_examples()
    if global_examples is None:
        global_examples = collectives.all_reduce_sum(batch.real_examples())
    loss = tf.math.divide_no_nan(
        numerator, tf.cast(global_examples, values.dtype) * float(elements))
    if model is not None:
        loss += tf.cast(regularization_share(regularization_loss(model), batch.real_examples(),
                                             global_examples), values.dtype)
    return loss


def scaled_loss(per_example_loss, sample_weight=None, global_count=None):
    """Deprecated: use `replica_loss` with a `tfdist.Batch`.

    ``scaled_loss(values, sample_weight)`` is
    ``replica_loss(values, tfdist.Batch.from_element((x, y, sample_weight)))``
    (the global count all-reduced); a known ``global_count`` of loss
    elements travels with the batch as ``global_examples``. This alias
    computes exactly what it did: the sum of ``sample_weight *
    per_example_loss`` over the global count of loss elements.

    >>> import warnings, tensorflow as tf, tfdist
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     loss = tfdist.replica.losses.scaled_loss(tf.constant([1.0, 3.0]), global_count=4)
    >>> float(loss), [w.category.__name__ for w in caught if "scaled_loss" in str(w.message)]
    (1.0, ['DeprecationWarning'])
    """
    warnings.warn(
        "tfdist.replica.losses.scaled_loss is deprecated; use "
        "tfdist.replica.losses.replica_loss(per_example_loss, batch) with the step's "
        "tfdist.Batch (tfdist.Batch.from_element((x, y, sample_weight)) for a pipeline "
        "of your own).", DeprecationWarning, stacklevel=2)
    values = tf.convert_to_tensor(per_example_loss)
    weights = None
    if sample_weight is not None:  # broadcast, then one row per loss element
        weights = _to_rank(tf.cast(sample_weight, values.dtype), values)
        weights = tf.reshape(tf.broadcast_to(weights, tf.shape(values)), [-1])
    values = tf.reshape(values, [-1])
    count = None if global_count is None else tf.fill(
        tf.shape(values), tf.cast(global_count, tf.float32))
    return replica_loss(values, Batch(values, sample_weight=weights, global_examples=count))
