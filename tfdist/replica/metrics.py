"""What gets reported: cross-replica metrics, reduced only when read.

Keras 3 metric variables are created ``synchronization=ON_READ,
aggregation=SUM``: inside ``strategy.run`` each replica adds to its own copy
(no communication per step), and reading a result outside replica context
sums the copies. Every built-in Keras metric keeps sums (total, count, true
positives, ...), so the sum of per-replica states equals the single-device
state on the same examples, and ``result()`` equals the single-device result.

`MetricState` holds the training loss (Keras' ``loss`` entry: the batch loss
weighted by the batch's example count), for multi-output models each output's
unweighted loss (Keras' ``<output>_loss`` entries, the same weighting), and
the model's compiled metrics.
``update`` runs in replica context every step; ``results`` runs in
cross-replica context only at log points and epoch ends.
"""

from typing import Any, Dict, NamedTuple, Optional, Tuple

import keras
import tensorflow as tf

from tfdist._internal import collectives, validation
from tfdist._internal.keras import compiled as keras_compiled
from tfdist.data.batch import require_batch
from tfdist.errors import ConfigurationError
from tfdist.replica import losses, output_loss_weights
from tfdist.replica.losses import LossParts


def reads_traced(strategy: Optional[tf.distribute.Strategy]) -> bool:
    """Whether results are read, and state reset, in traced functions under
    ``strategy``.

    Under MultiWorkerMirroredStrategy (any number of workers), each eager
    read of a replica-local variable is a collective with a new instance
    key, whose record TensorFlow keeps, so memory grows with every log
    point (docs/reliability.md#memory). An eager reset is such a read too
    (Keras' ``assign`` reads the variable back), as was the example count
    read for the progress line's rate (now in the same traced read). Under
    parameter servers each eager op is a remote call, and under
    MirroredStrategy an eager read sums every replica's copy op by op: in
    both a traced read is several times faster. On one device the eager
    read is the faster one, so it stays eager (figures:
    docs/performance.md#measurements-behind-design-choices).
    """
    return strategy is not None and (collectives.uses_instance_keys(strategy) or isinstance(
        strategy, (tf.distribute.experimental.ParameterServerStrategy,
                   tf.distribute.MirroredStrategy)))


class TracedReads:
    """Reads and resets of replica-local metric state, traced where eager
    ones cost (`reads_traced`); shared by `MetricState` and the user-step
    path's `tfdist.replica.keras_steps.KerasMetrics`.

    Subclasses give ``_result_tensors()`` (name -> tensor), ``_examples()``
    (the example count tensor), ``variables()`` and ``_reset_state()``.
    """

    def __init__(self, strategy: Optional[tf.distribute.Strategy]):
        traced = reads_traced(strategy)
        self._traced_read = collectives.function(self._read_tensors) if traced else None
        self._traced_reset = collectives.function(self._reset) if traced else None
        self._names = {}  # the results' order, per traced variable count

    def _read_tensors(self, num_variables: int):
        values = self._result_tensors()
        self._names[num_variables] = list(values)
        return values, tf.convert_to_tensor(self._examples())

    def results(self) -> Dict[str, float]:
        """Reduced results with Keras names (cross-replica context)."""
        if self._traced_read is None:
            return self._finish(
                {name: float(value) for name, value in self._result_tensors().items()})
        return self._read_traced()[0]

    def results_and_examples(self) -> Tuple[Dict[str, float], float]:
        """`results` and the examples counted since the last reset (all
        replicas), in one read (cross-replica context)."""
        if self._traced_read is None:
            return self.results(), float(tf.convert_to_tensor(self._examples()))
        return self._read_traced()

    def _read_traced(self) -> Tuple[Dict[str, float], float]:
        # Retraced when metrics gain variables (Keras builds them lazily).
        count = self._trace_key()
        values, examples = self._traced_read(count)
        return self._finish({name: float(values[name]) for name in self._names[count]}), float(
            examples)

    def _trace_key(self) -> int:
        """Changes whenever the state gains variables (the reads retrace)."""
        return len(self.variables())

    def _finish(self, values: Dict[str, float]) -> Dict[str, float]:
        """The results as reported, from what `_result_tensors` read."""
        return values

    def reset(self) -> None:
        """Zeroes every state variable (an epoch or evaluation starts)."""
        if self._traced_reset is None:
            self._reset_state()
        else:
            self._traced_reset(self._trace_key())

    def _reset(self, num_variables: int) -> None:
        del num_variables  # retraces the traced reset when metrics gain variables
        self._reset_state()


class MetricUpdate(NamedTuple):
    """One replica's view of one step, for `MetricState.update`.

    Attributes:
      loss: the replica's `tfdist.replica.losses.LossParts`.
      global_examples: real examples in the global batch (0 on an empty
        replica, which contributes nothing).
      local_examples: this replica's real examples.
      y, y_pred, sample_weight: its real rows (padding dropped:
        `without_padding`).
      phase: "train" or "test" (`tfdist.replica.output_loss_weights`).
    """

    loss: LossParts
    global_examples: tf.Tensor
    local_examples: tf.Tensor
    y: Any
    y_pred: Any
    sample_weight: Optional[tf.Tensor]
    phase: str = "train"


class MetricState(TracedReads):
    """The loss mean and compiled metrics of one model under one strategy.

    Create it inside ``strategy.scope()`` (the Trainer does).
    """

    def __init__(self, model: keras.Model, strategy: Optional[tf.distribute.Strategy] = None):
        self._loss = keras.metrics.Mean(name="loss")
        self._model = model
        self._first_batch_rows = output_loss_weights.FirstBatchRows(model)
        super().__init__(strategy)

    @property
    def _compiled(self):
        return keras_compiled.compile_metrics(self._model)

    def update(self, update: "MetricUpdate") -> None:
        """Adds one replica's view of one step (replica context).

        Summed over replicas, the loss total grows by ``(data_loss +
        regularization) * global_examples`` and the count by
        ``global_examples``: the example-weighted mean Keras reports; each
        output's loss by the batch's mean and its count by 1, the mean of
        batch means Keras 3 reports for per-output losses (times what the
        batch counts there: `tfdist.replica.output_loss_weights`).
        """
        data_loss_share, output_loss_shares, regularization = update.loss
        y, y_pred, sample_weight = update.y, update.y_pred, update.sample_weight
        global_examples = tf.cast(update.global_examples, tf.float32)
        local_examples = tf.cast(update.local_examples, tf.float32)
        self._loss.total.assign_add(
            data_loss_share * global_examples + regularization * local_examples
        )
        self._loss.count.assign_add(local_examples)
        # Per-output losses as Keras 3 reports them: the mean over batches of
        # each batch's mean (its trackers weigh a batch by its static size,
        # unknown in a traced step), so the replicas' shares sum to the
        # batch's mean and one replica counts the batch once.
        first_replica = tf.cast(_replica_id() == 0, tf.float32)
        output_means = keras_compiled.output_loss_metrics(self._model)
        if output_means:
            weight = self._first_batch_rows.batch_weight(update.phase, global_examples)
        for mean, share in zip(output_means, output_loss_shares):
            mean.total.assign_add(share * weight)
            mean.count.assign_add(first_replica * weight)
        if self._compiled is not None:
            self._compiled.update_state(y, y_pred, sample_weight)

    def _result_tensors(self) -> Dict[str, tf.Tensor]:
        values = {"loss": self._loss.result()}
        for mean in keras_compiled.output_loss_metrics(self._model):
            values[mean.name] = mean.result()
        if self._compiled is not None:
            values.update(self._compiled.result())
        return values

    def _examples(self) -> tf.Tensor:
        return self._loss.count

    def variables(self) -> Dict[str, tf.Variable]:
        """Every state variable, by a stable name (for checkpoints).

        Saved with the model, they let a run resumed mid-epoch report the
        same epoch loss and metrics as an uninterrupted run. They are
        replica-local sums; a checkpoint stores their totals, and restoring
        under any replica count spreads them so the totals match again.
        """
        metrics = [self._loss] + list(keras_compiled.output_loss_metrics(self._model))
        if self._compiled is not None:
            metrics.append(self._compiled)
        return state_variables(metrics)

    def _reset_state(self) -> None:
        self._loss.reset_state()
        for mean in keras_compiled.output_loss_metrics(self._model):
            mean.reset_state()
        if self._compiled is not None:
            self._compiled.reset_state()


def _replica_id():
    """This replica's index in its sync group (0 outside a replica context)."""
    context = tf.distribute.get_replica_context()
    return 0 if context is None else context.replica_id_in_sync_group


def state_variables(metrics) -> Dict[str, tf.Variable]:
    """The state variables of Keras ``metrics``, by a stable name (their
    position in the list and their path), for a checkpoint."""
    found = {}
    for index, metric in enumerate(metrics):
        for variable in metric.variables:
            key = f"{index}.{variable.path}".replace("/", ".")
            found[key] = getattr(variable, "value", variable)
    return found


# -- hand-written loops ------------------------------------------------------


def _require_replica_local(metric, function: str) -> None:
    """A metric updated in ``strategy.run`` must be created in the scope:
    outside it its variables are single copies that every replica writes."""
    if not tf.distribute.has_strategy():
        return  # no strategy: any metric works
    if not validation.metric_made_in_scope(metric, tf.distribute.get_strategy()):
        raise ConfigurationError(
            f"{function}: the metric {metric.name!r} was created outside "
            "`strategy.scope()`, so its state is not replica-local and the replicas' "
            "updates would not add up. Create it under `with strategy.scope():`.")


def without_padding(mask, y, y_pred, sample_weight):
    """Drops padded rows (``mask`` 0) before metrics see them; the Keras
    masks of ``y_pred``'s outputs lose the same rows and stay attached.

    A mask can not be passed to metrics as a sample weight: Keras applies
    sample weights only to ``weighted_metrics``, so plain ``metrics`` would
    count padded examples. Runs outside XLA, where dynamic shapes are fine.
    """
    if mask is None:
        return y, y_pred, sample_weight
    keep = tf.cast(mask, tf.bool)
    drop = lambda t: tf.boolean_mask(t, keep)  # noqa: E731

    def drop_output(output):
        # A Keras mask on an output (a sequence model's padded time steps)
        # is what its metrics skip: it loses the same rows and stays on.
        kept = drop(output)
        keras_mask = keras_compiled.get_keras_mask(output)
        if keras_mask is not None:
            keras_compiled.set_keras_mask(kept, drop(keras_mask))
        return kept

    return (
        tf.nest.map_structure(drop, y),
        tf.nest.map_structure(drop_output, y_pred),
        None if sample_weight is None else tf.nest.map_structure(drop, sample_weight),
    )


def update_metrics(metrics, batch, y_pred, weighted_metrics=()) -> None:
    """Updates Keras metrics with one replica's real rows (replica context).

    As in ``model.compile``: ``metrics`` ignore sample weights,
    ``weighted_metrics`` use ``batch.sample_weight``. Padded rows
    (``batch.mask``) are left out of both. Read ``metric.result()`` outside
    ``strategy.run`` (one reduction over replicas, when you log).

    Six examples in global batches of 4 on two replicas; the last batch is
    padded to 4 rows (``partial_batch="pad"``), and the padding counts
    nowhere: 3 of the 6 real rows are right.

    >>> import keras, tensorflow as tf, tfdist
    >>> strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    >>> with strategy.scope():
    ...     accuracy = keras.metrics.SparseCategoricalAccuracy()
    >>> def replica_step(batch):
    ...     predictions = tf.one_hot(tf.cast(batch.x[:, 0] > 0.5, tf.int32), 2)  # model(x)
    ...     tfdist.replica.metrics.update_metrics([accuracy], batch, predictions)
    >>> x, y = [[0.0], [1.0], [2.0], [3.0], [4.0], [5.0]], [1, 1, 1, 1, 0, 0]
    >>> dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    >>> loop = tfdist.loops.host_loop.HostLoop(strategy, replica_step, steps_per_execution=2)
    >>> _ = loop.run(iter(tfdist.data.distribute(strategy, dataset, partial_batch="pad")))
    >>> float(accuracy.result())
    0.5
    """
    batch = require_batch(batch, "update_metrics")
    for metric in list(metrics) + list(weighted_metrics):
        _require_replica_local(metric, "update_metrics")
    y, y_pred, sample_weight = without_padding(batch.mask, batch.y, y_pred, batch.sample_weight)
    for metric in metrics:
        metric.update_state(y, y_pred)
    for metric in weighted_metrics:
        metric.update_state(y, y_pred, sample_weight)


def update_loss_mean(mean: keras.metrics.Mean, per_example_loss, batch, model=None) -> None:
    """Adds one replica's part of the epoch ``loss`` Keras reports (the batch
    loss weighted by the batch's examples) to ``mean`` (replica context).

    Call it before ``apply_gradients``: Keras reports the loss of the
    weights the step started from (regularization losses included).

    Global batches of 4 and 2 examples, split over two replicas: the epoch's
    loss is the mean over all 6 examples, as Keras reports it on one device:

    >>> import keras, tensorflow as tf, tfdist
    >>> strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    >>> with strategy.scope():
    ...     loss_mean = keras.metrics.Mean(name="loss")
    >>> def replica_step(batch):
    ...     per_example = batch.x[:, 0]        # a loss with reduction=None in a real step
    ...     tfdist.replica.metrics.update_loss_mean(loss_mean, per_example, batch)
    >>> dataset = tf.data.Dataset.from_tensor_slices([[1.0], [2.0], [3.0], [4.0], [5.0], [6.0]])
    >>> dataset = dataset.map(lambda x: (x, 0)).batch(4)
    >>> loop = tfdist.loops.host_loop.HostLoop(strategy, replica_step, steps_per_execution=2)
    >>> _ = loop.run(iter(tfdist.data.distribute(strategy, dataset)))
    >>> float(loss_mean.result())
    3.5
    """
    batch = require_batch(batch, "update_loss_mean")
    _require_replica_local(mean, "update_loss_mean")
    data_share = losses.replica_loss(per_example_loss, batch)
    local = batch.real_examples()
    global_examples = batch.carried_global_examples()
    if global_examples is None:
        global_examples = collectives.all_reduce_sum(local)
    regularization = 0.0 if model is None else losses.regularization_loss(model)
    mean.total.assign_add(data_share * tf.cast(global_examples, tf.float32)
                          + regularization * local)
    mean.count.assign_add(local)


__all__ = ["update_loss_mean", "update_metrics"]
