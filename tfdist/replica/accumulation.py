"""Exact gradient accumulation for Keras' ``optimizer.gradient_accumulation_steps``.

Keras 3 applies, every k-th step, the plain mean of the k micro-batches'
mean gradients, and counts every micro-batch in ``optimizer.iterations``.
That is one device's update on batch k·B only when every micro-batch is
full and the optimizer ignores its step count: a partial micro-batch
weighs as much as a full one, and Adam's bias correction (and any learning
rate schedule) sees k times more steps. Measured: 2.2e-2 off one device on
the equivalent large batches.

`GradientAccumulator` makes training with batch B and k steps equal one
device with batch k·B (and the epoch's last, smaller union):

- each replica adds ``C_m · g_m`` to replica-local sums, where ``g_m`` is
  the gradient of its share of micro-batch m's mean loss and ``C_m`` the
  micro-batch's global example count: over all replicas, that is the
  gradient of the SUM of the micro-batch's losses. ``C_m`` is added to a
  counter. No collective runs for this;
- at the k-th micro-batch, and at the end of an epoch (`flush`: a partial
  accumulation is applied, not carried into the next epoch), it applies
  ``sums / ΣC_m``, the gradient of the mean loss over the union of the
  micro-batches, through the optimizer's own update (with tfdist's exact
  clipping, `tfdist.replica.gradients`), then zeroes the sums;
- the model's regularization gradient is the same at every micro-batch
  (weights change only at updates), so weighted by ``C_m`` it comes back
  exactly once;
- the optimizer's step counter counts updates, as on one device with batch
  k·B. (Keras' ``optimizer.iterations`` property divides its counter by k
  whenever the option is set, so it reads updates // k here.)

Layers that update state in the forward pass (BatchNormalization's moving
statistics) still see micro-batches. A sparse gradient (an Embedding's) is
summed dense, as Keras' own accumulation does: exact for SGD and Lion, but
Adam-like optimizers square each entry of a sparse gradient before duplicate
ids are summed, so on one device with the k times larger batch an id looked
up several times counts each lookup in the squares, and here once: that
combination warns, naming the weight (`tfdist._internal.sparse_gradients`).
The sums live in the checkpoint, so a job stopped mid-accumulation resumes
exactly (also on another replica count: each replica restores an equal part
of the sum).

Under `tfdist.communication.FullySharded` each replica's gradient is its
own slice of the batch's gradient, already summed over the replicas (the
backward pass reduce-scatters it). The sums are then slices too: each
replica adds ``C_m`` times its slice into a variable of one slice's length
(so accumulation holds 1/N of the weights' bytes per replica, not a whole
copy), and the update applies the slices as a step's gradient. A
checkpoint saves the sums whole, in the weights' shapes, as the
optimizer's state is saved (`SumStorage`), so a job resumes on another
replica count or stage.
"""

import contextlib
import dataclasses
import warnings
from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from tfdist.errors import ConfigurationError
from tfdist._internal import collectives, sparse_gradients
from tfdist._internal.keras import model_state as keras_model_state, patches
from tfdist._internal.tensorflow import distributed_variables
from tfdist.replica import gradients as gradients_lib

# Set on an optimizer whose gradients are each replica's slices: the
# function that makes the accumulator's sums (`sums_in_slices`).
_SLICE_SUMS = "_tfdist_slice_sums"
# Set on an optimizer of a split model: how its sums are saved (`sums_saved_as`).
_SAVED_SUMS = "_tfdist_saved_sums"


@dataclasses.dataclass(frozen=True)
class SumStorage:
    """Where an accumulator keeps its gradient sums.

    Attributes:
      sums: one replica-local variable per weight (``ON_READ``), added to
        in replica context; each replica's component holds what that
        replica's gradient of the weight is (the whole weight's shape, or
        its slice under `tfdist.communication.FullySharded`).
      saved: what a checkpoint saves for each sum: the variable itself, or
        a view that saves the slices put together in the weight's shape.
    """

    sums: List[tf.Variable]
    saved: List[object]


def sums_in_slices(optimizer, make_sums: Callable[[Sequence], SumStorage]) -> None:
    """Marks ``optimizer`` as one whose gradients are each replica's slice
    of the batch's gradient, summed over the replicas
    (`tfdist.communication.FullySharded` calls it): an accumulator for it
    keeps the sums ``make_sums(weights)`` makes (module doc)."""
    object.__setattr__(patches.inner_optimizer(optimizer), _SLICE_SUMS, make_sums)


def sums_saved_as(optimizer, saved: Callable[[List[object]], List[object]]) -> None:
    """Marks ``optimizer`` as one whose weights are kept in parts (a
    tensor-parallel model's shards, `tfdist.parallel.split_optimizer`): an
    accumulator for it saves ``saved(each part's saved sum)``, one whole
    sum per weight, as an unsplit model's accumulator saves."""
    object.__setattr__(patches.inner_optimizer(optimizer), _SAVED_SUMS, saved)


def _whole_sums(variables, strategy) -> SumStorage:
    """One whole replica-local sum per weight, beside it (a tensor-parallel
    shard's on its model devices), saved as the total over the replicas
    (restored: an equal part on each)."""
    sums = []
    for variable in variables:
        storage = keras_model_state.tensorflow_variable(variable)
        placed = (distributed_variables.on_devices_of(strategy, storage)
                  if distributed_variables.is_distributed(storage)
                  else tf.device(storage.device))
        with placed:
            sums.append(tf.Variable(
                tf.zeros(variable.shape, variable.dtype), aggregation=tf.VariableAggregation.SUM,
                name="gradient_sum", trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ))
    return SumStorage(sums=sums, saved=list(sums))


def accumulation_steps(optimizer) -> Optional[int]:
    """Keras' ``gradient_accumulation_steps`` of ``optimizer`` (None: off)."""
    steps = getattr(optimizer, "gradient_accumulation_steps", None)
    if steps is None or steps == 1:
        return None
    if not isinstance(steps, int) or steps < 1:
        raise ConfigurationError(
            f"`gradient_accumulation_steps` ({steps!r}) must be a positive integer.")
    return steps


@contextlib.contextmanager
def _keras_accumulation_off(optimizer):
    """Keras reads the option when ``apply`` is traced; tfdist accumulates."""
    steps = optimizer.gradient_accumulation_steps
    optimizer.gradient_accumulation_steps = None
    try:
        yield
    finally:
        optimizer.gradient_accumulation_steps = steps


class GradientAccumulator:
    """Replica-local gradient sums, applied every ``steps`` micro-batches.

    Create under ``strategy.scope()`` once the model and optimizer are
    built. In a training loop: `add` in replica context (inside
    ``strategy.run``) in place of applying gradients, then `after_step` in
    cross-replica context (after ``strategy.run``, inside the loop's
    ``tf.function``); `flush` from the host at the end of an epoch. (The
    update all-reduces, so it runs in its own ``strategy.run`` under a
    cross-replica condition: TensorFlow cannot synchronise replicas inside
    a condition within a replica function.) `accumulator_for` makes one
    (with an example).
    """

    def __init__(self, strategy, optimizer, variables, steps: int):
        self._strategy = strategy
        self._optimizer = optimizer
        self._variables = list(variables)
        self.steps = steps
        on_read = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_READ)
        inner = patches.inner_optimizer(optimizer)
        make_sums = getattr(inner, _SLICE_SUMS, None)
        storage = (make_sums(self._variables) if make_sums is not None
                   else _whole_sums(self._variables, strategy))
        saved = getattr(inner, _SAVED_SUMS, list)
        self._sums, self._saved_sums = list(storage.sums), list(saved(list(storage.saved)))
        self._examples = tf.Variable(0.0, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                                     name="examples", **on_read)
        # Counted in cross-replica context: the same on every replica and worker.
        self._micro_batches = tf.Variable(
            0, dtype=tf.int64, trainable=False, name="micro_batches",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self._flush = collectives.function(lambda: self._apply_when(self._micro_batches > 0))

    def variables(self) -> dict:
        """``{name: variable}`` for the checkpoint."""
        named = {f"sum_{i}": s for i, s in enumerate(self._saved_sums)}
        named.update(examples=self._examples, micro_batches=self._micro_batches)
        return named

    def add(self, gradients, global_examples) -> None:
        """Adds one micro-batch (replica context): this replica's gradient
        share and the batch's global example count."""
        count = tf.cast(global_examples, tf.float32)
        for total, gradient, variable in zip(self._sums, gradients, self._variables):
            if isinstance(gradient, tf.IndexedSlices):
                self._warn_sparse(variable)
            if gradient is not None:
                with tf.device(total.device):  # (beside the sum: a shard's on its device)
                    total.assign_add(tf.convert_to_tensor(gradient) * tf.cast(count, total.dtype))
        self._examples.assign_add(count)

    def _warn_sparse(self, variable) -> None:
        """Warns (once per trace) where the summed form is not one device's."""
        if not sparse_gradients.form_matters(self._optimizer):
            return
        warnings.warn(
            f"Gradient accumulation sums the sparse gradient of `{variable.path}` dense "
            f"over its {self.steps} micro-batches (as Keras' own accumulation does), but "
            f"{type(self._optimizer).__name__} squares each entry of a sparse gradient "
            "before duplicate ids are summed: on one device with a batch "
            f"{self.steps} times larger, an id looked up several times counts each lookup "
            "in the squares, here once, so training is not the same (SGD and Lion are). "
            "For one device's result use a larger batch instead of "
            "gradient_accumulation_steps.", stacklevel=2)

    def after_step(self) -> None:
        """Counts the micro-batch; applies at the ``steps``-th (cross-replica)."""
        self._micro_batches.assign_add(1)
        self._apply_when(self._micro_batches >= self.steps)

    def flush(self) -> None:
        """Applies a partial accumulation (host side, on every worker)."""
        self._flush()

    def _apply_when(self, condition) -> None:
        def apply():
            self._strategy.run(self._apply)
            self._micro_batches.assign(0)

        tf.cond(condition, apply, lambda: None)

    def _apply(self) -> None:
        examples = tf.maximum(self._examples.read_value(), 1.0)
        gradients = []
        for total in self._sums:
            with tf.device(total.device):
                gradients.append(total.read_value() / tf.cast(examples, total.dtype))
        with _keras_accumulation_off(self._optimizer):
            gradients_lib.apply_gradients(self._optimizer, gradients, self._variables)
        for total in self._sums:
            total.assign(tf.zeros_like(total))
        self._examples.assign(0.0)


def accumulator_for(model, strategy, variables=None) -> Optional[GradientAccumulator]:
    """The accumulator the model's optimizer asks for (None: it does not).
    Call under ``strategy.scope()`` once the model and optimizer are built.
    ``variables``: what the step differentiates, in order (default: the
    model's trainable weights; a split model's shards,
    `tfdist.parallel.plan.ModelPlan.trainable_variables`).

    >>> import keras, tfdist
    >>> from tfdist.replica.accumulation import accumulator_for
    >>> strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    >>> with strategy.scope():
    ...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    ...     optimizer = keras.optimizers.SGD(0.1, gradient_accumulation_steps=3)
    ...     model.compile(optimizer=optimizer, loss="mse")
    ...     optimizer.build(model.trainable_variables)
    ...     accumulator = accumulator_for(model, strategy)
    >>> accumulator.steps, sorted(accumulator.variables())[-2:]
    (3, ['sum_0', 'sum_1'])
    """
    steps = accumulation_steps(model.optimizer)
    if steps is None:
        return None
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        raise ConfigurationError(
            f"`gradient_accumulation_steps` ({steps}) is not supported under "
            "ParameterServerStrategy: workers apply their steps independently. Use a "
            "global batch `gradient_accumulation_steps` times larger instead.")
    return GradientAccumulator(strategy, model.optimizer,
                               model.trainable_variables if variables is None else variables,
                               steps)


__all__ = ["GradientAccumulator", "accumulation_steps", "accumulator_for"]
