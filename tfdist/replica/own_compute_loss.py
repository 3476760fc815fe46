"""A model's own ``compute_loss``, run by tfdist's step on micro-batches
(`tfdist.parallel.Pipeline`).

A model that overrides only ``compute_loss`` (keras.io's "Customizing
what happens in fit()": a penalty added to Keras' loss) keeps its loss as
written under a pipeline: each micro-batch's ``compute_loss`` value is
weighted by the micro-batch's share of the batch, ``n_mb / G`` (0 for an
empty micro-batch), and the weighted values add up to the batch's loss.

Under a strategy with several replicas (a pipeline per replica) Keras'
reductions inside the override are not divided by the replica count, as
Keras does for its own step: the rows' share already weighs the value.

That equals one device when the override's value is a mean over the rows
it is given: Keras' compiled losses with reduction ``"sum_over_batch_size"``
or ``"mean"``, regularizers and ``add_loss`` terms (which Keras adds inside
``compute_loss``), and the override's own means (``ops.mean`` over its
``y_pred``). What would not be (a compiled loss reduced by ``"sum"`` or
``"mean_with_sample_weight"``, a Keras mask at the output, per-output losses
of a multi-output model, whose trackers Keras would update once per
micro-batch) is refused with an error naming it. A term the override
computes across the batch's rows in another way (a batch variance) is
computed within each micro-batch.

>>> import keras, numpy as np, tensorflow as tf, tfdist
>>> devices = tfdist.strategies.configure_logical_cpus(2)  # (before other TensorFlow work)
>>> class Penalized(keras.Model):
...     def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
...         loss = super().compute_loss(x, y, y_pred, sample_weight, training)
...         return loss + 0.1 * tf.reduce_mean(tf.square(y_pred))
>>> inputs = keras.Input((4,))
>>> hidden = keras.layers.Dense(8, name="first")(inputs)
>>> model = Penalized(inputs, keras.layers.Dense(1, name="second")(hidden))
>>> model.compile(optimizer="sgd", loss="mse")
>>> model = tfdist.attach(model, parallel=tfdist.parallel.Pipeline(cuts=["first"],
...                                                                 micro_batches=3))
>>> history = model.fit(np.ones((10, 4)), np.ones((10, 1)), batch_size=10, verbose=0)
"""

import tensorflow as tf

from tfdist._internal import replica_share
from tfdist._internal.keras import compiled as keras_compiled
from tfdist.errors import ConfigurationError
from tfdist.replica.losses import LossParts

_ROW_MEAN_REDUCTIONS = ("sum_over_batch_size", "mean")


def check(model, y_pred) -> None:
    """Refuses what a micro-batch's ``compute_loss`` cannot add up to the
    batch's loss from (module doc), naming it (trace time)."""
    compiled = keras_compiled.flat_losses(model)
    if len(compiled) > 1:
        _refuse(f"the model has {len(compiled)} compiled losses (one per output): Keras "
                "updates each output's loss tracker inside compute_loss, once per "
                "micro-batch, so the per-output losses reported would not be one device's")
    reductions = {getattr(loss_fn, "reduction", None) for _, loss_fn, _, _ in compiled}
    other = sorted(str(r) for r in reductions - set(_ROW_MEAN_REDUCTIONS))
    if other:
        _refuse(f"its compiled loss is reduced by {other}: not a mean over the rows, so "
                "the micro-batches' values weighted by their rows do not add up to the "
                "batch's")
    if any(mask is not None for mask in tf.nest.flatten(keras_compiled.keras_masks(y_pred))):
        _refuse("the model's output carries a Keras mask: compute_loss divides by the "
                "micro-batch's unmasked elements, not the batch's")


def _refuse(reason: str) -> None:
    raise ConfigurationError(
        f"A Pipeline cannot run this model's own compute_loss on micro-batches: {reason}. "
        "Drop the Pipeline for this model, or move the custom loss into the compiled "
        "loss (a keras.losses.Loss) or add_loss.")


def loss_parts(model, x, y, y_pred, sample_weight, *, rows, global_examples,
               training: bool) -> LossParts:
    """The model's own ``compute_loss`` on ``rows`` of the batch's
    ``global_examples``, as `LossParts`: its value weighted by ``rows / G``
    (0 for an empty micro-batch), whole in ``data_share`` (the override's
    value already holds Keras' regularization losses)."""
    check(model, y_pred)
    with replica_share.keras_losses_whole():  # (not divided by the replica count: weighed here)
        loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                  training=training)
    share = tf.math.divide_no_nan(tf.cast(rows, tf.float32),
                                  tf.cast(global_examples, tf.float32))
    return LossParts(tf.math.multiply_no_nan(tf.cast(loss, tf.float32), share), [],
                     tf.constant(0.0))
