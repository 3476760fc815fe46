"""Applying a replica's gradients, exactly, also when the optimizer clips.

Keras 3 clips gradients (``clipnorm``, ``global_clipnorm``, ``clipvalue``)
in ``optimizer.apply`` *before* it sums them across replicas. Under a
strategy each replica holds only its share of the batch's gradient, so
Keras clips the shares, and the weights move away from one device's
(figures: docs/guides/semantics.md#gradient-clipping).

`apply_gradients` sums the shares first (one all-reduce), clips the batch's
gradient as Keras would on one device, and hands each replica 1/N of the
clipped gradient. Keras' own clip then sees norms and values N times
smaller than the limits it already satisfies (a no-op), and its sum
restores the clipped gradient. Without clipping, or on one replica, this is
plain ``optimizer.apply_gradients`` (no extra collective).
"""

import tensorflow as tf

from tfdist._internal import collectives, replica_share, sparse_gradients
from tfdist._internal.keras import norm_groups, optimizer as keras_optimizer, patches


_CLIPS_SLICES = "_tfdist_clips_slices"
_CLIPS_BATCHES = "_tfdist_clips_batches"


def optimizer_clips(optimizer) -> bool:
    """Whether the optimizer clips gradients (any of Keras' three options)."""
    return any(getattr(optimizer, name, None) for name in
               ("clipnorm", "global_clipnorm", "clipvalue"))


def apply_gradients(optimizer, gradients, variables) -> None:
    """``optimizer.apply_gradients`` for one replica's gradient shares, with
    clipping applied to the sum over replicas (call in replica context).

    Two replicas hold 1.5 each of a gradient of 3.0; ``global_clipnorm=1.0``
    clips the sum to 1.0, as one device would (Keras alone clips each share
    to 1.0 and applies 2.0):

    >>> import keras, tensorflow as tf, tfdist
    >>> strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    >>> with strategy.scope():
    ...     layer = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
    ...     layer.build((None, 1))
    ...     optimizer = keras.optimizers.SGD(learning_rate=1.0, global_clipnorm=1.0)
    ...     optimizer.build(layer.trainable_variables)
    >>> def replica_step():
    ...     shares = [tf.constant([[1.5]])]
    ...     tfdist.replica.gradients.apply_gradients(optimizer, shares, layer.trainable_variables)
    >>> tf.function(lambda: strategy.run(replica_step))()
    >>> layer.kernel.numpy().tolist()
    [[-1.0]]
    """
    replica_share.install()  # (sparse gradients reduce to one device's form)
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    gradients, variables = list(gradients), list(variables)
    clipping = patches.inner_optimizer(optimizer)
    if replicas > 1 and optimizer_clips(clipping) and not clips_slices(clipping):
        clipped = _clipped_as_one_device(optimizer, clipping, _batch_gradients(gradients),
                                         variables)
        gradients = [g if sparse_gradients.is_whole(g)
                     else sparse_gradients.scaled_gradient(g, 1.0 / replicas) for g in clipped]
    optimizer.apply_gradients(zip(gradients, variables))


def clip_batches_in_apply(optimizer) -> None:
    """Makes ``optimizer.apply`` clip the batch's gradient, as one device
    does, where a model's own ``train_step`` (or Keras' ``train_step`` around
    a ``compute_loss`` override) calls it in a replica: tfdist runs that step
    as written (`tfdist.replica.keras_steps`), so it cannot pass through
    `apply_gradients`. The optimizer's clipping then sums the replicas'
    shares first (one all-reduce), clips the sum with Keras' rule and
    returns each replica's part of it, which Keras' own all-reduce sums
    again. Outside a replica, or on one, it is Keras' clipping; an
    optimizer that does not clip is left as it is. (A LossScaleOptimizer:
    its inner optimizer clips, after the loss scale is divided out.)

    Clipping tfdist gave the optimizer before (a split model's, under each
    gradient's device and by each split weight's whole norm:
    `tfdist.parallel.stage_updates`) clips the batch's gradient here in
    Keras' place; clipping of slices already summed over the replicas
    (`clip_slices_in_apply`) is left as it is."""
    clipping = patches.inner_optimizer(optimizer)
    if not optimizer_clips(clipping) or clips_slices(clipping) or \
            getattr(clipping, _CLIPS_BATCHES, False):
        return
    earlier = getattr(clipping, patches.GRADIENT_CLIP) \
        if patches.has_own_method(clipping, patches.GRADIENT_CLIP) else None

    def clip_as_before(self, gradients):
        if earlier is None:
            return keras_optimizer.clip_gradients(self, gradients)
        return list(earlier(gradients))

    def clip(self, gradients):
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return clip_as_before(self, gradients)
        # A user's step's gradients carry the factor N its loss does, and
        # the all-reduce multiplies their sum by `gradient_scale` (1/N).
        scale = replica_share.gradient_scale()
        batch = [sparse_gradients.scaled_gradient(g, scale)
                 for g in _batch_gradients(list(gradients))]
        clipped = clip_as_before(self, batch)
        share = 1.0 / (context.num_replicas_in_sync * scale)
        return [g if g is None or sparse_gradients.is_whole(g)
                else sparse_gradients.scaled_gradient(g, share) for g in clipped]

    patches.replace_clipping_of(clipping, clip)
    object.__setattr__(clipping, _CLIPS_BATCHES, True)


def clip_slices_in_apply(optimizer) -> None:
    """Makes ``optimizer.apply`` clip the batch's gradient where each
    replica's gradient is its own slice of the batch's, already summed over
    the replicas (`tfdist.communication.FullySharded`: the backward pass
    reduce-scatters, and the optimizer updates each replica's slice of each
    weight). A norm is then a sum over the replicas' slices: one all-reduce
    of one number per weight, and Keras' rule with the whole norms
    (`tfdist._internal.keras.optimizer.clip_slices`; a weight split over
    the model axis takes the norm summed over its shards,
    `tfdist._internal.keras.norm_groups`); ``clipvalue`` clips
    each element, with no collective. `apply_gradients` and a model's own
    step then leave the clipping to it. (A LossScaleOptimizer: its inner
    optimizer clips, after the loss scale is divided out.)"""
    clipping = patches.inner_optimizer(optimizer)
    if not optimizer_clips(clipping):
        return

    def clip(self, gradients):
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return keras_optimizer.clip_gradients(self, gradients)
        gradients = list(gradients)
        # (the model axis too: a weight's shards share its norm, `norm_groups`)
        variables = norm_groups.clipped_variables(gradients)
        shared = None if variables is None else norm_groups.summed_squares(variables)

        def whole_norms(squares):
            squares = collectives.all_reduce_sum(squares)
            return squares if shared is None else shared(squares)

        return keras_optimizer.clip_slices(self, gradients, whole_norms, placed=True)

    patches.replace_clipping_of(clipping, clip)
    object.__setattr__(clipping, _CLIPS_SLICES, True)


def clips_slices(optimizer) -> bool:
    """Whether `clip_slices_in_apply` made ``optimizer`` clip slices."""
    return getattr(optimizer, _CLIPS_SLICES, False)


def _clipped_as_one_device(optimizer, clipping, gradients, variables):
    """The batch's ``gradients`` clipped by ``clipping`` (the optimizer, or a
    LossScaleOptimizer's inner one, which clips the gradients after the loss
    scale is divided out: so do these, then multiply it back)."""
    scale = keras_optimizer.loss_scale(optimizer)
    if scale is None:
        return _clipped(clipping, gradients, variables)
    unscaled = [g is not None and not keras_optimizer.keeps_gradient_unscaled(v)
                for g, v in zip(gradients, variables)]

    def times(factor, values):
        return [sparse_gradients.scaled_gradient(g, factor) if u else g
                for g, u in zip(values, unscaled)]

    return times(scale, _clipped(clipping, times(1.0 / scale, gradients), variables))


def _clipped(clipping, gradients, variables):
    """Keras' clipping of ``gradients``; ``clipnorm`` of a weight kept as
    shards by the whole weight's norm (`tfdist._internal.keras.norm_groups`)."""
    summed = None
    if (clipping.clipnorm or 0) > 0:
        summed = norm_groups.summed_squares(
            [v for g, v in zip(gradients, variables) if g is not None])
    if summed is None:
        return keras_optimizer.clip_gradients(clipping, gradients)
    return keras_optimizer.clip_slices(clipping, list(gradients), summed, placed=True)


def _batch_gradients(gradients):
    """The global batch's gradients from every replica's shares, as one
    device holds them: dense ones summed (one all-reduce); sparse ones
    (an ``Embedding``'s ``IndexedSlices``) in one device's form
    (`tfdist._internal.sparse_gradients.combine`: Keras clips those by their
    values, an id repeated in the batch counting once per occurrence),
    marked whole, so that the optimizer's all-reduce applies them as they are."""
    context = tf.distribute.get_replica_context()
    dense = [g for g in gradients if g is not None and not isinstance(g, tf.IndexedSlices)]
    summed = iter(collectives.all_reduce_sum(dense) if dense else [])
    totals = []
    for gradient in gradients:
        if gradient is None:
            totals.append(None)
        elif isinstance(gradient, tf.IndexedSlices):
            totals.append(sparse_gradients.mark_whole(sparse_gradients.combine(gradient, context)))
        else:
            totals.append(next(summed))
    return totals


__all__ = ["apply_gradients", "optimizer_clips"]
