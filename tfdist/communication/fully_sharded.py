"""Fully sharded weights (ZeRO stage 3, PyTorch's FSDP): each replica keeps
1/N of every weight, of its gradient and of its optimizer state.

`tfdist.communication.ShardedOptimizerState` divides the optimizer's
state by N, but every replica still holds every weight whole. With
``FullySharded`` a weight lives on the replicas as N slices (flattened,
padded to equal lengths, `tfdist.communication.shard_layout.ShardLayout`),
one per replica, and exists whole only while a step uses it:

1. when the forward pass reads a weight, its slices are all-gathered
   (one ``CollectiveGatherV2`` per read);
2. the gradient of that read is reduce-scattered: replica ``r`` receives
   slice ``r`` of the weight's gradient, summed over the replicas (an
   all-to-all and a sum, `tfdist._internal.collectives.reduce_scatter_sum`);
3. replica ``r`` applies the user's Keras optimizer to its slice of the
   weight, with the state of that slice (the optimizer's own
   ``update_step``, as `ShardedOptimizerState` does), in place: no
   all-gather after the update.

The math is the one-device math for an elementwise optimizer (SGD,
momentum, Adam, AdamW, RMSprop, Adagrad, Adamax, Adadelta, Lion): each
weight element is updated from its own gradient element and state.

Outside a step the weights read whole: ``get_weights``, ``model.save``,
``save_weights``, ``tf.train.Checkpoint``, callbacks and
``keras.models.load_model`` of a saved model see an ordinary Keras model
(`tfdist._internal.keras.sliced_weights`); the optimizer's state is saved
in the ordinary Keras form too (`tfdist.communication.sharded_checkpoints`).

>>> import keras, numpy as np, tfdist
>>> strategy = tfdist.make_strategy("mirrored", num_replicas=2)
>>> with strategy.scope():
...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
...     model.compile(optimizer="adam", loss="mse")
>>> model = tfdist.attach(model, strategy,
...                       communication=tfdist.communication.FullySharded())
>>> _ = model.fit(np.ones((4, 3)), np.ones((4, 2)), batch_size=4, verbose=0)
>>> [tuple(c.shape) for c in model.layers[0].kernel.value.values]  # each replica: 3 of 6
[(3,), (3,)]
>>> [w.shape for w in model.get_weights()]  # read whole
[(3, 2), (2,)]

What runs and what is refused (a `ConfigurationError` saying why):

- MirroredStrategy and MultiWorkerMirroredStrategy (the slices spread
  over every replica of every worker), through `tfdist.attach` +
  ``fit`` / ``evaluate`` / ``predict`` and `tfdist.Trainer`; one replica
  (nothing to shard: Keras' own update). Across workers, reading a weight
  whole outside a step (``get_weights``, a save) is a collective: every
  worker reads it, as every worker saves.
- ``Embedding`` tables are sharded by vocabulary: each replica's slice
  holds a range of whole rows, and a step sends each id to the replica
  owning its row, which sends the row back (two all-to-all exchanges
  forward, one backward: `tfdist.communication.table_lookups`); the table
  is never gathered whole, so a table too large for one device trains.
  Each occurrence's gradient reaches the row's owner, whose optimizer
  updates from every entry, duplicates kept, as one device's does. A
  table read another way (a tied projection's matmul, a position
  embedding's ids every replica looks up alike) is gathered whole for
  that read, its sparse gradient combined into the form one device's
  optimizer updates from (`tfdist._internal.sparse_gradients`).
- ``jit_compile=True``: the step runs without XLA, with a warning (the
  backward pass's collectives cannot run inside XLA on a mirrored
  strategy; the numbers are the same).
- Gradient clipping (``clipnorm``, ``global_clipnorm``, ``clipvalue``)
  of the batch's gradient, as one device clips it: a norm is summed over
  the replicas' slices (one all-reduce of one number per weight,
  `tfdist.replica.gradients.clip_slices_in_apply`).
- Mixed precision: the weights are kept, gathered and updated in float32
  and cast where a layer computes; a LossScaleOptimizer's finite check
  is decided over all replicas' slices (`tfdist.replica.loss_scaling`).
- `tfdist.communication.Compression`: each reduce-scatter of a gradient
  (and an Embedding's gathered entries, and each looked-up row's
  gradient on its way back to the row's owner) crosses in 16 bits, as
  the all-reduce would without the sharding; the weights and looked-up
  rows are gathered in their own dtype, exactly.
- Gradient accumulation (``gradient_accumulation_steps``): tfdist's exact
  accumulator (`tfdist.replica.accumulation`) keeps each replica's slice
  of the gradient sums (1/N of the weights' bytes), saved whole in
  checkpoints, and applies them every k-th micro-batch.
- Weight constraints (``kernel_constraint=MaxNorm(...)``): each replica
  gathers the updated weight, constrains it whole, as one device does, and
  keeps its slice.
- Within a pipeline's stages (``parallel=tfdist.parallel.Pipeline(...)``,
  data x pipeline x fully sharded): each stage's slices on its devices,
  gathered once per step (`tfdist.parallel.pipeline`).
- With the model axis (``parallel=keras.distribution.ModelParallel(...)``,
  data x model x fully sharded): each split weight's shards are sliced,
  shard j's slices on every replica's model device j, gathered and
  reduce-scattered in a collective group of those devices
  (`tfdist._internal.collectives.group_launcher`), inside the split
  layer's sharded form (`tfdist.parallel.plan`).
- Not built yet, refused: weights of more than one dtype;
  ParameterServerStrategy, TPUStrategy and LocalSGD as for
  `ShardedOptimizerState`.
- A pass gathers each weight once, however often it reads it (Keras' ops
  convert a variable at each TensorFlow op, a regularizer reads it again,
  an RNN reads its kernels at every time step inside a loop: the gather
  runs in the step, before the loop, `tfdist._internal.step_graph`).
- ``reshard_after_forward`` (the default): each layer's gathered weights
  (each unit's: the model's layers, or nested ones by path, ``units=``)
  are freed after its forward pass and gathered again in the backward
  pass, which computes the layer's forward pass again; with ``prefetch``,
  at most two units' gathered weights are alive at once
  (`tfdist.communication.gather_units`).
"""

import warnings
import weakref
from typing import Optional, Sequence

import tensorflow as tf

from tfdist._internal import collectives, replica_share, sparse_gradients, step_graph
from tfdist._internal.keras import embedding_rows, model_state
from tfdist._internal.keras import optimizer as keras_optimizer
from tfdist.communication import compression, gather_units, model_support
from tfdist.communication import slice_reads, step_gathers, weight_slices
from tfdist.communication.step_gathers import StepWeights
from tfdist.communication.shard_layout import ShardLayout
from tfdist.communication.sharding import ShardedOptimizerState
from tfdist.errors import ConfigurationError
from tfdist.replica import accumulation, gradients


class FullySharded(ShardedOptimizerState):
    """Each replica keeps 1/N of every weight, gradient and optimizer state
    (module doc). Pass it as ``communication=`` to `tfdist.attach` or
    `tfdist.Trainer`, before the first ``fit``; a model Keras builds on its
    first batch (a subclassed model, a ``Sequential`` without an ``Input``)
    is sliced when tfdist builds it (`tfdist.parallel.plan.ModelPlan`)."""

    shards_weights = True

    def __init__(self, *, reshard_after_forward: Optional[bool] = None, prefetch: bool = True,
                 units: Optional[Sequence[str]] = None):
        """
        Args:
          reshard_after_forward: free each layer's gathered weights after
            its forward pass and gather them again in the backward pass,
            computing the layer's forward pass again there (FSDP's option
            of the same name; `tfdist.communication.gather_units`). False:
            the gathered weights stay alive until the backward pass has
            used them (no second forward pass; the whole model's weights
            are alive at once during a step). None (the default): True,
            except within a pipeline's stages, which gather each stage's
            weights once per step for all its micro-batches (an explicit
            True there warns that it does not apply).
          prefetch: with ``reshard_after_forward``, gather the next layer's
            weights while this one computes (at most two layers' gathered
            weights alive at once); False: one layer at a time, each
            gather waiting for the layer before it.
          units: with ``reshard_after_forward``, the layers gathered and
            freed as one, by path (regular expressions matched whole, as
            `keras.distribution.LayoutMap` keys are: ``"backbone/block_\\d+"``
            makes each block inside layer ``backbone`` a unit, as PyTorch
            users call ``fully_shard`` on each block); the other layers
            beside them are units too
            (`tfdist._internal.keras.layer_paths.units`). Default: each of
            the model's layers.
        """
        super().__init__()
        self.reshard_after_forward = (True if reshard_after_forward is None
                                      else bool(reshard_after_forward))
        self.prefetch = bool(prefetch)
        self.units = gather_units.unit_patterns(units, self.reshard_after_forward)
        self._strategy = None
        self._units = None
        self._optimizer = None
        # Per traced graph: each (replica, weight)'s gathered weight, until
        # the update (Keras' ops read a variable once per TensorFlow op).
        self._gathered = weakref.WeakKeyDictionary()
        self._reshard_asked = reshard_after_forward is not None
        self._per_step = False  # (`_gather_once_per_step`: within a pipeline's stages)
        self._when_built = False  # (`_attach_when_built`: a model Keras builds later)
        self._step_weights = weakref.WeakKeyDictionary()  # graph -> {replica: StepWeights}
        # With the model axis (`_over_split_weights`): the model's trainable
        # weights as the step differentiates them (each split one as its shards).
        self._weights_of = lambda model: list(model.trainable_variables)
        self._launcher_devices = []  # per weight: the devices of its local slices
        self._tables = set()  # ids of the Keras variables of tables sliced in rows

    def __repr__(self) -> str:
        options = []
        if not self.reshard_after_forward:
            options.append("reshard_after_forward=False")
        if not self.prefetch:
            options.append("prefetch=False")
        if self.units is not None:
            options.append(f"units={self.units!r}")
        return f"FullySharded({', '.join(options)})"

    def attach_to(self, model, strategy: tf.distribute.Strategy) -> None:
        """Stores each of ``model``'s trainable weights as per-replica
        slices and makes its optimizer update the slices in place."""
        if self._keeps_state_of(model.optimizer):
            return  # (a second Trainer over the same model)
        if not model_state.weights_built(model) and self._when_built:
            return  # (`tfdist.parallel.plan.ModelPlan.when_built` attaches it then)
        model_support.refuse_an_unbuilt_model(self, model)
        model_support.refuse_a_model_without_call(self, model)
        super().attach_to(model, strategy)
        if strategy.num_replicas_in_sync == 1:
            return  # one replica: the whole weight is its slice
        self._optimizer = model.optimizer
        self._slice_weights(model, strategy)
        # (each replica's gradients are its slices: norms summed over them,
        # accumulated in slices)
        gradients.clip_slices_in_apply(model.optimizer)
        accumulation.sums_in_slices(model.optimizer, self._accumulation_sums)
        if self.reshard_after_forward and not self._per_step:
            self._units = gather_units.GatherUnits(
                in_replica_step=self._replica_step_being_traced, prefetch=self.prefetch)
            self._units.wrap(model, self.units or [], what=repr(self),
                             skip=lambda layer: all(id(weight) in self._tables
                                                    for weight in layer.trainable_weights))

    def _slice_weights(self, model, strategy) -> None:
        """Replaces every trainable weight's storage (a whole copy per
        replica) with one slice per replica (`tfdist.communication.weight_slices`);
        an embedding table's slices hold whole rows, looked up where they
        live (`tfdist.communication.table_lookups`)."""
        variables = self._weights_of(model)
        weight_slices.check_one_dtype(self, variables)
        self._strategy = strategy
        if not self._per_step and not self._state_built_by_split:
            # (within a pipeline's stages, or over a model axis' shards: read whole)
            self._tables = {id(table) for table in embedding_rows.tables_looked_up_by_rows(
                model_state.all_layers(model)) if len(table.shape) == 2}
        layout = self._layout = ShardLayout.of(variables, strategy.num_replicas_in_sync,
                                               self._sliced_by_rows(variables))
        self._launcher_devices = weight_slices.store_in_slices(
            strategy, layout, variables,
            lambda index, storage: slice_reads.whole_reader(self, layout, index, storage),
            lambda: self._replica_index(strategy),
            rows_reader=lambda index, storage: slice_reads.rows_reader(self, layout, index,
                                                                       storage))

    def _sliced_by_rows(self, variables) -> list:
        """The embedding tables among ``variables``, looked up by rows (`_slice_weights`)."""
        return [index for index, variable in enumerate(variables) if id(variable) in self._tables]

    def _accumulation_sums(self, variables) -> accumulation.SumStorage:
        """Gradient accumulation's sums, in slices (`tfdist.communication.weight_slices`)."""
        return weight_slices.accumulation_sums(self, self._strategy, self._layout, variables)

    def _launcher(self, index: int, replica: int):
        """Replica ``replica``'s collective launcher for weight ``index``:
        in the group of the devices its slices live on (the strategy's
        replicas', or a tensor-parallel shard's model devices), so its
        gather and reduce-scatter run beside them."""
        return collectives.group_launcher(self._strategy, self._launcher_devices[index], replica)

    def _replica_index(self, strategy) -> "int | None":
        """The index of the replica of ``strategy`` running here, or None
        outside one (cross-replica context, another strategy)."""
        if tf.distribute.in_cross_replica_context():
            return None
        context = tf.distribute.get_replica_context()
        if context is None or context.strategy is not strategy:
            return None
        replica = tf.get_static_value(context.replica_id_in_sync_group)
        if replica is None:
            raise ConfigurationError(f"{self!r} needs each replica's index when the step "
                                     "is traced (MirroredStrategy gives it).")
        return int(replica)

    def _replica_step_being_traced(self):
        """(graph, replica) while a replica's step is traced, else None."""
        if self._strategy is None or tf.executing_eagerly():
            return None
        replica = self._replica_index(self._strategy)
        return None if replica is None else (step_graph.of_this_replica(), replica)

    def _reduce_scatter(self, index: int, upstream, context, replica: int, launcher):
        """Replica ``replica``'s slice of weight ``index``'s gradient
        ``upstream`` summed over the replicas (the gradient of a gather)."""
        layout = self._layout
        scale = replica_share.gradient_scale()
        compressed = compression.attached_to(self._optimizer)
        if isinstance(upstream, tf.IndexedSlices):
            # (the sharded state's form: every entry in the slice)
            return self._sparse_slice(index, upstream, scale, compressed, replica, context)
        upstream = sparse_gradients.scaled_gradient(tf.convert_to_tensor(upstream), scale)

        def exchange(sent):
            if launcher is None:  # (no collective ops: the slice of an all-reduce)
                return layout.own_slice(
                    index, context.all_reduce(tf.distribute.ReduceOp.SUM, sent), replica)
            return collectives.reduce_scatter_sum(launcher, layout.rows(index, sent))

        return self._exchanged(upstream, compressed, exchange)

    # -- within a pipeline's stages (`tfdist.parallel.plan`) ---------------

    def _attach_when_built(self) -> None:
        """Set by `tfdist.parallel.plan.ModelPlan` for a model Keras builds on
        its first batch: `attach_to` waits for the plan to call it again."""
        self._when_built = True

    def _over_split_weights(self, weights_of) -> None:
        """Set by `tfdist.parallel.plan.ModelPlan` with the model axis
        (tensor parallelism): the weights sliced over the replicas are
        ``weights_of(model)``, each split weight's shards (each shard's
        slices on its model devices, gathered and reduce-scattered among
        the devices holding that shard), and the optimizer's state is built
        by the tensor-parallel build, which calls `_build_state` for the shards."""
        self._weights_of = weights_of
        self._state_built_by_split = True

    def _gather_once_per_step(self) -> None:
        """Set by `tfdist.parallel.plan.ModelPlan` before attaching, when a
        pipeline runs each batch as micro-batches: each weight is gathered
        once per step, on its stage's device, for all its micro-batches, and
        its gradient summed over them is reduce-scattered once
        (`_gathered_for_step`, `StepWeights.scattered`), as PyTorch's FSDP does with
        pipelining. Per layer resharding would gather every weight m times."""
        if self.reshard_after_forward is True and (self._reshard_asked or self.units):
            warnings.warn(
                f"{self!r} with a pipeline: each stage's weights are gathered once per step "
                "for all its micro-batches (not again per layer and micro-batch), and freed "
                "after the step; reshard_after_forward and units do not apply. The numbers "
                "are the same.", stacklevel=4)
        self._per_step = True

    def _gathered_for_step(self, variables) -> StepWeights:
        """Each of ``variables`` gathered whole for a pipelined step
        (`tfdist.communication.step_gathers.gathered_for_step`)."""
        return step_gathers.gathered_for_step(self, variables, self._layout)

    def _file_updated_variables(self, optimizer, strategy, variables, stand_ins, dtype) -> None:
        """The updates run in the weights' own slices: each weight is filed
        under the state built for its stand-in."""
        del strategy, dtype
        for stand_in, variable in zip(stand_ins, variables):
            keras_optimizer.set_state_index(optimizer, variable,
                                            keras_optimizer.state_index(optimizer, stand_in))

    def _update(self, optimizer, grads, variables, learning_rate) -> None:
        """Each replica updates its slice of every weight from its slice of
        the summed gradient (made by the backward pass), in place."""
        context = tf.distribute.get_replica_context()
        # A read after the update, in this graph, gathers the new values.
        # (Each replica forgets its own: the replicas' traces take turns at
        # every collective, so another may still be reading.)
        replica = tf.get_static_value(context.replica_id_in_sync_group)
        gathered_in_graph = self._gathered.get(step_graph.of_this_replica(), {})
        for key in [key for key in gathered_in_graph if key[0] == replica]:
            del gathered_in_graph[key]
        variables = [v.value if hasattr(v, "value") else v for v in variables]
        grads, variables = self._in_built_order(optimizer, grads, variables)

        def update_slices(strategy, grads):
            for gradient, variable in zip(grads, variables):
                strategy.extended.update(
                    variable, lambda v, g: optimizer.update_step(g, v, learning_rate),
                    args=(gradient,), group=False)

        context.merge_call(update_slices, args=(grads,))
