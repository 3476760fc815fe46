"""How one replica trains or evaluates on one batch.

`ReplicaSteps` builds the per-replica functions that a runner passes to
``strategy.run``. A step:

1. runs the model on the replica's batch (which may be empty),
2. computes local loss sums and counts (`tfdist.losses`),
3. all-reduces the counts, so every replica divides by the GLOBAL count,
4. takes the gradient of its share and lets the optimizer SUM-reduce and
   apply the gradients,
5. adds its examples to the replica-local metric state (no communication).

With ``jit_compile=True`` steps 1, 2 and 4 (the forward and backward pass)
run as one XLA program. Collectives cannot run inside XLA on CPU/GPU
mirrored strategies, so the all-reduce happens first, on example counts
known from the data; the ``"pad"`` policy keeps XLA shapes static.
"""

import keras
import tensorflow as tf

from tfdist import losses
from tfdist.metrics import MetricState


def _unpack(batch: dict):
    return (
        batch["x"],
        batch["y"],
        batch.get("sample_weight"),
        batch.get("mask"),
    )


def _local_examples(batch: dict) -> tf.Tensor:
    """Real (unpadded) examples in the batch, as float32."""
    if "mask" in batch:
        return tf.reduce_sum(tf.cast(batch["mask"], tf.float32))
    first = tf.nest.flatten(batch["x"])[0]
    return tf.cast(tf.shape(first)[0], tf.float32)


def _without_padding(mask, y, y_pred, sample_weight):
    """Drops padded rows before metrics see them.

    A mask can not be passed to metrics as a sample weight: Keras applies
    sample weights only to ``weighted_metrics``, so plain ``metrics`` would
    count padded examples. Runs outside XLA, where dynamic shapes are fine.
    """
    if mask is None:
        return y, y_pred, sample_weight
    keep = tf.cast(mask, tf.bool)
    drop = lambda t: None if t is None else tf.boolean_mask(t, keep)  # noqa: E731
    return (
        tf.nest.map_structure(drop, y),
        tf.nest.map_structure(drop, y_pred),
        None if sample_weight is None else tf.nest.map_structure(drop, sample_weight),
    )


class ReplicaSteps:
    """Per-replica train and evaluation steps for a compiled Keras model."""

    def __init__(
        self, model: keras.Model, metrics: MetricState, *, jit_compile: bool
    ):
        self._model = model
        self._metrics = metrics
        self._jit_compile = jit_compile
        self._xla_forward_backward = tf.function(
            self._forward_backward, jit_compile=True, reduce_retracing=True
        )
        self._xla_forward = tf.function(
            lambda x: model(x, training=False), jit_compile=True,
            reduce_retracing=True,
        )

    @tf.autograph.experimental.do_not_convert
    def _forward_backward(self, x, y, sample_weight, mask, global_examples):
        """Forward + backward with denominators from the global example count."""
        model = self._model
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            terms = losses.compute_loss_terms(model, y, y_pred, sample_weight, mask)
            denominators = losses.example_count_denominators(terms, global_examples)
            shares = terms.output_shares(denominators)
            loss = terms.combine(shares) + losses.regularization_loss(model)
            scaled = model.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, model.trainable_variables)
        return gradients, loss, shares, y_pred

    # Like Keras' own step functions, no autograph: the step has no
    # tensor-dependent Python control flow, and user models run as written.
    @tf.autograph.experimental.do_not_convert
    def train(self, batch: dict) -> None:
        """One replica's training step on ``batch`` (replica context)."""
        model = self._model
        x, y, sample_weight, mask = _unpack(batch)
        local_examples = _local_examples(batch)
        if self._jit_compile:
            global_examples = losses.all_reduce_sum(local_examples)
            gradients, loss, shares, y_pred = self._xla_forward_backward(
                x, y, sample_weight, mask, global_examples
            )
        else:
            with tf.GradientTape() as tape:
                y_pred = model(x, training=True)
                terms = losses.compute_loss_terms(
                    model, y, y_pred, sample_weight, mask
                )
                counts = losses.all_reduce_sum(
                    tf.concat([terms.local_denominators(), [local_examples]], 0)
                )
                global_examples = counts[-1]
                shares = terms.output_shares(tf.stop_gradient(counts[:-1]))
                loss = terms.combine(shares) + losses.regularization_loss(model)
                scaled = model.optimizer.scale_loss(loss)
            gradients = tape.gradient(scaled, model.trainable_variables)
        model.optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        self._metrics.update(
            loss, shares, global_examples, local_examples,
            *_without_padding(mask, y, y_pred, sample_weight),
        )

    @tf.autograph.experimental.do_not_convert
    def evaluate(self, batch: dict) -> None:
        """One replica's evaluation step on ``batch`` (replica context)."""
        model = self._model
        x, y, sample_weight, mask = _unpack(batch)
        local_examples = _local_examples(batch)
        if self._jit_compile:
            y_pred = self._xla_forward(x)
        else:
            y_pred = model(x, training=False)
        terms = losses.compute_loss_terms(model, y, y_pred, sample_weight, mask)
        counts = losses.all_reduce_sum(
            tf.concat([terms.local_denominators(), [local_examples]], 0)
        )
        shares = terms.output_shares(counts[:-1])
        loss = terms.combine(shares) + losses.regularization_loss(model)
        self._metrics.update(
            loss, shares, counts[-1], local_examples,
            *_without_padding(mask, y, y_pred, sample_weight),
        )
