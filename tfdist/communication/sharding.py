"""Sharded optimizer state (ZeRO stage 1): each replica keeps the optimizer
state of 1/N of the weights.

Every synchronous strategy keeps a full copy of the optimizer's state on
every replica: with Adam, two moments per weight, so twice the weights'
bytes per replica before a single activation. With ``ShardedOptimizerState``
the optimizer's state covers one slice of the weights per replica:

1. the gradients are reduce-scattered: replica ``r`` receives slice ``r``
   of every weight's gradient summed over the replicas (its shard);
2. replica ``r`` applies the user's Keras optimizer (its own ``update_step``,
   so Adam is Adam) to its slice of every weight, with the state of those
   slices only;
3. the updated slices are all-gathered, and every replica's weights are
   the whole again.

The math is the one-device math: an elementwise optimizer (SGD, momentum,
Adam, AdamW, RMSprop, Adagrad, Adamax, Adadelta, Lion) updates each weight
element from its own gradient and state, so a replica that owns 1/N of the
elements computes the same numbers. Optimizers that look across elements
(LAMB's per-layer norms, Adafactor's factored moments, Muon) and Nadam
(whose shared momentum product Keras updates per step) are refused by name.

What works, and what is refused (a `ConfigurationError` saying why):

- MirroredStrategy and MultiWorkerMirroredStrategy (replica ``r`` of the
  whole cluster owns slice ``r``); one replica (nothing to shard: Keras'
  own update).
- Gradient clipping (tfdist clips the batch's gradient before the optimizer
  sees it, `tfdist.replica.gradients`), weight decay (on the whole weights,
  as Keras does), mixed precision (the inner optimizer of a
  LossScaleOptimizer is sharded), sparse ``Embedding`` gradients (summed
  dense: the shard is a slice of every weight).
- Checkpoints (``checkpoint_dir``, ``tf.train.Checkpoint``, ``model.save``,
  ``save_weights``) hold the ordinary Keras optimizer state, so they
  restore under any replica count, sharded or not
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

import dataclasses
from typing import List, Tuple

import tensorflow as tf

from tfdist._internal import collectives, replica_share
from tfdist._internal.keras import patches
from tfdist.communication import compression, sharded_checkpoints
from tfdist.communication.strategy_support import refuse_strategy
from tfdist.errors import ConfigurationError

_WRAPPED = "_tfdist_sharded_state"
# Keras optimizers whose update of a weight element reads only that
# element's gradient and state (and global scalars: the step, the rate).
ELEMENTWISE = ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adamax", "Adadelta", "Lion")


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """Which elements of each weight a replica owns: slice ``r`` of every
    weight (flattened, padded to N equal slices), the slices of all weights
    one after the other in replica ``r``'s shard.

    Slicing weight by weight, not one flat copy of the model, keeps the
    temporaries of an update to a shard's size plus one weight at a time.

    Attributes:
      shapes: each trainable weight's shape, in the optimizer's order.
      replicas: N, the number of shards.
    """

    shapes: Tuple[Tuple[int, ...], ...]
    replicas: int

    @classmethod
    def of(cls, variables, replicas: int) -> "ShardLayout":
        return cls(tuple(tuple(int(d) for d in v.shape) for v in variables), replicas)

    @property
    def sizes(self) -> Tuple[int, ...]:
        """Each weight's number of elements."""
        return tuple(int(tf.TensorShape(shape).num_elements()) for shape in self.shapes)

    @property
    def slice_sizes(self) -> Tuple[int, ...]:
        """Elements of each weight in one replica's slice (the last slices padded)."""
        return tuple(-(-size // self.replicas) for size in self.sizes)

    @property
    def shard_size(self) -> int:
        """Elements in one replica's shard: its slice of every weight."""
        return sum(self.slice_sizes)

    @property
    def offsets(self) -> Tuple[int, ...]:
        """Where each weight's slice starts in a shard."""
        starts, total = [], 0
        for length in self.slice_sizes:
            starts.append(total)
            total += length
        return tuple(starts)

    def rows(self, weight: int, tensor) -> tf.Tensor:
        """Weight ``weight``'s ``tensor`` (its shape) as ``[N, slice]``, row
        ``r`` replica ``r``'s slice (the last rows padded with zeros)."""
        size, length = self.sizes[weight], self.slice_sizes[weight]
        flat = tf.reshape(tf.convert_to_tensor(tensor), [-1])
        return tf.reshape(tf.pad(flat, [[0, length * self.replicas - size]]),
                          [self.replicas, length])

    def shard_of(self, tensors, replica: int, dtype) -> tf.Tensor:
        """Replica ``replica``'s shard of ``tensors`` (one per weight, dense)."""
        parts = []
        for tensor, size, length in zip(tensors, self.sizes, self.slice_sizes):
            start = min(replica * length, size)
            stop = min(start + length, size)
            flat = tf.reshape(tf.cast(tf.convert_to_tensor(tensor), dtype), [-1])
            parts.append(flat[start:stop])
            if stop - start < length:
                parts.append(tf.zeros([length - (stop - start)], dtype))
        return tf.concat(parts, axis=0)

    def slices(self, shard: tf.Tensor) -> List[tf.Tensor]:
        """A shard cut back into its slice of each weight."""
        return tf.split(shard, list(self.slice_sizes))

    def whole(self, gathered: List[tf.Tensor]) -> List[tf.Tensor]:
        """Each weight from its N slices, gathered in replica order."""
        return [tf.reshape(parts if parts.shape[0] == size else parts[:size], shape)
                for parts, size, shape in zip(gathered, self.sizes, self.shapes)]


class ShardedOptimizerState:
    """Each replica keeps the optimizer state of 1/N of the weights (module
    doc). Pass it as ``communication=`` to `tfdist.Trainer` or `tfdist.attach`."""

    def __init__(self):
        self._layout = None
        self._shard = None  # a variable of one shard's elements, per replica
        self._keys, self._names = [], []  # the weights the state was built for, in order
        self._ordinary = None  # the state as checkpoints see it, once built

    def __repr__(self) -> str:
        return "ShardedOptimizerState()"

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
        object.__setattr__(target, "build", lambda variables: self._build(
            target, keras_build, variables, strategy))
        object.__setattr__(target, "_backend_update_step", lambda grads, variables, rate:
                           self._update(target, grads, variables, rate))
        # What checkpoints and model.save see: the ordinary Keras state.
        keras_children = target._trackable_children  # pylint: disable=protected-access
        object.__setattr__(target, "_trackable_children", lambda *args, **kwargs: (
            self._ordinary.children(keras_children(*args, **kwargs)) if self._ordinary
            else keras_children(*args, **kwargs)))
        object.__setattr__(target, "save_own_variables",
                           lambda store: self._save_own_variables(target, store))
        object.__setattr__(target, "load_own_variables",
                           lambda store: self._load_own_variables(target, store))

    def _save_own_variables(self, optimizer, store) -> None:
        """``model.save`` / ``save_weights``: the ordinary Keras state."""
        for index, variable in enumerate(self._ordinary_variables(optimizer)):
            store[str(index)] = variable.numpy()

    def _load_own_variables(self, optimizer, store) -> None:
        variables = self._ordinary_variables(optimizer)
        if len(store.keys()) != len(variables):
            raise ConfigurationError(
                f"The saved optimizer state has {len(store.keys())} variables; this "
                f"{type(optimizer).__name__} (with {self!r}) has {len(variables)} once built. "
                "Load it into the model and optimizer that saved it.")
        for index, variable in enumerate(variables):
            variable.assign(store[str(index)])

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

    def _build(self, optimizer, keras_build, variables, strategy) -> None:
        """The optimizer's state for one shard, per replica; the model's
        weights registered, so Keras accepts them in ``apply``."""
        import keras  # pylint: disable=import-outside-toplevel

        variables = list(variables)
        dtypes = {v.dtype for v in variables}
        if len(dtypes) != 1:
            raise ConfigurationError(
                f"{self!r} shards weights of one dtype; this model's trainable weights are "
                f"{sorted(str(d) for d in dtypes)}. Drop it for this model.")
        self._layout = ShardLayout.of(variables, strategy.num_replicas_in_sync)
        self._keys = [optimizer._var_key(v) for v in variables]  # pylint: disable=protected-access
        self._names = [v.path for v in variables]
        with strategy.scope():
            self._shard = keras.Variable(tf.zeros([self._layout.shard_size], dtypes.pop()),
                                         trainable=False, name="tfdist_shard")
        record = sharded_checkpoints.BuildRecord()
        with record.recording(optimizer):
            keras_build([self._shard])
        self._ordinary = sharded_checkpoints.OrdinaryLayout(
            record, sharded_checkpoints.Shards(strategy, self._layout), variables)
        for state in record.state_variables():  # (saved alone, one slice would pass for all)
            object.__setattr__(state.value, "_serialize_to_tensors", self._refuse_saving)
        indices = optimizer._trainable_variables_indices  # pylint: disable=protected-access
        for variable in variables:  # (apply checks they are known; never updated one by one)
            indices[optimizer._var_key(variable)] = 0  # pylint: disable=protected-access

    def _update(self, optimizer, grads, variables, learning_rate) -> None:
        """Keras' distributed update (``_backend_update_step``), sharded."""
        context = tf.distribute.get_replica_context()
        layout, shard = self._layout, self._shard.value
        variables = [v.value if hasattr(v, "value") else v for v in variables]
        dtype = shard.dtype
        replica = tf.get_static_value(context.replica_id_in_sync_group)
        if replica is None:
            raise ConfigurationError(f"{self!r} needs each replica's index when the step is "
                                     "traced (the mirrored strategies give it); this one does not.")
        grads, variables = self._in_built_order(optimizer, grads, variables)
        shard_gradient = self._summed_shard(optimizer, grads, variables, int(replica), context)
        shard_weights = layout.shard_of(variables, int(replica), dtype)

        def update_shards(strategy, weights, gradient):
            def update(variable, weights, gradient):
                variable.assign(weights)
                optimizer.update_step(gradient, variable, learning_rate)

            strategy.extended.update(shard, update, args=(weights, gradient), group=False)

        context.merge_call(update_shards, args=(shard_weights, shard_gradient))
        updated = tf.reshape(shard.read_value(), [layout.shard_size])
        gathered = context.all_gather(layout.slices(updated), axis=0)

        def assign_weights(strategy, values):
            for variable, value in zip(variables, values):
                strategy.extended.update(variable, lambda v, x: v.assign(x), args=(value,),
                                         group=False)

        context.merge_call(assign_weights, args=(layout.whole(gathered),))


    def _summed_shard(self, optimizer, grads, variables, replica: int, context) -> tf.Tensor:
        """Replica ``replica``'s slice of each weight's gradient, summed over
        the replicas: reduce-scattered weight by weight. What the optimizer's
        all-reduce would do first is done first: a model's own step's share
        of the loss scaling (`tfdist._internal.replica_share`) and, with
        `tfdist.communication.Compression`, the exchange in 16 bits."""
        layout, replicas = self._layout, self._layout.replicas
        launcher = collectives.replica_launcher(context.strategy, replica)
        if launcher is None:  # (no collective ops: the slice of the optimizer's all-reduce)
            reduced = optimizer._all_reduce_sum_gradients(  # pylint: disable=protected-access
                list(zip(grads, variables)))
            return layout.shard_of([gradient for gradient, _ in reduced], replica,
                                   self._shard.dtype)
        scale = replica_share.gradient_scale()
        compressed = compression.attached_to(optimizer)
        parts = []
        for index, gradient in enumerate(grads):
            gradient = tf.convert_to_tensor(replica_share.scaled_gradient(gradient, scale))
            own_dtype = gradient.dtype
            if compressed is not None:
                gradient = compressed.compress(gradient, replicas)
            summed = collectives.reduce_scatter_sum(launcher, layout.rows(index, gradient))
            if compressed is not None:
                summed = compressed.restore(summed, own_dtype, replicas)
            parts.append(tf.cast(summed, self._shard.dtype))
        return tf.concat(parts, axis=0)

    def _in_built_order(self, optimizer, grads, variables):
        """The gradients and weights in the order the state was built for;
        a weight left out (Keras drops those without a gradient) is an
        error, since a shard covers every weight."""
        given = {optimizer._var_key(v): (g, v)  # pylint: disable=protected-access
                 for g, v in zip(grads, variables)}
        missing = [name for key, name in zip(self._keys, self._names) if key not in given]
        if missing:
            raise ConfigurationError(
                f"{self!r}: the step updates only some of the weights the optimizer was built "
                f"for (no gradient for {missing[:3]}); sharded state covers every weight at "
                "each step. Give every trainable weight a gradient, or drop the sharding.")
        ordered = [given[key] for key in self._keys]
        return [g for g, _ in ordered], [v for _, v in ordered]


def _check_optimizer(sharding, optimizer) -> None:
    name = type(optimizer).__name__
    if not patches.has_gradient_all_reduce(optimizer) or name not in ELEMENTWISE:
        raise ConfigurationError(
            f"communication={sharding!r} needs a Keras optimizer that updates each weight "
            f"element from its own gradient and state ({', '.join(ELEMENTWISE)}); {name} "
            "is not one of them. Drop the sharding for this optimizer.")
    if getattr(optimizer, "use_ema", False):
        raise ConfigurationError(
            f"communication={sharding!r} with use_ema=True: not built yet (the moving "
            "averages would be a full copy per replica). Drop one of the two.")
