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
for a pipeline of its own).
"""

import dataclasses
import warnings
import weakref
from typing import List, NamedTuple, Optional

import tensorflow as tf

from tfdist._internal import collectives, replica_share
from tfdist._internal.keras import compiled as keras_compiled
from tfdist.data.batch import require_batch
from tfdist.errors import ConfigurationError

_MEAN_REDUCTIONS = ("sum_over_batch_size", "mean")


class LossParts(NamedTuple):
    """One replica's loss in the parts the metrics report.

    Attributes:
      data_share: this replica's share of the global batch's data loss (the
        replicas' shares sum to it; an empty replica's is 0).
      output_shares: the same per output, unweighted.
      regularization: the full regularization loss (`regularization_loss`).
    """

    data_share: tf.Tensor
    output_shares: List[tf.Tensor]
    regularization: tf.Tensor


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
    tree = keras_compiled.tree
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


def _output_terms(loss_fn, y_true, y_pred, sample_weight, example_mask, padded_rows):
    dtype = loss_fn.dtype or "float32"
    name = f"loss {loss_fn.name!r}"
    in_mask = keras_compiled.get_keras_mask(y_pred)
    values = loss_fn.call(tf.cast(y_true, dtype), tf.cast(y_pred, dtype))
    out_mask = keras_compiled.get_keras_mask(values)
    values = tf.convert_to_tensor(values)
    masks = [m for m in (in_mask, out_mask) if m is not None]
    if values.shape.rank == 0:
        values = _scalar_as_elements(loss_fn, values, y_pred, masks, padded_rows)
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


def _scalar_as_elements(loss_fn, scalar, y_pred, masks, padded_rows: bool) -> tf.Tensor:
    """A loss function's scalar result (``return ops.mean(...)``) as the
    value of each of the replica's elements: the mean over its rows, so
    that the replicas' shares, weighted by their rows, sum to the mean over
    the global batch (a warning says so, once per loss).

    Exact when the scalar is a mean of per-example terms, as the published
    contrastive and custom losses are; a term that couples examples across
    the batch (in-batch negatives, a batch-wide normalization, a ratio of
    the batch's sums) is computed within each replica's rows. Refused where
    padding rows stay in the batch (XLA's static shapes): the scalar would
    average them in.
    """
    if padded_rows:
        raise ConfigurationError(
            f"Loss {loss_fn.name!r} returns a scalar, and with jit_compile=True (or static "
            "shapes) a replica's batch keeps its padding rows, which the scalar would "
            "average in. Return one value per example (drop the final `ops.mean`), or use "
            "jit_compile=False.")
    if loss_fn not in _SCALAR_LOSSES_WARNED:  # (once per compiled loss)
        _SCALAR_LOSSES_WARNED.add(loss_fn)
        warnings.warn(
            f"Loss {loss_fn.name!r} returns a scalar, not one value per example: tfdist "
            "takes it as the mean over each replica's examples and weights each replica by "
            "its examples. That equals one device when the scalar is a mean of per-example "
            "terms (`ops.mean` of elementwise values); a term that couples examples across "
            "the batch is computed within each replica's rows. Return per-example values "
            "(without the final mean) to silence this.")
    # One value per example, or per element where a Keras mask says which count.
    shape = tf.shape(masks[0]) if masks else tf.shape(tf.nest.flatten(y_pred)[0])[:1]
    return tf.fill(shape, scalar)


_SCALAR_LOSSES_WARNED = weakref.WeakSet()


def compute_loss_terms(
    model, y, y_pred, sample_weight=None, example_mask=None, *, padded_rows: bool = False
) -> LossTerms:
    """Per-output local sums and counts of ``model``'s compiled loss.

    ``padded_rows``: the batch may keep padding rows (masked by
    ``example_mask``) that the model ran on (XLA's static shapes).
    """
    losses = keras_compiled.flat_losses(model)
    if not losses:
        raise ConfigurationError(
            "The model has no compiled loss. Call "
            "`model.compile(optimizer=..., loss=...)` before training."
        )
    y = _align_structure(y, y_pred)
    tree = keras_compiled.tree
    terms = LossTerms([], [], [], [], [], False)
    for path, loss_fn, loss_weight, _ in losses:
        weight = sample_weight
        if sample_weight is not None and tree.is_nested(sample_weight):
            weight = _resolve(sample_weight, path)
        numerator, denominator, per_example, reduction, masked = _output_terms(
            loss_fn, _resolve(y, path), _resolve(y_pred, path), weight,
            example_mask, padded_rows,
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


def example_count_denominators(terms: LossTerms, global_examples, *,
                               refusal: Optional[str] = None) -> tf.Tensor:
    """Global denominators derived from the global example count alone.

    Exact when `counts_follow_from_examples`; raises otherwise, with
    ``refusal`` (default: why XLA needs them).
    """
    if not counts_follow_from_examples(terms):
        raise ConfigurationError(refusal or (
            "jit_compile=True supports losses without Keras masks and with "
            "reduction 'sum_over_batch_size', 'mean' or 'sum'; use "
            "jit_compile=False for this model."))
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


def global_mean(values) -> tf.Tensor:
    """The mean of ``values`` over the GLOBAL batch, as a replica's loss.

    In a user's ``train_step`` run by tfdist, ``ops.mean(values)`` averages
    one replica's rows; ``global_mean(values)`` is the replica's term of the
    global mean (exact on uneven final batches too). Elsewhere (one device,
    plain Keras) it is ``ops.mean(values)``.

    >>> import tensorflow as tf, tfdist
    >>> float(tfdist.replica.global_mean(tf.constant([1.0, 2.0, 3.0])))
    2.0
    """
    mean = tf.reduce_mean(values)
    share = replica_share.current_share()
    if share is None:
        return mean
    return tf.math.multiply_no_nan(mean, tf.cast(share, mean.dtype))


__all__ = ["regularization_loss", "regularization_share", "replica_loss"]
