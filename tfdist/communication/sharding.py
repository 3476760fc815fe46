"""Sharded optimizer state (ZeRO stages 1 and 2): each replica keeps the
optimizer state of 1/N of the weights, and of the summed gradient only its
own slices.

Every synchronous strategy keeps a full copy of the optimizer's state on
every replica: with Adam, two moments per weight, so twice the weights'
bytes per replica before a single activation. With ``ShardedOptimizerState``
the optimizer's state covers one slice of the weights per replica:

1. each weight's gradient is reduce-scattered: replica ``r`` receives
   slice ``r`` of it, summed over the replicas;
2. replica ``r`` applies the user's Keras optimizer (its own ``update_step``,
   so Adam is Adam) to its slice of the weight, with the state of that
   slice only;
3. the updated slices are all-gathered, and every replica's weight is
   whole again.

This runs weight by weight, the last weight first (the order the backward
pass makes the gradients in), and each weight's gradient is made only once
the previous weight's reduce-scatter has run
(`tfdist._internal.graph_order`): besides the weights and the state, a
replica holds about one weight's gradient and one weight's exchange at a
time, where exchanging every weight at once after the backward pass held
every gradient whole. Where the gradients must all exist first (a global
clip norm, mixed precision's finite check, gradient accumulation's
branch) they are made as usual. The variable the optimizer updates a
weight's slice in holds its elements only during that update, and none
between steps, as FSDP frees its unsharded parameters: Keras builds the
state from variables of each slice's shape, emptied before it builds (it
reads their shape and dtype only), and the update runs in shapeless
variables, made empty, under the same keys. The figures: the Large models
guide.

The math is the one-device math: an elementwise optimizer (SGD, momentum,
Adam, AdamW, RMSprop, Adagrad, Adamax, Adadelta, Lion) updates each weight
element from its own gradient and state, so a replica that owns 1/N of the
elements computes the same numbers. A subclass of one of them is accepted
when it keeps that class's update (``update_step``, ``build``; a
``class MyAdam(keras.optimizers.Adam)`` that changes its defaults); one
that replaces it is refused, naming the method. Optimizers that look
across elements (LAMB's per-layer norms, Adafactor's factored moments,
Muon) and Nadam (whose shared momentum product Keras updates per step)
are refused (`tfdist._internal.keras.optimizer.updates_elementwise`).

What works, and what is refused (a `ConfigurationError` saying why):

- MirroredStrategy and MultiWorkerMirroredStrategy (replica ``r`` of the
  whole cluster owns slice ``r``); one replica (nothing to shard: Keras'
  own update).
- Gradient clipping (tfdist clips the batch's gradient before the optimizer
  sees it, `tfdist.replica.gradients`), weight decay (on the whole weights,
  as Keras does), mixed precision (the inner optimizer of a
  LossScaleOptimizer is sharded), sparse ``Embedding`` gradients (their
  entries gathered, and each replica updates its slice from the entries
  that fall in it, duplicates kept, as one device's optimizer updates the
  whole table: `tfdist._internal.sparse_gradients`).
- Checkpoints (``tfdist.CheckpointOptions``, ``tf.train.Checkpoint``,
  ``model.save``, ``save_weights``) hold the ordinary Keras optimizer
  state, so they restore under any replica count, sharded or not
  (`tfdist.communication.sharded_checkpoints`).
- Gradient accumulation (``gradient_accumulation_steps``): tfdist's exact
  accumulator (`tfdist.replica.accumulation`) keeps each replica's gradient
  sums, whole, as ZeRO stage 1 does, and applies them through the sharded
  update every k-th micro-batch.
- Compression (`tfdist.communication.Compression`): the gradient sum
  crosses in 16 bits, as without the sharding; the updated slices are
  gathered in the weights' own dtype, exactly.
- Refused for now: ``use_ema``, LocalSGD (its replicas keep weights of
  their own), ParameterServerStrategy and TPUStrategy.

The exchange moves a ring all-reduce's bytes: the reduce-scatter is an
all-to-all and a sum (`tfdist._internal.collectives.reduce_scatter_sum`:
TensorFlow's CPU collectives have no reduce-scatter), and the gather sends
each replica's slices once. Under cross-device ops without collective ops
(``make_strategy("mirrored", communication=...)`` other than the default),
the optimizer's own all-reduce sums and each replica keeps its slice.
"""

import tensorflow as tf

from tfdist._internal import collectives, graph_order, replica_share, sparse_gradients
from tfdist._internal.keras import optimizer as keras_optimizer, patches
from tfdist._internal.tensorflow import distributed_variables
from tfdist.communication import compression, sharded_checkpoints
from tfdist.communication.shard_layout import ShardLayout
from tfdist.communication.strategy_support import refuse_strategy
from tfdist.errors import ConfigurationError

_WRAPPED = "_tfdist_sharded_state"


class ShardedOptimizerState:
    """Each replica keeps the optimizer state of 1/N of the weights (module
    doc). Pass it as ``communication=`` to `tfdist.Trainer` or `tfdist.attach`."""

    # Whether each replica keeps a slice of the weights too (`FullySharded`).
    shards_weights = False

    def __init__(self):
        self._layout = None
        self._shards = []  # per weight, a variable of one replica's slice
        self._keys, self._names = [], []  # the weights the state was built for, in order
        self._ordinary = None  # the state as checkpoints see it, once built
        # (with the model axis: the tensor-parallel build calls `_build_state`)
        self._state_built_by_split = False

    def __repr__(self) -> str:
        return "ShardedOptimizerState()"

    def _keeps_state_of(self, optimizer) -> bool:
        """Whether ``optimizer`` (or the one it wraps) keeps this sharded state."""
        return getattr(patches.inner_optimizer(optimizer), _WRAPPED, None) is self

    def attach_to(self, model, strategy: tf.distribute.Strategy) -> None:
        """Makes ``model``'s optimizer keep a shard of its state per replica,
        checking first what cannot combine with it. Once per optimizer."""
        refuse_strategy(
            self, strategy,
            parameter_servers=("shards the state of synchronous replicas; under "
                               "ParameterServerStrategy the state already lives once, on the ps."),
            tpu=("runs under MirroredStrategy and MultiWorkerMirroredStrategy; TPUStrategy is "
                 "not built yet."))
        optimizer = model.optimizer
        target = patches.inner_optimizer(optimizer)
        _check_optimizer(self, target)
        attached = getattr(target, _WRAPPED, None)
        if attached is self:
            return  # (a second Trainer over the same model)
        if attached is not None:
            raise ConfigurationError(
                f"The optimizer already keeps sharded state; make one {self!r} per model.")
        if target.built:
            raise ConfigurationError(
                f"communication={self!r} must be attached before the optimizer is built (it "
                "builds the optimizer's state for one shard). Attach before the first fit.")
        if strategy.num_replicas_in_sync == 1:
            return  # one replica: the whole state is its shard, Keras' own update
        object.__setattr__(target, _WRAPPED, self)
        keras_build = target.build
        patches.replace_update_of(target, lambda grads, variables, rate:
                                  self._update(target, grads, variables, rate))
        # What checkpoints and model.save see: the ordinary Keras state.
        patches.replace_checkpoint_children_of(target, lambda children: (
            self._ordinary.children(children) if self._ordinary else children))
        if not self._state_built_by_split:
            patches.replace_methods_of(target, {"build": lambda variables: self._build_state(
                target, keras_build, variables, strategy)})
        # ``model.save`` / ``save_weights``: the ordinary Keras state.
        sharded_checkpoints.save_in_ordinary_form(
            target, lambda: self._ordinary_variables(target), repr(self))

    def _ordinary_state_record(self) -> sharded_checkpoints.BuildRecord:
        """The ordinary (unsharded) state's variables (`WholeSlot` views),
        each with the index of the weight it was built for, in the order
        Keras made them: what a tensor-parallel optimizer groups into each
        split weight's state (`tfdist.parallel.split_state`)."""
        return self._ordinary.record()

    def _ordinary_variables(self, optimizer) -> list:
        if self._ordinary is None:
            return list(optimizer.variables)
        return self._ordinary.variables(list(optimizer.variables))

    def _refuse_saving(self, *unused) -> None:
        """The raw shard of one replica, saved on its own, would pass for
        the whole state: an error instead (the optimizer saves whole)."""
        del unused
        raise ConfigurationError(
            f"This is one replica's slice of sharded optimizer state ({self!r}); save the "
            "optimizer itself (tf.train.Checkpoint(optimizer=...), model.save), which saves "
            "the whole state.")

    def _sliced_by_rows(self, variables) -> list:
        """Which of ``variables`` (indices) are sliced in whole rows
        (`ShardLayout.by_rows`): none here; `FullySharded`'s tables."""
        del variables
        return []

    def _build_state(self, optimizer, keras_build, variables, strategy) -> None:
        """Per replica, the optimizer's state for its slice of each weight
        (built by Keras from stand-ins of the slices' shapes, emptied before
        it builds), the shapeless slice variables the updates run in (made
        empty, under the stand-ins' keys), and the model's weights
        registered, so Keras accepts them in ``apply``. Once built, only
        the state is allocated beside the weights."""
        import keras  # pylint: disable=import-outside-toplevel

        variables = list(variables)
        dtypes = {v.dtype for v in variables}
        if len(dtypes) != 1:
            raise ConfigurationError(
                f"{self!r} shards weights of one dtype; this model's trainable weights are "
                f"{sorted(str(d) for d in dtypes)}. Drop it for this model.")
        self._layout = ShardLayout.of(variables, strategy.num_replicas_in_sync,
                                      self._sliced_by_rows(variables))
        self._keys = [keras_optimizer.variable_key(optimizer, v) for v in variables]
        self._names = [v.path for v in variables]
        dtype = dtypes.pop()
        # Keras makes the state from variables of each slice's shape (it
        # reads their shape and dtype only, so they are emptied first); the
        # slices are then updated in variables that hold their elements only
        # during an update (module doc), made empty, under the same keys.
        # (Each on its weight's devices: a pipeline stage's state on the stage's.)
        stand_ins = []
        for variable, length in zip(variables, self._layout.slice_sizes):
            with strategy.scope(), distributed_variables.on_devices_of(strategy,
                                                                       variable.value):
                stand_ins.append(keras.Variable(tf.zeros([length], dtype), trainable=False,
                                                name=f"{variable.name}_shard"))
        with strategy.scope():
            for stand_in in stand_ins:
                for component in strategy.experimental_local_results(stand_in.value):
                    _release(component)
        record = sharded_checkpoints.BuildRecord()
        with record.recording(optimizer, stand_ins):
            keras_build(stand_ins)
        self._file_updated_variables(optimizer, strategy, variables, stand_ins, dtype)
        self._ordinary = sharded_checkpoints.OrdinaryLayout(
            record, sharded_checkpoints.Shards(strategy, self._layout), variables)
        for state in record.state_variables():  # (saved alone, one slice would pass for all)
            object.__setattr__(state.value, "_serialize_to_tensors", self._refuse_saving)

    def _file_updated_variables(self, optimizer, strategy, variables, stand_ins, dtype) -> None:
        """Files the variables the updates run in under the state Keras
        built for ``stand_ins``: here shapeless slice variables (module
        doc); the weights themselves under index 0 (``apply`` checks they
        are known; they are never updated one by one)."""
        self._shards = []
        for variable in variables:
            with strategy.scope(), distributed_variables.on_devices_of(strategy,
                                                                       variable.value):
                self._shards.append(tf.Variable(
                    tf.zeros([0], dtype), shape=tf.TensorShape([None]), trainable=False,
                    name=f"{variable.name}_shard"))
        for stand_in, shard in zip(stand_ins, self._shards):
            keras_optimizer.set_state_index(optimizer, shard,
                                            keras_optimizer.state_index(optimizer, stand_in))
        for variable in variables:
            keras_optimizer.set_state_index(optimizer, variable, 0)

    def _update(self, optimizer, grads, variables, learning_rate) -> None:
        """Keras' distributed update (``_backend_update_step``), sharded:
        weight by weight, the last first (module doc)."""
        context = tf.distribute.get_replica_context()
        variables = [v.value if hasattr(v, "value") else v for v in variables]
        replica = tf.get_static_value(context.replica_id_in_sync_group)
        if replica is None:
            raise ConfigurationError(f"{self!r} needs each replica's index when the step is "
                                     "traced (the mirrored strategies give it); this one does not.")
        grads, variables = self._in_built_order(optimizer, grads, variables)
        summed_slice = self._summed_slices(optimizer, grads, variables, int(replica), context)
        exchanged = None  # the previous weight's summed slice
        for weight in reversed(range(len(variables))):
            if exchanged is not None:  # (made when the exchange can take it)
                graph_order.run_after(grads[weight], exchanged.op)
            exchanged = summed_slice(weight)
            self._update_weight(optimizer, weight, variables[weight], exchanged,
                                int(replica), learning_rate, context)

    def _update_weight(self, optimizer, weight: int, variable, gradient, replica: int,
                       learning_rate, context) -> None:
        """Replica ``replica`` updates its slice of weight ``weight`` from
        ``gradient`` (that slice of the summed gradient); the slices are
        gathered and every replica's ``variable`` is whole again."""
        layout, shard = self._layout, self._shards[weight]
        own_slice = layout.own_slice(weight, variable, replica)

        def update_shard(strategy, own_slice, gradient):
            def update(shard, own_slice, gradient):
                shard.assign(own_slice)
                optimizer.update_step(gradient, shard, learning_rate)

            strategy.extended.update(shard, update, args=(own_slice, gradient), group=False)

        context.merge_call(update_shard, args=(own_slice, gradient))
        updated = tf.ensure_shape(shard.read_value(), [layout.slice_sizes[weight]])
        gathered = context.all_gather(updated, axis=0)

        def assign_weight(strategy, value):
            strategy.extended.update(variable, lambda v, x: v.assign(x), args=(value,),
                                     group=False)
            strategy.extended.update(shard, _release, group=False)

        context.merge_call(assign_weight, args=(layout.whole(weight, gathered),))

    def _summed_slices(self, optimizer, grads, variables, replica: int, context):
        """A function of a weight's index: replica ``replica``'s slice of
        that weight's gradient, summed over the replicas (reduce-scattered
        when it is called). What the optimizer's all-reduce would do first
        is done first: a model's own step's share of the loss scaling
        (`tfdist._internal.replica_share`) and, with
        `tfdist.communication.Compression`, the exchange in 16 bits."""
        layout = self._layout
        dtypes = [shard.dtype for shard in self._shards]
        launcher = collectives.replica_launcher(context.strategy, replica)
        if launcher is None:  # (no collective ops: the slice of the optimizer's all-reduce)
            reduced = patches.all_reduce_sum(optimizer, zip(grads, variables))
            return lambda weight: tf.cast(
                self._own_slice(weight, reduced[weight][0], replica), dtypes[weight])
        scale = replica_share.gradient_scale()
        compressed = compression.attached_to(optimizer)

        def summed_slice(weight: int) -> tf.Tensor:
            gradient = grads[weight]
            if isinstance(gradient, tf.IndexedSlices):
                return tf.cast(self._sparse_slice(weight, gradient, scale, compressed,
                                                  replica, context), dtypes[weight])
            gradient = tf.convert_to_tensor(sparse_gradients.scaled_gradient(gradient, scale))
            summed = self._exchanged(gradient, compressed, lambda sent: (
                collectives.reduce_scatter_sum(launcher, layout.rows(weight, sent))))
            return tf.cast(summed, dtypes[weight])

        return summed_slice

    def _exchanged(self, gradient, compressed, exchange):
        """``exchange(gradient)`` (its reduce-scatter into this replica's
        slice), crossing in 16 bits where `Compression` is attached
        (``compressed``): cast before the exchange, restored after."""
        if compressed is None:
            return exchange(gradient)
        replicas = self._layout.replicas
        summed = exchange(compressed.compress(gradient, replicas))
        return compressed.restore(summed, gradient.dtype, replicas)

    def _own_slice(self, weight: int, gradient, replica: int):
        """Replica ``replica``'s slice of a whole (summed) gradient: dense,
        or sparse in one device's form (`tfdist._internal.sparse_gradients`)."""
        if isinstance(gradient, tf.IndexedSlices):
            length = self._layout.slice_sizes[weight]
            return sparse_gradients.flat_slice(gradient, replica * length, length,
                                               self._layout.shapes[weight][1:])
        return self._layout.own_slice(weight, gradient, replica)

    def _sparse_slice(self, weight: int, gradient, scale, compressed, replica: int, context):
        """Replica ``replica``'s slice of a sparse gradient (an Embedding's),
        in the form one device's optimizer would update the whole table
        from: every entry in the slice, duplicates kept
        (`tfdist._internal.sparse_gradients`; summed dense, Adam's squares
        would differ from one device's). The entries are gathered, as
        ``tf.distribute`` gathers them without the sharding."""
        own_dtype, replicas = gradient.dtype, self._layout.replicas

        def send(values):
            values = sparse_gradients.scaled_gradient(values, scale)
            return values if compressed is None else compressed.compress(values, replicas)

        def receive(values):
            return values if compressed is None else compressed.restore(
                values, own_dtype, replicas)

        whole = sparse_gradients.combine(gradient, context, send=send, receive=receive)
        return self._own_slice(weight, whole, replica)

    def _in_built_order(self, optimizer, grads, variables):
        """The gradients and weights in the order the state was built for;
        a weight left out (Keras drops those without a gradient) is an
        error, since a shard covers every weight."""
        given = {keras_optimizer.variable_key(optimizer, v): (g, v)
                 for g, v in zip(grads, variables)}
        missing = [name for key, name in zip(self._keys, self._names) if key not in given]
        if missing:
            raise ConfigurationError(
                f"{self!r}: the step updates only some of the weights the optimizer was built "
                f"for (no gradient for {missing[:3]}); sharded state covers every weight at "
                "each step. Give every trainable weight a gradient, or drop the sharding.")
        ordered = [given[key] for key in self._keys]
        return [g for g, _ in ordered], [v for _, v in ordered]


def _release(slice_variable) -> None:
    """Frees a slice variable's elements until its next update, as FSDP
    frees its unsharded parameters (its shape is ``[None]``, so it may
    hold none)."""
    tf.raw_ops.AssignVariableOp(resource=slice_variable.handle,
                                value=tf.zeros([0], slice_variable.dtype), validate_shape=False)


def _check_optimizer(sharding, optimizer) -> None:
    name = type(optimizer).__name__
    base = keras_optimizer.elementwise_base(optimizer)
    if not patches.has_gradient_all_reduce(optimizer) or base is None:
        accepted = ", ".join(c.__name__ for c in keras_optimizer.elementwise_classes())
        raise ConfigurationError(
            f"communication={sharding!r} needs a Keras optimizer that updates each weight "
            f"element from its own gradient and state ({accepted}, AdamW, or a subclass "
            f"keeping their update); {name} is not one of them. Drop the sharding for this "
            "optimizer.")
    if not keras_optimizer.updates_elementwise(optimizer):
        overridden = ", ".join(keras_optimizer.overridden_update_methods(optimizer))
        raise ConfigurationError(
            f"communication={sharding!r}: {name} subclasses {base.__name__} but overrides "
            f"{overridden}, so its update may look across weight elements (each replica "
            "updates only its slice of each weight). Drop the sharding for this optimizer, "
            f"or keep {base.__name__}'s {overridden}.")
    if getattr(optimizer, "use_ema", False):
        raise ConfigurationError(
            f"communication={sharding!r} with use_ema=True: not built yet (the moving "
            "averages would be a full copy per replica). Drop one of the two.")
