"""One object for how a model is split over devices: `ModelPlan`.

`tfdist.Trainer` and `tfdist.attach` see a model's split as one object,
whatever ways of splitting were asked for, as they see what crosses the
network as one `tfdist.communication.plan.Communication`. Without a split
(the default) it is a null object: its calls run the batch whole, so the
Trainer and the replica step never test for a pipeline.

Its axes are named as Keras names a ``keras.distribution.DeviceMesh``'s:

- ``"data"``: the replicas of the tf.distribute strategy (MirroredStrategy
  in one process, MultiWorkerMirroredStrategy over workers); with a
  pipeline, each replica runs one of its own (a data x pipeline layout:
  replica r's stage s on a device of its own, each stage's gradient
  all-reduced over the replicas once per step);
- ``"pipeline"``: the devices the stages of
  ``parallel=tfdist.parallel.Pipeline(...)`` run on (one per stage, or one
  per v stages with ``stages_per_device=v``);
- ``"model"``: tensor parallelism, weights split by the rules of
  ``parallel=keras.distribution.ModelParallel(layout_map=...)`` over the
  model devices of each replica (`tfdist.parallel.tensor_parallel`): the
  step differentiates and updates each split weight's shards
  (`trainable_variables`). With a pipeline too
  (``parallel=[Pipeline(...), ModelParallel(...)]``, a mesh of data x
  pipeline x model whose second axis is named ``"pipeline"``), each
  stage's split layers keep their shards on that stage's model devices and
  run their sharded forms inside the stage's passes, the stage's other
  weights on its first model device. With fully sharded weights
  (``communication=FullySharded()``, data x model x fully sharded), each
  shard is sliced over the replicas on its model devices, gathered and
  reduce-scattered among them (`tfdist.communication.FullySharded`). All
  four at once (data x pipeline x model x fully sharded): each stage's
  weights and shards sliced over the replicas beside them, gathered once
  per step for all micro-batches (a split layer's form takes its shards'
  gathered values as inputs of its custom gradient:
  `tfdist._internal.tensorflow.placed_gradients.capture`).

Fully sharded weights (``communication=FullySharded()``) shard over the
data axis, within each stage when there is a pipeline (data x pipeline x
fully sharded): replica r's slice of a stage's weight, and its optimizer
state, on replica r's device for that stage; each step gathers a stage's
weights once for all micro-batches and reduce-scatters their summed
gradients once (`tfdist.parallel.pipeline`). Other communication parts do
not combine with a pipeline yet (a clear error names them).

A model Keras builds on its first batch (a subclassed model, a
``Sequential`` without an ``Input``) has no weights to place when it is
attached: the plan then waits until tfdist builds the model from the first
batch's element spec, as the data-parallel path builds it (`when_built`),
and attaches the pipeline to the new weights before the optimizer makes
their state. The same program with the one added line runs where plain
``fit`` runs.

>>> import keras, numpy as np, tfdist
>>> from tfdist.parallel.plan import ModelPlan
>>> ModelPlan(None).axes
{'data': 1, 'pipeline': 1, 'model': 1}
>>> model = keras.Sequential([keras.layers.Dense(4, name="encoder"), keras.layers.Dense(2)])
>>> model.compile(optimizer="adam", loss="mse")                 # no Input: built on the first batch
>>> pipeline = tfdist.parallel.Pipeline(cuts=["encoder"], micro_batches=2)
>>> _ = tfdist.attach(model, parallel=pipeline)
>>> history = model.fit(np.ones((8, 3), "float32"), np.ones((8, 2), "float32"), verbose=0)
>>> model.built, ModelPlan(pipeline).axes
(True, {'data': 1, 'pipeline': 2, 'model': 1})
"""

import warnings
from typing import Callable, Dict, Optional

import keras
import tensorflow as tf

from tfdist._internal import collectives
from tfdist._internal.keras import model_state as keras_model_state
from tfdist._internal.keras import placed_weights, weight_regularizers
from tfdist.communication.fully_sharded import FullySharded
from tfdist.communication.plan import parts_of
from tfdist.errors import ConfigurationError
from tfdist.parallel.pipeline import Pipeline
from tfdist.parallel import mesh_rows, plan_checks, split_regularizers, tensor_parallel
from tfdist.replica import keras_steps, table_rows
from tfdist.replica.step import ForwardBackward

AXES = ("data", "pipeline", "model")  # (as a keras.distribution.DeviceMesh names them)


class ModelPlan:
    """How ``parallel`` (a `tfdist.parallel.Pipeline`, a
    ``keras.distribution.ModelParallel``, a list of one of each, or None)
    splits a model: the Trainer's one view of it (module doc)."""

    def __init__(self, parallel, strategy: Optional[tf.distribute.Strategy] = None):
        ways = _ways(parallel)
        pipelines = [way for way in ways if isinstance(way, Pipeline)]
        layouts = [way for way in ways if isinstance(way, keras.distribution.ModelParallel)]
        if (len(pipelines) > 1 or len(layouts) > 1
                or len(pipelines) + len(layouts) != len([w for w in ways if w is not None])):
            raise ConfigurationError(
                f"`parallel` ({parallel!r}) must be a tfdist.parallel.Pipeline, a "
                "keras.distribution.ModelParallel, a list of one of each (data x pipeline x "
                "model), or None.")
        self.tensor_parallel = (tensor_parallel.TensorParallel(layouts[0]) if layouts
                                else None)
        self.pipeline: Optional[Pipeline] = pipelines[0] if pipelines else None
        self._replicas = 1 if strategy is None else strategy.num_replicas_in_sync
        self._waiting = None  # (model, strategy, FullySharded parts) waiting for the build
        self.sharding = None  # FullySharded over the data axis, within each stage

    @classmethod
    def asked(cls, parallel, strategy: Optional[tf.distribute.Strategy] = None) -> "ModelPlan":
        """The plan for ``parallel``; with no ``ModelParallel`` in it, and
        one set with ``keras.distribution.set_distribution`` (what Keras on
        TensorFlow ignores), with that one too, so a program written for
        Keras on JAX runs with ``tfdist.attach`` added."""
        ways = _ways(parallel)
        distribution = keras.distribution.distribution()
        if isinstance(distribution, keras.distribution.ModelParallel) and not any(
                isinstance(way, keras.distribution.ModelParallel) for way in ways):
            parallel = [way for way in ways if way is not None] + [distribution]
        return cls(parallel, strategy)

    @property
    def axes(self) -> Dict[str, int]:
        """Each axis' size (module doc): replicas, pipeline devices, model shards."""
        pipeline = self.pipeline
        return {"data": self._replicas,
                "pipeline": pipeline.devices_per_pipeline if pipeline is not None else 1,
                "model": (self.tensor_parallel.model_devices
                          if self.tensor_parallel is not None else 1)}

    @property
    def cuts_batches(self) -> bool:
        """Whether tfdist's step runs each batch as micro-batches (a pipeline)."""
        return self.pipeline is not None

    @property
    def calls_own_compute_loss(self) -> bool:
        """Whether a model that overrides only ``compute_loss`` runs
        tfdist's step, which calls it (a split model: Keras' own step would
        differentiate the whole weights, or the whole batch)."""
        return self.pipeline is not None or self.tensor_parallel is not None

    def __repr__(self) -> str:
        ways = [way for way in (self.pipeline, self.tensor_parallel) if way is not None]
        return f"ModelPlan({ways[0] if len(ways) == 1 else ways or None!r})"

    @property
    def trainable_listed(self) -> Optional[Callable[[list], list]]:
        """While a model's own step is traced, what its layers' trainable
        weights list, from what Keras lists: each split weight as its shards
        (the tape watches them and the optimizer, built for them, updates
        them: `tfdist._internal.keras.step_weights`); None: Keras' list."""
        if self.tensor_parallel is None:
            return None
        return tensor_parallel.trainable_variables

    def trainable_variables(self, model) -> list:
        """What the step differentiates and the optimizer updates: the
        model's trainable weights, each split weight as its shards."""
        if self.tensor_parallel is None:
            return model.trainable_variables
        return tensor_parallel.trainable_variables(model.trainable_variables)

    # -- set-up: what the Trainer asks, in its order ---------------------

    def jit_compile(self, compiled: bool) -> bool:
        """Whether the step runs under XLA: ``compiled``, except with a
        pipeline, whose stages run on several devices, which one XLA program
        cannot span: then without XLA, with a warning (the same numbers)."""
        split = self.pipeline or self.tensor_parallel
        if compiled and split is not None:
            warnings.warn(
                f"model.jit_compile is True, but parallel={split!r} runs the model on "
                "several devices, which one XLA program cannot span: tfdist runs the step "
                "without XLA (the same numbers).", stacklevel=4)
            return False
        return compiled

    def attach(self, model, strategy: tf.distribute.Strategy, *, communication,
               static_shapes: bool) -> None:
        """Refuses what the split does not combine with yet, naming it, and
        attaches it to ``model``: now when its weights exist, else when tfdist
        builds it (`when_built`). First, whatever the split, the step's
        embedding lookups and Adagrad read only a table's touched rows
        (`tfdist.replica.table_rows`; a split wraps those lookups, or reads
        its tables its own way)."""
        table_rows.read_only_touched_rows(model, strategy)
        if self.tensor_parallel is not None:
            self._attach_tensor_parallel(model, strategy, communication, static_shapes)
            return
        pipeline = self.pipeline
        if pipeline is None:
            self._wait_for_the_build(model, strategy, communication)
            return
        plan_checks.check_pipeline(pipeline, model, static_shapes)
        self.sharding = plan_checks.sharding_across_stages(pipeline, communication,
                                                           self._replicas)
        if keras_model_state.weights_built(model):
            pipeline._attach(model, strategy)  # pylint: disable=protected-access
        else:
            self._wait_for_the_build(model, strategy, communication)

    def _attach_tensor_parallel(self, model, strategy, communication, static_shapes) -> None:
        split = self.tensor_parallel if self.pipeline is None \
            else [self.pipeline, self.tensor_parallel]
        sharded = plan_checks.check_tensor_parallel(split, self.pipeline, model,
                                                    communication, static_shapes)
        if sharded and self._replicas > 1:  # (one replica: nothing to shard)
            self.sharding = sharded[0]
            sharded[0]._over_split_weights(  # pylint: disable=protected-access
                lambda model: self.trainable_variables(model))
            if self.pipeline is not None:  # (each stage's weights and shards: once per step)
                sharded[0]._gather_once_per_step()  # pylint: disable=protected-access
        if keras_model_state.weights_built(model):
            self._attach_split_weights(model, strategy)
        else:
            for part in sharded:
                part._attach_when_built()  # pylint: disable=protected-access
            self._waiting = (model, strategy, sharded)

    def _attach_split_weights(self, model, strategy) -> None:
        """Tensor parallelism, and with a pipeline its stages too (data x
        pipeline x model): each split layer's shards on its stage's model
        devices first (the mesh's ``"pipeline"`` axis); then the pipeline
        places the other weights on each stage's first model device and
        wraps each unit's call around its split layers' calls, so a split
        layer runs its sharded form inside its stage's pass."""
        pipeline = self.pipeline
        if pipeline is None:
            self.tensor_parallel.attach(model, strategy, sharding=self.sharding)
            return
        self.tensor_parallel.attach(model, strategy, stage_of=_stage_of_layers(pipeline, model),
                                    pipeline=pipeline, sharding=self.sharding)
        devices = [device for row in self.tensor_parallel.stage_devices for device in row]
        if pipeline.devices is not None and [mesh_rows.canonical(d) for d in pipeline.devices] \
                != [mesh_rows.canonical(d) for d in devices]:
            raise ConfigurationError(
                f"{pipeline!r} was given devices={pipeline.devices}, but with "
                f"parallel={self.tensor_parallel!r} its stages run on the mesh's devices "
                f"({devices}: each stage's first model device). Drop `devices`.")
        pipeline.devices = devices
        pipeline._attach(model, strategy)  # pylint: disable=protected-access

    def _wait_for_the_build(self, model, strategy, communication) -> None:
        """For a model Keras builds on its first batch: the pipeline and the
        fully sharded weights (each ``FullySharded`` in ``communication``,
        whose ``attach_to`` then waits) attach when tfdist builds it."""
        if keras_model_state.weights_built(model):
            return
        sharded = [part for part in parts_of(communication) if isinstance(part, FullySharded)]
        for part in sharded:
            part._attach_when_built()  # pylint: disable=protected-access
        if self.pipeline is not None or sharded:
            self._waiting = (model, strategy, sharded)

    def steps_for(self, model, strategy: tf.distribute.Strategy, *, jit_compile: bool,
                  static_shapes: bool):
        """`tfdist.replica.keras_steps.steps_for` (metric state, replica
        steps) with this plan in the step (a model that overrides only
        ``compute_loss`` then runs tfdist's step, which calls it per
        micro-batch)."""
        return keras_steps.steps_for(model, strategy, jit_compile=jit_compile,
                                     static_shapes=static_shapes, plan=self)

    def when_built(self, element_spec) -> None:
        """Before the model's state is first built from ``element_spec``:
        builds its weights and attaches the pipeline that waited for them
        (a no-op when none waited)."""
        if self._waiting is None:
            return
        model, strategy, sharded = self._waiting
        with strategy.scope():
            keras_model_state.build_layers(model, element_spec)
        if self.tensor_parallel is not None:
            self._attach_split_weights(model, strategy)
        elif self.pipeline is not None:
            self.pipeline._attach(model, strategy)  # pylint: disable=protected-access
        for part in sharded:  # (after the pipeline: its slices go where it put the weights)
            part.attach_to(model, strategy)
        self._waiting = None

    # -- the step ----------------------------------------------------------

    def forward_backward(self, model, batch, global_examples, *, whole: Callable,
                         micro_batch: Callable, own_compute_loss: bool = False):
        """One replica's gradients, loss parts and outputs on ``batch``
        (replica context, traced): ``whole(batch, global_examples)`` without
        a split; with a pipeline, its micro-batches through the stages, each
        run by ``micro_batch`` (`tfdist.replica.step.forward_backward`),
        with the global batch's example count (all-reduced when the data
        does not carry it); with split weights (tensor parallelism), the
        batch whole, the weights' regularization on their shards' devices
        (`_split_weights_step`), or, for a model's own ``compute_loss``, the
        batch as one micro-batch. Returns a `tfdist.replica.step.ForwardBackward`."""
        pipeline = self.pipeline
        split = self.tensor_parallel is not None
        if split and pipeline is None and not own_compute_loss:
            return self._split_weights_step(model, batch, global_examples, whole)
        if pipeline is None and self.tensor_parallel is None:
            return whole(batch, global_examples)
        if global_examples is None:  # (every micro-batch's loss needs the batch's count)
            global_examples = collectives.all_reduce_sum(batch.real_examples())
        if pipeline is None:  # (a split model's own compute_loss: the batch as one micro-batch)
            return micro_batch(model, batch.x, batch.y, batch.sample_weight, batch.mask,
                               global_examples, micro_batch=True,
                               variables=self.trainable_variables(model))
        gradients, parts, outputs = pipeline._forward_backward(  # pylint: disable=protected-access
            model, batch, global_examples, micro_batch,
            regularizers_apart=not own_compute_loss, sharding=self.sharding,
            variables=self.trainable_variables(model) if split else None,
            split_terms=split_regularizers.each_shard if split else None)
        return ForwardBackward(gradients, parts, global_examples, outputs)

    def _split_weights_step(self, model, batch, global_examples, whole: Callable):
        """The batch whole with the weights' regularization terms set apart
        from ``model.losses`` and computed on each weight's (each shard's)
        device, their gradients added there (`tfdist.parallel.split_regularizers`)."""
        with weight_regularizers.set_apart(model) as regularized:
            result = whole(batch, global_examples)
        if not regularized:
            return result
        share = None
        if tf.distribute.get_replica_context().num_replicas_in_sync > 1:
            share = tf.math.divide_no_nan(tf.cast(batch.real_examples(), tf.float32),
                                          tf.cast(result.global_examples, tf.float32))
        terms = weight_regularizers.on_weight_devices(
            split_regularizers.each_shard(regularized), model.optimizer.scale_loss, share=share)
        gradients = []
        for variable, gradient in zip(self.trainable_variables(model), result.gradients):
            extra = terms.gradients.get(id(variable))
            if extra is not None:
                with tf.device(placed_weights.device_of(variable)):  # (a lookup's sparse
                    # gradient made dense, as one device's tape adds the two)
                    gradient = extra if gradient is None else tf.convert_to_tensor(gradient) + extra
            gradients.append(gradient)
        loss = result.loss._replace(regularization=result.loss.regularization + terms.value)
        return result._replace(gradients=gradients, loss=loss)


def _ways(parallel) -> list:
    """``parallel`` as a list of ways of splitting (one given alone, or None)."""
    return list(parallel) if isinstance(parallel, (list, tuple)) else [parallel]


def _stage_of_layers(pipeline: Pipeline, model) -> Callable[[str], int]:
    """A layer's stage in ``pipeline``, by path: its unit's (the unit it
    is, or is inside); a split layer in no unit is refused, naming it."""
    units = pipeline._stage_of(model)  # pylint: disable=protected-access

    def stage_of(path: str) -> int:
        for unit, stage in units:
            if path == unit.path or path.startswith(unit.path + "/"):
                return stage
        raise ConfigurationError(
            f"{pipeline!r}: layer {path!r} is split over the model axis, but no stage runs "
            f"it as a unit (the units are {[unit.path for unit, _ in units]}; a layer's own "
            "weights beside the sublayers a cut opens run on no stage's devices). Cut at "
            "the layer that holds it, or drop its rules.")

    return stage_of


WHOLE = ModelPlan(None)  # (the null plan: every batch whole, on the replica's device)
