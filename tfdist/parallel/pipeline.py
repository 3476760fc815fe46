"""Pipeline parallelism: a model cut into stages on several devices, a
batch cut into micro-batches that flow through them (GPipe; 1F1B).

>>> import keras, numpy as np, tfdist
>>> devices = tfdist.strategies.configure_logical_cpus(2)  # (before other TensorFlow work)
>>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="first"),
...                           keras.layers.Dense(1, name="second")])
>>> model.compile(optimizer="adam", loss="mse")
>>> pipeline = tfdist.parallel.Pipeline(cuts=["first"], micro_batches=4)
>>> model = tfdist.attach(model, parallel=pipeline)
>>> history = model.fit(np.ones((10, 4)), np.ones((10, 1)), batch_size=10, verbose=0)
>>> [w.value.device.endswith(d) for w, d in zip(model.weights, ["CPU:0"] * 2 + ["CPU:1"] * 2)]
[True, True, True, True]

``cuts`` names the layers after which a new stage starts, in the
model's order: here ``first`` on the first device, ``second`` on the
second. Each stage's weights (and so its optimizer state) live on its
device, and its layers run there, forward and backward
(`tfdist.parallel.stage_units`).

A cut may name a nested layer by its path, ``"outer/inner"``
(`tfdist._internal.keras.layer_paths`): a model whose blocks sit inside
one layer (a backbone model used as a layer, a stack of blocks written
as one layer) is cut between its blocks, e.g.
``cuts=["backbone/block_1"]``: stage 0 holds the layers before the
backbone and its blocks up to ``block_1``, stage 1 the rest. The
backbone's own operations between its blocks (an addition, a reshape)
run on the last stage's device; the values are the same.

**Exact.** Each micro-batch's loss is its examples' share of the global
batch's loss (divided by the global batch's example count, not the
micro-batch's), so the micro-batches' gradients sum to the batch's and
one update follows: p stages and m micro-batches give one device's weights,
losses and metrics on the same batches, whatever m is, with a batch that
does not divide into m micro-batches, and with micro-batches left empty
(a batch of fewer than m rows: `tfdist.parallel.micro_batches`). Losses
whose denominators depend on the data (a Keras mask at the output,
``mean_with_sample_weight``) are refused: each micro-batch's loss must be
scaled before the others run.
A ``BatchNormalization`` layer normalizes each micro-batch by its own
statistics (a warning names it), as under replicas.

**Schedules** (`tfdist.parallel.schedules`): ``"1f1b"`` (default) holds
at most S - s micro-batches' activations on stage s; ``"gpipe"`` all m.
The order is enforced in the traced step; it never changes a value.

``devices`` may be this process's (logical CPUs, GPUs) or one per task
of a cluster (`tfdist.parallel.cluster_stages`).

**Data parallelism across pipelines**: under a strategy with d replicas
(``tfdist.attach(model, strategy, parallel=pipeline)``, the model built
in ``strategy.scope()``) each replica runs its part of the batch through
a pipeline of its own: replica r's stage s on its own device (stage 0 on
the replica's device, the others on devices the strategy does not use),
its copy of the stage's weights and optimizer state there. Each stage
replica's gradient is summed over its micro-batches on that device and
then all-reduced once per step by the strategy, as any replica's gradient
is: the data axis of `tfdist.parallel.plan.ModelPlan`. Exact as one
pipeline is. (``Pipeline(replicas=d)``, which ran d pipelines inside one
replica reading every weight from the first pipeline's device once per
micro-batch, is retired: its error says what to write.)

A model that overrides only ``compute_loss`` keeps it: tfdist's step
calls it on each micro-batch and weights its value by the micro-batch's
rows (`tfdist.replica.own_compute_loss`, which says when that is one
device's loss and refuses what is not).

**Fully sharded stages**: with ``communication=FullySharded()`` as well,
each stage's weights, gradients and optimizer state are sharded over the
strategy's replicas, each replica's slices on its devices for the stage.
A step gathers each weight once, whole on its stage's device for all the
replica's micro-batches; each micro-batch's gradient is taken of the
gathered weights, summed over the micro-batches there, and
reduce-scattered once into each replica's slice (as PyTorch's FSDP runs
inside a pipeline's stages: no gather per micro-batch).

**Split weights in the stages**: with a ``keras.distribution.ModelParallel``
as well (``parallel=[pipeline, ModelParallel(...)]``, its mesh's
``"pipeline"`` axis one index per pipeline device), each stage's split
layers keep their shards on that stage's model devices and run sharded
inside the stage's passes; the stages run on their first model devices
(`tfdist.parallel.plan`).

Not built yet, refused with a clear error: another ``communication=``
part (compression, sharded optimizer state alone, local SGD), a
model that overrides another step method (``train_step``, ``test_step``,
``compute_metrics``, ``metrics``). With ``jit_compile=True`` the step
runs without XLA, with a warning (XLA cannot span devices).
"""

import contextlib
import warnings
from typing import Optional, Sequence, Union

import keras
import tensorflow as tf

from tfdist._internal.keras import batch_statistics as keras_statistics
from tfdist._internal.keras import layer_paths
from tfdist._internal.keras import model_state as keras_model_state, placed_weights
from tfdist._internal.keras import sliced_weights
from tfdist._internal.keras import weight_regularizers
from tfdist._internal.tensorflow import distributed_variables
from tfdist.errors import ConfigurationError
from tfdist.parallel import micro_batch_results, micro_batches, schedules, stage_devices
from tfdist.parallel import stage_updates
from tfdist.parallel.stage_units import StageUnits, StepTrace


_NO_LONGER_PUBLIC = ("attach_to", "forward_backward")  # (plumbing: `ModelPlan` calls them)


class Pipeline:
    """A model cut into stages after the layers named in ``cuts``, each
    batch cut into ``micro_batches`` (module doc). Pass it as ``parallel=``
    to `tfdist.attach` or `tfdist.Trainer`.

    Args:
      cuts: the layers a stage ends after, in the model's order: names of
        the model's layers, or paths of nested ones (``"backbone/block_1"``).
        S = len(cuts) + 1 stages.
      micro_batches: m, the micro-batches each batch is cut into (the
        first ones one row longer when m does not divide it).
      schedule: ``"1f1b"`` (the default with one stage per device),
        ``"gpipe"``, ``"interleaved_1f1b"`` (the default with several)
        (`tfdist.parallel.schedules.REGISTRY`), or an order of one's own:
        one line per device of its passes in order, ``F<k>`` / ``B<k>`` for
        micro-batch k's forward / backward pass (``["F0 F1 B0 B1",
        "F0 B0 F1 B1"]``: what `tfdist.parallel.schedules.format_orders`
        prints; ``F<k>@<stage>`` with several stages per device). An order
        that would wait forever is refused, naming each waiting pass.
      devices: one device per stage (default: S GPUs when there are, else
        S logical CPUs, `tfdist.strategies.configure_logical_cpus`); under a
        strategy with d local replicas, S per replica, replica 0's first
        (default: replica r's stage 0 on its own device, its other stages
        on the next devices of that kind the strategy does not use). With
        ``stages_per_device=v``, S / v per pipeline.
      stages_per_device: v, the stages each device runs (interleaved
        1F1B's virtual stages): S = len(cuts) + 1 stages on S / v devices,
        stage s on device s mod (S / v), so each device holds v chunks of
        the model spread along it and the bubble shrinks from
        (p - 1) / (m + p - 1) to (p - 1) / (v·m + p - 1) for p devices.
      replicas: retired (module doc): give a strategy with d replicas.
    """

    def __init__(self, cuts: Sequence[str], *, micro_batches: int,
                 schedule: Union[str, Sequence[str], None] = None,
                 devices: Optional[Sequence[str]] = None, replicas: Optional[int] = None,
                 stages_per_device: int = 1):
        if isinstance(cuts, str) or not all(isinstance(c, str) for c in cuts):
            raise ConfigurationError(
                f"Pipeline: `cuts` ({cuts!r}) must be a list of layer names.")
        if not isinstance(micro_batches, int) or micro_batches < 1:
            raise ConfigurationError(
                f"Pipeline: `micro_batches` ({micro_batches!r}) must be a positive integer.")
        if (not isinstance(stages_per_device, int) or stages_per_device < 1
                or (len(cuts) + 1) % stages_per_device):
            raise ConfigurationError(
                f"Pipeline: `stages_per_device` ({stages_per_device!r}) must divide the "
                f"{len(cuts) + 1} stages the cuts make (stage s runs on device s mod "
                "stages / stages_per_device).")
        if schedule is None:
            schedule = "1f1b" if stages_per_device == 1 else "interleaved_1f1b"
        if isinstance(schedule, str) and schedule not in schedules.SCHEDULES:
            raise ConfigurationError(
                f"Pipeline: `schedule` ({schedule!r}) must be one of {schedules.SCHEDULES}, "
                "or an order: one line per stage, such as ['F0 F1 B0 B1', 'F0 B0 F1 B1'].")
        if replicas is not None:
            raise ConfigurationError(
                f"Pipeline(replicas={replicas!r}) is retired: data parallelism across "
                "pipelines is the strategy's replicas now. Build the model in "
                "strategy.scope() of a strategy with d replicas and attach the pipeline "
                "under it: tfdist.attach(model, tfdist.make_strategy('mirrored', "
                "num_replicas=d), parallel=Pipeline(cuts=..., micro_batches=...)); each "
                "replica runs its own pipeline, and each stage's gradients are all-reduced "
                "once per step.")
        self.cuts = list(cuts)
        self.micro_batches = micro_batches
        self.devices = None if devices is None else list(devices)
        self.stages_per_device = stages_per_device
        try:  # (an order that would wait forever: an error now, naming the stage and action)
            self._orders = schedules.orders_for(schedule, stages=self.stages,
                                                micro_batches=micro_batches,
                                                stages_per_device=stages_per_device)
        except ValueError as error:
            raise ConfigurationError(f"Pipeline: `schedule`: {error}") from None
        # A name, or the order given, as lines (`schedules.format_orders`).
        self.schedule = (schedule if isinstance(schedule, str)
                         else schedules.format_orders(self._orders))
        self._units: Optional[StageUnits] = None
        self.ordering_edges = 0  # added in the last traced step (`StepTrace.order`)
        self._warned_unordered = False

    def __getattr__(self, name):
        # (called only for a name the pipeline does not have)
        if name in _NO_LONGER_PUBLIC:
            raise AttributeError(
                f"Pipeline.{name} is no longer public: pass the pipeline as `parallel=` to "
                "tfdist.attach or tfdist.Trainer, which attach it to the model (when Keras "
                "has built it) and run each batch's micro-batches through it "
                "(tfdist.parallel.plan).")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def stages(self) -> int:
        """S: the stages the cuts make."""
        return len(self.cuts) + 1

    @property
    def devices_per_pipeline(self) -> int:
        """p: the devices one pipeline's stages run on (S / stages_per_device)."""
        return self.stages // self.stages_per_device

    def __repr__(self) -> str:
        per_device = ("" if self.stages_per_device == 1
                      else f", stages_per_device={self.stages_per_device}")
        return (f"Pipeline(cuts={self.cuts!r}, micro_batches={self.micro_batches}, "
                f"schedule={self.schedule!r}{per_device})")

    # -- attaching -------------------------------------------------------

    def _attach(self, model: keras.Model, strategy: Optional[tf.distribute.Strategy] = None
                ) -> None:
        """Places each stage's weights on its device (each replica's copy on
        its replica's, under ``strategy``) and wraps its layers
        (`tfdist.parallel.plan.ModelPlan` calls it once the model is built)."""
        if self._units is not None:
            return
        stage_of = self._stage_of(model)
        per_replica = stage_devices.per_replica(self.devices, self.stages, strategy,
                                                stages_per_device=self.stages_per_device)
        for unit, stage in stage_of:
            for weight in unit.layer.weights:
                if sliced_weights.is_sliced(weight):
                    continue  # (kept in shards another axis placed: tensor parallelism's)
                placed_weights.place_copies(
                    weight, [devices[stage % len(devices)] for devices in per_replica],
                    strategy)
        stage_updates.run_on_weight_devices(model.optimizer)
        stage_updates.constrain_on_weight_devices(model.trainable_weights)
        _warn_batch_statistics(model)
        self.devices = [device for devices in per_replica for device in devices]
        self._units = StageUnits(per_replica, stage_of)
        self._units.wrap()

    def _stage_of(self, model) -> list:
        """[(`layer_paths.Unit`, stage), ...]: the layers the cuts make
        units (the cut layers and those beside them in every layer opened
        to reach one), each unit's stage."""
        units = layer_paths.units(model, self.cuts, what=repr(self))
        paths = [unit.path for unit in units]
        positions = [paths.index(cut) for cut in self.cuts]
        if positions != sorted(set(positions)) or positions[-1] == len(paths) - 1:
            raise ConfigurationError(
                f"{self!r}: the cuts must name different layers in the model's order, not "
                f"its last layer ({paths[-1]!r}: the last stage would be empty); the layers "
                f"in order are {paths}.")
        return [(unit, sum(position < index for position in positions))
                for index, unit in enumerate(units)]

    # -- the step --------------------------------------------------------

    def _forward_backward(self, model, batch, global_examples, forward_backward, *,
                          regularizers_apart: bool = True, sharding=None, variables=None,
                          split_terms=None):
        """The batch's gradients, loss parts and outputs from its
        micro-batches (replica context, traced): ``forward_backward`` is
        `tfdist.replica.step.forward_backward`. Returns the summed
        gradients, the summed `tfdist.replica.losses.LossParts` and the
        outputs of every row in order.

        ``regularizers_apart``: the weights' regularization terms and their
        gradients are computed once, on each weight's device
        (`tfdist._internal.keras.weight_regularizers`), not in every
        micro-batch's loss on the last stage (False: a model's own
        ``compute_loss``, which decides itself whether it adds them).

        ``sharding``: `tfdist.communication.FullySharded`, whose weights
        are gathered once for the step on their stages' devices, the
        micro-batches' gradients taken of the gathered tensors, summed, and
        reduce-scattered once per weight into this replica's slices.

        ``variables``: what the gradients are of, when not the model's
        trainable weights (split weights' shards, in each stage's pass);
        ``split_terms``: makes the weights' regularization pairs theirs
        (`tfdist.parallel.split_regularizers.each_shard`)."""
        trace = StepTrace()
        results, sizes = [], []
        replica = distributed_variables.local_replica()
        own_variables = variables
        variables = model.trainable_variables if variables is None else variables
        weights = (None if sharding is None
                   else sharding._gathered_for_step(variables))  # pylint: disable=protected-access
        with (weight_regularizers.set_apart(model) if regularizers_apart
              else contextlib.nullcontext([])) as regularized:
            last_stage = self._units.devices[replica][-1]
            for index, part in enumerate(micro_batches.cut(batch, self.micro_batches)):
                inputs = part.structure
                with tf.device(last_stage), \
                        self._units.micro_batch(trace, index, replica, weights,
                                                data=inputs["x"]), \
                        keras_statistics.statistics_over_real_rows(inputs["mask"]):
                    result = forward_backward(
                        model, inputs["x"], inputs.get("y"), inputs.get("sample_weight"),
                        inputs["mask"], global_examples, micro_batch=True,
                        sources=None if weights is None else weights.tensors,
                        variables=own_variables)
                results.append(result._replace(
                    y_pred=micro_batch_results.real_rows(part, result.y_pred)))
                sizes.append(part.batch().real_examples())
        self.ordering_edges = trace.order(self._orders, pipeline=replica)
        if trace.unordered and not self._warned_unordered:
            self._warned_unordered = True
            passes = ", ".join(f"stage {stage} at {action}"
                               for stage, action in trace.unordered[:4])
            warnings.warn(
                f"{self!r}: the schedule's order is not enforced everywhere in this "
                f"model's step ({passes}: the pass feeds an update of state, a random "
                "seed's or batch statistics', that TensorFlow runs in the order it was "
                "traced, so it cannot also wait for the stage's previous pass). The values "
                "are the same; the stage may hold more micro-batches' activations than "
                "the schedule says.", stacklevel=2)
        # (each replica adds its rows' share of the weights' regularization
        # gradient; the strategy's all-reduce sums the shares to one)
        if split_terms is not None:
            regularized = split_terms(regularized)
        regularization = weight_regularizers.on_weight_devices(
            regularized, model.optimizer.scale_loss,
            share=_replica_share(batch.real_examples(), global_examples),
            sources=None if weights is None else weights.by_weight_id())
        gradients = micro_batch_results.summed_gradients(
            [r.gradients for r in results], variables, regularization.gradients)
        if weights is not None:
            gradients = weights.scattered(gradients)
        return (gradients,
                micro_batch_results.summed_loss([r.loss for r in results], sizes,
                                                regularization.value),
                micro_batch_results.concatenated_outputs([r.y_pred for r in results]))


def _replica_share(local_examples, global_examples):
    """This replica's share of the global batch, or None on one replica."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    return tf.math.divide_no_nan(tf.cast(local_examples, tf.float32),
                                 tf.cast(global_examples, tf.float32))


def _warn_batch_statistics(model) -> None:
    named = [layer.name for layer in keras_model_state.all_layers(model)
             if isinstance(layer, keras.layers.BatchNormalization)]
    if named:
        warnings.warn(
            f"Pipeline: {named} normalize each micro-batch by its own statistics (and update "
            "their moving statistics once per micro-batch), not the batch's as on one "
            "device; results differ from one device's. Use LayerNormalization, or one "
            "micro-batch.", stacklevel=3)
