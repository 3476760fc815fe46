"""How one replica trains or evaluates on one batch.

`ReplicaSteps` builds the per-replica functions that a runner passes to
``strategy.run``. A step:

1. runs the model on the replica's batch (never empty: `tfdist.data` pads
   it, and masked rows count in no loss, metric or batch statistic),
2. computes local loss sums and counts (`tfdist.replica.losses`),
3. gets the GLOBAL counts: from the batch's ``global_examples`` column when
   the loss's denominators follow from example counts (no communication),
   else by an all-reduce,
4. takes the gradient of its share and lets the optimizer SUM-reduce and
   apply the gradients (clipping, if any, applies to the sum:
   `tfdist.replica.gradients`), or adds it to the accumulated sums when the
   optimizer accumulates (`tfdist.replica.accumulation`),
5. adds its examples to the replica-local metric state (no communication).

With ``jit_compile=True`` steps 1, 2 and 4 (the forward and backward pass)
run as one XLA program. Collectives cannot run inside XLA on CPU/GPU
mirrored strategies, so the global example count must be known before it:
from the data, or all-reduced first. The ``"pad"`` policy keeps XLA shapes
static.
"""

import functools
from typing import Any, NamedTuple

import keras
import tensorflow as tf

from tfdist._internal import collectives, replica_random
from tfdist._internal.keras import batch_statistics as keras_statistics, compiled as keras_compiled
from tfdist.data.batch import Batch
from tfdist.errors import ConfigurationError
from tfdist.replica import gradients as gradients_lib, loss_scaling, losses, own_compute_loss
from tfdist.replica.losses import LossParts
from tfdist.replica.metrics import MetricState, MetricUpdate, without_padding
from tfdist.strategies import sharded


class ForwardBackward(NamedTuple):
    """What `forward_backward` computed on one replica's batch."""

    gradients: list
    loss: LossParts
    global_examples: tf.Tensor
    y_pred: Any


def _global_denominators(terms, local_examples, data_global_examples):
    """(global denominators, global examples) for ``terms``.

    Decided at trace time: no collective when the data carries the count and
    the denominators follow from it.
    """
    if data_global_examples is not None and losses.counts_follow_from_examples(terms):
        return (
            losses.example_count_denominators(terms, data_global_examples),
            data_global_examples,
        )
    counts = collectives.all_reduce_sum(
        tf.concat([terms.local_denominators(), [local_examples]], 0)
    )
    return tf.stop_gradient(counts[:-1]), counts[-1]


def _replica_loss(model, terms, denominators, local_examples, global_examples):
    """(this replica's loss, its `LossParts`)."""
    shares = terms.output_shares(denominators)
    data_share = terms.combine(shares)
    regularization = losses.regularization_loss(model)
    share = losses.regularization_share(regularization, local_examples, global_examples)
    return data_share + share, LossParts(data_share, shares, regularization)


@tf.autograph.experimental.do_not_convert
def forward_backward(model, x, y, sample_weight, mask, global_examples, *,
                     count_only: bool = False, micro_batch: bool = False,
                     own_loss: bool = False, sources=None, variables=None) -> ForwardBackward:
    """Forward + backward of one replica's batch, its loss scaled by the
    GLOBAL counts: from ``global_examples`` (the batch's carried count, or
    None) when the loss's denominators follow from it, else all-reduced with
    the loss's own denominators (masks, per-output weights) after the
    forward pass, in one collective.

    ``count_only=True``: the denominators come from ``global_examples``
    alone, with no collective: what XLA compiles (collectives cannot run
    inside XLA on CPU/GPU mirrored strategies), the static-shape / TPU path
    and `tfdist.tpu.preflight`'s check of it.

    ``micro_batch=True``: ``x`` is one micro-batch of the replica's batch
    (its real rows) and ``global_examples`` the global batch's count; the
    denominators come from it alone, as with ``count_only``
    (`tfdist.parallel.pipeline`).

    ``own_loss=True`` (with ``micro_batch``): the loss is the model's own
    ``compute_loss`` (`tfdist.replica.own_compute_loss`).

    ``sources``: the tensors the gradients are of, one per trainable
    weight, instead of the weights (a pipeline's fully sharded weights,
    gathered once for all micro-batches: `tfdist.parallel.pipeline`).
    ``variables``: the variables the gradients are of, when not the
    model's trainable weights (a split weight's shards:
    `tfdist.parallel.plan.ModelPlan.trainable_variables`).
    """
    with tf.GradientTape() as tape:
        if sources is not None:
            tape.watch(sources)
        y_pred = model(x, training=True)
        local_examples = Batch(x, mask=mask).real_examples()
        if own_loss:
            parts = own_compute_loss.loss_parts(
                model, x, y, y_pred, sample_weight, rows=local_examples,
                global_examples=global_examples, training=True)
            loss = parts.data_share
        else:
            terms = losses.compute_loss_terms(model, y, y_pred, sample_weight, mask,
                                              padded_rows=count_only)
            if count_only or micro_batch:
                denominators = losses.example_count_denominators(
                    terms, global_examples,
                    refusal=_MICRO_BATCH_REFUSAL if micro_batch else None)
            else:
                denominators, global_examples = _global_denominators(
                    terms, local_examples, global_examples)
            loss, parts = _replica_loss(model, terms, denominators, local_examples,
                                        global_examples)
        scaled = model.optimizer.scale_loss(loss)
    if variables is None:
        variables = model.trainable_variables
    gradients = (tape.gradient(scaled, sources) if sources is not None
                 else sharded.gradients(tape, scaled, variables))
    return ForwardBackward(gradients, parts, global_examples, y_pred)


_MICRO_BATCH_REFUSAL = (
    "A Pipeline (tfdist.parallel.Pipeline) supports losses without Keras masks at the "
    "output and with reduction 'sum_over_batch_size', 'mean' or 'sum': each micro-batch's "
    "loss is divided by the batch's example count before the other micro-batches run. "
    "Drop the Pipeline for this model.")


def _with_masks(outputs):
    return outputs, keras_compiled.keras_masks(outputs)


class ReplicaSteps:
    """Per-replica train and evaluation steps for a compiled Keras model."""

    # Padding rows (masked) keep every replica's batch non-empty: oneDNN
    # convolutions fail on 0 rows, and masked rows count nowhere.
    avoid_empty_replicas = True

    def __init__(self, model: keras.Model, metrics: MetricState, *, jit_compile: bool, plan,
                 own_compute_loss: bool = False):
        """``plan``: how the model is split (`tfdist.parallel.plan.ModelPlan`;
        its null object, ``WHOLE``, runs each batch whole): every training
        step runs through it. ``own_compute_loss``: the model's own
        ``compute_loss`` runs in the plan's split (a pipeline's micro-batches,
        a tensor-parallel model's batch; without a split, the model's own
        step runs it: `tfdist.replica.keras_steps.KerasSteps`)."""
        if own_compute_loss and not plan.calls_own_compute_loss:
            raise ConfigurationError(
                "tfdist's step runs a model's own compute_loss in a split model only (a "
                "pipeline, tensor parallelism); without one, the model's own step "
                "(KerasSteps) runs it.")
        self._model = model
        self._plan = plan
        self._own_compute_loss = own_compute_loss
        self._metrics = metrics
        self._jit_compile = jit_compile
        # `tfdist.replica.accumulation`: set by `use_accumulator` once the model is built.
        self.accumulator = None
        self._xla_forward_backward = tf.function(
            self._forward_backward, jit_compile=True, reduce_retracing=True
        )
        # The outputs' Keras masks leave the XLA function as outputs of
        # their own (a function drops the attributes Keras keeps them in).
        self._xla_forward = tf.function(
            lambda x: _with_masks(model(x, training=False)), jit_compile=True,
            reduce_retracing=True,
        )

    def _rows(self, batch: Batch) -> Batch:
        """The rows the model runs on: without padding (batch-wide terms such
        as activity regularizers see real rows only), except under XLA,
        whose shapes stay as the data gives them (padding masked)."""
        return batch if self._jit_compile else batch.without_padding()

    @tf.autograph.experimental.do_not_convert
    def _forward_backward(self, x, y, sample_weight, mask, global_examples):
        return forward_backward(self._model, x, y, sample_weight, mask, global_examples,
                                count_only=True)

    @tf.autograph.experimental.do_not_convert
    def _whole_batch(self, batch: Batch, global_examples) -> ForwardBackward:
        """The forward and backward pass on the whole replica batch (the
        plan's without a split): under XLA with the global count known
        first (no collective inside XLA), else as `forward_backward` decides."""
        x, y, sample_weight, mask = batch.x, batch.y, batch.sample_weight, batch.mask
        if not self._jit_compile:
            return forward_backward(self._model, x, y, sample_weight, mask, global_examples,
                                    variables=self._plan.trainable_variables(self._model))
        if global_examples is None:
            global_examples = collectives.all_reduce_sum(batch.real_examples())
        return self._xla_forward_backward(x, y, sample_weight, mask, global_examples)

    # Like Keras' own step functions, no autograph: the step has no
    # tensor-dependent Python control flow, and user models run as written.
    @tf.autograph.experimental.do_not_convert
    def train(self, structure: dict) -> None:
        """One replica's training step on a `Batch` structure (replica context)."""
        batch = self._rows(Batch.from_structure(structure))
        with keras_statistics.statistics_over_real_rows(batch.mask), loss_scaling.agreement(), \
                replica_random.independent_draws():
            self._train(batch)

    @tf.autograph.experimental.do_not_convert
    def _train(self, batch: Batch) -> None:
        model = self._model
        y, sample_weight, mask = batch.y, batch.sample_weight, batch.mask
        local_examples = batch.real_examples()
        global_examples = batch.carried_global_examples()
        result = self._plan.forward_backward(
            model, batch, global_examples, whole=self._whole_batch,
            micro_batch=functools.partial(forward_backward, own_loss=self._own_compute_loss),
            own_compute_loss=self._own_compute_loss)
        if self.accumulator is None:
            gradients_lib.apply_gradients(
                model.optimizer, result.gradients, self._plan.trainable_variables(model))
        else:
            self.accumulator.add(result.gradients, result.global_examples)
        self._metrics.update(MetricUpdate(
            result.loss, result.global_examples, local_examples,
            *without_padding(mask, y, result.y_pred, sample_weight)))

    def use_accumulator(self, accumulator) -> None:
        """Gradients go to ``accumulator`` (`tfdist.replica.accumulation`;
        None: applied at every step)."""
        self.accumulator = accumulator

    def after_train_step(self) -> None:
        """Cross-replica, after each training step's ``strategy.run``:
        applies accumulated gradients when due (`tfdist.replica.accumulation`)."""
        if self.accumulator is not None:
            self.accumulator.after_step()

    @tf.autograph.experimental.do_not_convert
    def evaluate(self, structure: dict) -> None:
        """One replica's evaluation step on a `Batch` structure (replica context)."""
        batch = self._rows(Batch.from_structure(structure))
        model = self._model
        x, y, sample_weight, mask = batch.x, batch.y, batch.sample_weight, batch.mask
        local_examples = batch.real_examples()
        if self._jit_compile:
            y_pred = keras_compiled.with_keras_masks(*self._xla_forward(x))
        else:
            y_pred = model(x, training=False)
        if self._own_compute_loss:
            global_examples = batch.carried_global_examples()
            if global_examples is None:
                global_examples = collectives.all_reduce_sum(local_examples)
            parts = own_compute_loss.loss_parts(
                model, x, y, y_pred, sample_weight, rows=local_examples,
                global_examples=global_examples, training=False)
        else:
            terms = losses.compute_loss_terms(model, y, y_pred, sample_weight, mask,
                                              padded_rows=self._jit_compile)
            denominators, global_examples = _global_denominators(
                terms, local_examples, batch.carried_global_examples()
            )
            _, parts = _replica_loss(model, terms, denominators, local_examples,
                                     global_examples)
        self._metrics.update(MetricUpdate(
            parts, global_examples, local_examples,
            *without_padding(mask, y, y_pred, sample_weight), phase="test"))
