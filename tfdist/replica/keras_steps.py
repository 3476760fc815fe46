"""The user's own Keras step, run by tfdist: ``train_step``, ``test_step``,
``compute_loss``, ``compute_metrics`` and ``metrics`` overrides.

A model that overrides any of `OVERRIDABLE` (keras.io, "Customizing what
happens in fit()": GANs, VAEs, custom weighting) trains through its own
``train_step`` and evaluates through its own ``test_step`` (Keras' default
ones when only ``compute_loss`` or ``metrics`` is overridden), run in every
replica by ``strategy.run`` on the replica's real rows (tfdist's padding is
removed first, so user code never sees it):

>>> import keras, tensorflow as tf
>>> class Custom(keras.Model):
...     def train_step(self, data):
...         x, y = data
...         with tf.GradientTape() as tape:
...             loss = self.compute_loss(y=y, y_pred=self(x, training=True))
...         grads = tape.gradient(loss, self.trainable_variables)
...         self.optimizer.apply(grads, self.trainable_variables)
...         ...

Losses are scaled as `tfdist._internal.replica_share` says: everything that
goes through Keras' loss reductions (``compute_loss``, ``add_loss``,
regularizers) and everything a ``compute_loss`` override returns is exact
against one device on any batches; a mean the user computes in their own
``train_step`` is exact on equal per-replica batches, and with
`tfdist.replica.global_mean` on uneven ones too.

Reported values are ``model.metrics``' results, reduced over replicas, as
Keras reports them at the end of an epoch. Scalars a step returns beside
them (keras.io's distillation: ``student_loss``) are reported as the last
step's row-weighted mean over the replicas, one device's value for a
per-row mean (`tfdist.replica.returned_values`, with a warning stating
that); other values it returns get a warning naming them.
"""

import contextlib
import warnings
from typing import Callable, Dict, Optional, Tuple

import keras
import tensorflow as tf

from tfdist._internal import collectives, replica_random, replica_share
from tfdist._internal.keras import model_state as keras_model_state, step_weights
from tfdist.data.batch import Batch
from tfdist.errors import ConfigurationError
from tfdist.replica import gradients as gradients_lib, loss_scaling, returned_values
from tfdist.replica.metrics import MetricState, state_variables, TracedReads
from tfdist.replica.step import ReplicaSteps

OVERRIDABLE = ("train_step", "test_step", "compute_loss", "compute_metrics", "metrics")


def overridden(model: keras.Model) -> Tuple[str, ...]:
    """The step methods ``model``'s class overrides (see `OVERRIDABLE`)."""
    return tuple(name for name in OVERRIDABLE
                 if getattr(type(model), name, None) is not getattr(keras.Model, name))


def _real_rows(batch: Batch):
    """(x, y, sample_weight) without tfdist's padding rows."""
    if batch.mask is None:
        return batch.x, batch.y, batch.sample_weight
    keep = batch.mask > 0
    strip = lambda t: None if t is None else tf.nest.map_structure(  # noqa: E731
        lambda leaf: tf.boolean_mask(leaf, keep), t)
    return strip(batch.x), strip(batch.y), strip(batch.sample_weight)


def keras_data(x, y, sample_weight):
    """What Keras hands ``train_step``: ``x`` alone for x-only data (a
    dataset of images, as keras.io's GAN reads it), ``(x, y)`` or ``(x, y, w)``."""
    if y is None:
        return x
    return (x, y) if sample_weight is None else (x, y, sample_weight)


class KerasMetrics(TracedReads):
    """``model.metrics`` (Keras' loss tracker, compiled metrics, the user's
    own trackers), read and reset as `tfdist.replica.metrics.MetricState`
    is; create it inside ``strategy.scope()``."""

    _UPDATED = "\0updated:"  # (a read's entry for a returned value's step count)

    def __init__(self, model: keras.Model, strategy: tf.distribute.Strategy):
        self._model = model
        self.examples = keras.metrics.Sum(name="examples")
        # Scalars the model's step returns beside its metrics, by key.
        self._returned: Dict[str, returned_values.LastStepMean] = {}
        super().__init__(strategy)

    def reported_names(self) -> set:
        """The names ``model.metrics`` report (their dict results' keys too)."""
        names = set()
        for metric in self._model.metrics:
            result = metric.result()
            names.update([metric.name, *(result if isinstance(result, dict) else [])])
        return names

    def returned(self, key: str) -> returned_values.LastStepMean:
        """The state of the returned value ``key``, made on first use (while
        the step is first traced, as Keras builds its compiled metrics)."""
        if key not in self._returned:
            self._returned[key] = returned_values.LastStepMean(key)
        return self._returned[key]

    def _result_tensors(self) -> Dict[str, tf.Tensor]:
        values = {}
        for metric in self._model.metrics:
            result = metric.result()
            values.update(result if isinstance(result, dict) else {metric.name: result})
        for key, state in self._returned.items():
            values[key] = state.result()
            values[self._UPDATED + key] = state.updated()
        return values

    def _finish(self, values: Dict[str, float]) -> Dict[str, float]:
        # A returned value shows once a step since the last reset set it
        # (training's are not evaluation's, as with Keras' last-step logs).
        return {name: value for name, value in values.items()
                if not name.startswith(self._UPDATED)
                and values.get(self._UPDATED + name, 1.0) > 0}

    def _trace_key(self) -> int:
        return len(self.variables()) + 1000 * len(self._returned)

    def _examples(self) -> tf.Tensor:
        return self.examples.total

    def variables(self) -> Dict[str, tf.Variable]:
        """Every state variable by a stable name (for checkpoints)."""
        return state_variables(list(self._model.metrics) + [self.examples])

    def _reset_state(self) -> None:
        for metric in list(self._model.metrics) + [self.examples] + list(self._returned.values()):
            metric.reset_state()


class KerasSteps:
    """Per-replica train and evaluation steps that call the model's own
    ``train_step`` / ``test_step`` (the interface of `ReplicaSteps`)."""

    # Unpadded (padding would only be stripped again): the user's step sees
    # TensorFlow's split of a final batch, which can leave a replica empty
    # (4 rows on 3 replicas: 2, 2, 0). Weights stay exact; Keras' loss
    # tracker then misses the empty replica's part of any loss term the
    # user adds outside Keras' reductions (a penalty in ``compute_loss``).
    avoid_empty_replicas = False

    def __init__(self, model: keras.Model, metrics: KerasMetrics,
                 trainable_listed: Optional[Callable[[list], list]] = None):
        """``trainable_listed``: what the model's layers list as trainable
        while its step is traced, from what Keras lists (a split model's
        shards: `tfdist._internal.keras.step_weights`); None: Keras' list."""
        self._model = model
        self._metrics = metrics
        self._warned = set()
        self._trainable_listed = trainable_listed
        replica_share.scale_compute_loss(model)

    # The model's own step applies its gradients: nothing accumulates here.
    accumulator = None

    def use_accumulator(self, accumulator) -> None:
        """Refuses an accumulator (a clear error: the model's own step
        applies its gradients at every step)."""
        if accumulator is not None:
            check_supported(self._model, accumulates=True)

    def _run(self, method, structure: dict) -> None:
        batch = Batch.from_structure(structure)
        x, y, sample_weight = _real_rows(batch)
        rows = tf.cast(tf.shape(tf.nest.flatten(x)[0])[0], tf.float32)
        global_rows = batch.carried_global_examples()  # from the data: no collective
        if global_rows is None:
            global_rows = collectives.all_reduce_sum(rows)
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        share = tf.math.divide_no_nan(rows * replicas, global_rows)
        listed = (contextlib.nullcontext() if self._trainable_listed is None
                  else step_weights.listed_as(self._trainable_listed))
        with replica_share.replica_share(share, replicas), replica_random.independent_draws(), \
                listed:
            logs = method(keras_data(x, y, sample_weight))
            self._report_returned(method.__name__, logs, rows)
        self._metrics.examples.update_state(rows)

    def _report_returned(self, name: str, logs, rows) -> None:
        """Keeps the scalars ``logs`` has beside ``model.metrics`` (this
        replica's value and rows), warning once per method what is assumed
        of them and what is not reported."""
        if not isinstance(logs, dict):
            return
        kept, refused = returned_values.split_returned(logs, self._metrics.reported_names())
        for key, value in kept.items():
            self._metrics.returned(key).update_state(replica_share.unscaled(value), rows)
        if name in self._warned or not (kept or refused):
            return
        self._warned.add(name)
        owner = f"{type(self._model).__name__}.{name}"
        if kept:
            warnings.warn(returned_values.combined_warning(owner, kept), stacklevel=2)
        if refused:
            warnings.warn(returned_values.refused_warning(owner, refused), stacklevel=2)

    def train(self, structure: dict) -> None:
        """One replica's ``model.train_step`` on its rows (replica context);
        the optimizers it applies clip the batch's gradient
        (`tfdist.replica.gradients.clip_batches_in_apply`)."""
        for optimizer in _optimizers(self._model):
            gradients_lib.clip_batches_in_apply(optimizer)
        with loss_scaling.agreement():
            self._run(self._model.train_step, structure)

    @tf.autograph.experimental.do_not_convert
    def after_train_step(self) -> None:
        """Nothing to do after a step: the optimizer applied the gradients."""

    def evaluate(self, structure: dict) -> None:
        """One replica's ``model.test_step`` on its rows (replica context)."""
        self._run(self._model.test_step, structure)


def _optimizers(model: keras.Model) -> list:
    """The optimizers a model's step can apply: ``model.optimizer`` and any
    other its ``compile`` kept (a GAN's two)."""
    found = [model.optimizer] if getattr(model, "optimizer", None) is not None else []
    for value in vars(model).values():
        if isinstance(value, keras.optimizers.Optimizer) and all(value is not f for f in found):
            found.append(value)
    return found


def check_supported(model: keras.Model, *, jit_compile: bool = False,
                    static_shapes: bool = False, accumulates: bool = False) -> None:
    """Options the user-step path cannot honour are errors naming them."""
    names = ", ".join(overridden(model))
    # static_shapes first: it turns jit_compile on, so it is what the user asked for.
    for option, value in (("static_shapes", static_shapes), ("jit_compile", jit_compile),
                          ("gradient_accumulation_steps", accumulates)):
        if value:
            raise ConfigurationError(
                f"`{option}` is not supported for a model that overrides {names}: tfdist runs "
                f"the model's own step as written. Turn `{option}` off, or move the custom "
                f"logic into layers and the compiled loss.")


def check_data(model: keras.Model, element_spec) -> None:
    """x-only data (no ``y``) needs a model with its own step: the compiled
    loss of tfdist's step needs targets."""
    if (not isinstance(element_spec, tuple) or len(element_spec) == 1) and not overridden(model):
        raise ConfigurationError(
            f"The data yields x only (element_spec {element_spec}), but the model's compiled "
            f"loss needs targets: yield tuples (x, y) or (x, y, sample_weight) (a dict of "
            f"features: `ds.map(lambda e: (e['image'], e['label']))`), or override "
            f"`train_step` / `compute_loss` (tfdist runs a model's own step).")


def warn_per_replica_statistics(model: keras.Model, strategy: tf.distribute.Strategy) -> None:
    """A ``BatchNormalization(synchronized=False)`` under 2+ replicas
    normalizes each replica's rows by their own mean and variance, so N
    replicas train differently from one device: tfdist cannot make that
    exact (it is the layer's definition), so it says so, naming the layers."""
    if strategy.num_replicas_in_sync < 2:
        return
    layers = [layer.name for layer in keras_model_state.all_layers(model)
              if isinstance(layer, keras.layers.BatchNormalization)
              and not getattr(layer, "synchronized", False)]
    if layers:
        warnings.warn(
            f"BatchNormalization layers {layers} are not synchronized: under "
            f"{strategy.num_replicas_in_sync} replicas each normalizes its replica's rows by "
            f"their own statistics, so training differs from one device. Build them with "
            f"BatchNormalization(synchronized=True) for the global batch's statistics "
            f"(exact against one device).", UserWarning, stacklevel=3)


def warn_padded_activity_regularizers(model: keras.Model, *, jit_compile: bool,
                                      static_shapes: bool) -> None:
    """Under XLA (``jit_compile``, static shapes) a batch keeps its padding
    rows, masked out of losses and metrics, but an activity regularizer
    (Keras divides it by the batch size) averages over them: on a padded
    batch it is not one device's. Says so, naming the layers."""
    if not (jit_compile or static_shapes):
        return
    layers = [layer.name for layer in keras_model_state.all_layers(model)
              if getattr(layer, "activity_regularizer", None) is not None]
    if layers:
        option = "static_shapes" if static_shapes else "jit_compile"
        warnings.warn(
            f"Layers {layers} have an activity_regularizer; with `{option}` a padded batch (an "
            f"uneven or partial last batch) keeps its padding rows in the batch, and the "
            f"regularizer's mean includes them, so those steps differ from one device. Without "
            f"`{option}`, padding rows are removed before the model runs (exact).",
            UserWarning, stacklevel=3)


def steps_for(model: keras.Model, strategy: tf.distribute.Strategy, *, jit_compile: bool,
              static_shapes: bool, plan):
    """(metric state, replica steps) for ``model``: the model's own step when
    it overrides one of `OVERRIDABLE`, else tfdist's (`tfdist.replica.step`),
    which runs every batch through ``plan`` (`tfdist.parallel.plan.ModelPlan`).
    When the plan splits the model (a pipeline, tensor parallelism), a model
    that overrides only ``compute_loss`` runs tfdist's step, which calls it
    (on each micro-batch of a pipeline: `tfdist.replica.own_compute_loss`);
    a model's own step on split weights lists them as the plan says
    (``plan.trainable_listed``)."""
    warn_per_replica_statistics(model, strategy)
    warn_padded_activity_regularizers(model, jit_compile=jit_compile, static_shapes=static_shapes)
    own = overridden(model)
    own_compute_loss = plan.calls_own_compute_loss and own == ("compute_loss",)
    with strategy.scope():
        if own and not own_compute_loss:
            if plan.cuts_batches:  # (`ModelPlan.attach` refused these first)
                raise ConfigurationError(
                    f"{plan!r} runs tfdist's training step; this model has its own "
                    f"{', '.join(own)}, which a pipeline cannot cut into micro-batches yet.")
            check_supported(model, jit_compile=jit_compile, static_shapes=static_shapes)
            metrics = KerasMetrics(model, strategy)
            return metrics, KerasSteps(model, metrics, plan.trainable_listed)
        metrics = MetricState(model, strategy)
    return metrics, ReplicaSteps(model, metrics, jit_compile=jit_compile, plan=plan,
                                 own_compute_loss=own_compute_loss)
