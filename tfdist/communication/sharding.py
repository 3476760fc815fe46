"""Sharded optimizer state (ZeRO stage 1): each replica keeps the optimizer
state of 1/N of the weights.

Every synchronous strategy keeps a full copy of the optimizer's state on
every replica: with Adam, two moments per weight, so twice the weights'
bytes per replica before a single activation. With ``ShardedOptimizerState``
the optimizer's state covers one slice of the weights per replica:

1. each replica flattens its gradients into one vector and the replicas sum
   it; replica ``r`` keeps slice ``r`` of the sum (its shard);
2. replica ``r`` applies the user's Keras optimizer (its own ``update_step``,
   so Adam is Adam) to slice ``r`` of the weights, with the state of that
   slice only;
3. the updated slices are all-gathered, and every replica's weights are
   the whole again.

The math is the one-device math: an elementwise optimizer (SGD, momentum,
Adam, AdamW, RMSprop, Adagrad, Adamax, Adadelta, Lion) updates each weight
element from its own gradient and state, so a replica that owns 1/N of the
elements computes the same numbers. Optimizers that look across elements
(LAMB's per-layer norms, Adafactor's factored moments, Muon) and Nadam
(whose shared momentum product Keras updates per step) are refused by name.

What works, and what is refused (a `ConfigurationError` saying why):

- MirroredStrategy; one replica (nothing to shard: the plain update).
- Gradient clipping (tfdist clips the batch's gradient before the optimizer
  sees it, `tfdist.replica.gradients`), weight decay (on the whole weights,
  as Keras does), mixed precision (the inner optimizer of a
  LossScaleOptimizer is sharded), sparse ``Embedding`` gradients (summed
  dense: the shard is a slice of every weight).
- Refused for now: checkpoints of the optimizer state (the state lives in
  N pieces; a saved form that restores under any replica count is the next
  step), ``use_ema``, ``gradient_accumulation_steps``, LocalSGD, Compression,
  MultiWorkerMirroredStrategy, ParameterServerStrategy and TPUStrategy.

The exchange is, for now, the optimizer's own gradient all-reduce (each
replica keeps its slice of the sum) and one all-gather of the updated
slices: 1.5 times a ring all-reduce's bytes, not the reduce-scatter a
later step will use.
"""

import dataclasses
from typing import List, Tuple

import tensorflow as tf

from tfdist._internal.keras import patches
from tfdist.errors import ConfigurationError

_WRAPPED = "_tfdist_sharded_state"
# Keras optimizers whose update of a weight element reads only that
# element's gradient and state (and global scalars: the step, the rate).
ELEMENTWISE = ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adamax", "Adadelta", "Lion")


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """Where each weight sits in the flat vector, and each replica's slice.

    Attributes:
      shapes: each trainable weight's shape, in the optimizer's order.
      sizes: each weight's number of elements.
      replicas: N, the number of shards.
      shard_size: elements per shard (the flat vector padded to N of them).
    """

    shapes: Tuple[Tuple[int, ...], ...]
    sizes: Tuple[int, ...]
    replicas: int
    shard_size: int

    @classmethod
    def of(cls, variables, replicas: int) -> "ShardLayout":
        shapes = tuple(tuple(int(d) for d in v.shape) for v in variables)
        sizes = tuple(int(tf.TensorShape(s).num_elements()) for s in shapes)
        return cls(shapes, sizes, replicas, -(-sum(sizes) // replicas))

    @property
    def padding(self) -> int:
        """Zeros after the last weight, so that N shards cover the vector."""
        return self.shard_size * self.replicas - sum(self.sizes)

    def flatten(self, tensors, dtype) -> tf.Tensor:
        """One vector of every tensor (dense), padded to N shards."""
        parts = [tf.reshape(tf.cast(tf.convert_to_tensor(t), dtype), [-1]) for t in tensors]
        parts.append(tf.zeros([self.padding], dtype))
        return tf.concat(parts, axis=0)

    def shard_of(self, flat: tf.Tensor, replica_id) -> tf.Tensor:
        """Replica ``replica_id``'s slice of a flat vector."""
        return tf.slice(flat, [replica_id * self.shard_size], [self.shard_size])

    def unflatten(self, flat: tf.Tensor) -> List[tf.Tensor]:
        """The weights' tensors from a flat vector (padding dropped)."""
        parts = tf.split(flat, list(self.sizes) + [self.padding])[:-1]
        return [tf.reshape(part, shape) for part, shape in zip(parts, self.shapes)]


class ShardedOptimizerState:
    """Each replica keeps the optimizer state of 1/N of the weights (module
    doc). Pass it as ``communication=`` to `tfdist.Trainer` or `tfdist.attach`."""

    def __init__(self):
        self._layout = None
        self._shard = None  # a variable of one shard's elements, per replica

    def __repr__(self) -> str:
        return "ShardedOptimizerState()"

    def attach_to(self, model, strategy: tf.distribute.Strategy) -> None:
        """Makes ``model``'s optimizer keep a shard of its state per replica,
        checking first what cannot combine with it. Once per optimizer."""
        _check_strategy(self, strategy)
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
        for method in ("save_own_variables", "load_own_variables"):
            object.__setattr__(target, method, self._refuse_saving)

    def _refuse_saving(self, *unused) -> None:
        """``model.save``, ``save_weights``, ``ModelCheckpoint`` and
        ``tf.train.Checkpoint`` would write one replica's slice as the whole
        state: an error instead."""
        del unused
        raise ConfigurationError(
            f"The optimizer keeps sharded state ({self!r}): saving or loading it is not built "
            "yet (each replica holds one slice). Save `model.get_weights()`, or drop the "
            "sharding to save checkpoints.")

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
        with strategy.scope():
            self._shard = keras.Variable(tf.zeros([self._layout.shard_size], dtypes.pop()),
                                         trainable=False, name="tfdist_shard")
        keras_build([self._shard])
        for state in optimizer.variables:  # (tf.train.Checkpoint would save one slice)
            if tuple(state.shape) == (self._layout.shard_size,):
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
        # The optimizer's own all-reduce, with what tfdist adds to it (a
        # model's own step: the replica's share of the loss scaling).
        reduced = optimizer._all_reduce_sum_gradients(  # pylint: disable=protected-access
            list(zip(grads, variables)))
        summed = layout.flatten([gradient for gradient, _ in reduced], dtype)
        replica = context.replica_id_in_sync_group
        shard_gradient = layout.shard_of(summed, replica)
        shard_weights = layout.shard_of(layout.flatten(variables, dtype), replica)

        def update_shards(strategy, weights, gradient):
            def update(variable, weights, gradient):
                variable.assign(weights)
                optimizer.update_step(gradient, variable, learning_rate)

            strategy.extended.update(shard, update, args=(weights, gradient), group=False)

        context.merge_call(update_shards, args=(shard_weights, shard_gradient))
        updated = context.all_gather(tf.reshape(shard.read_value(), [layout.shard_size]), axis=0)

        def assign_weights(strategy, values):
            for variable, value in zip(variables, values):
                strategy.extended.update(variable, lambda v, x: v.assign(x), args=(value,),
                                         group=False)

        context.merge_call(assign_weights, args=(layout.unflatten(updated),))


def _check_strategy(sharding, strategy) -> None:
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        raise ConfigurationError(
            f"communication={sharding!r} shards the state of synchronous replicas; under "
            "ParameterServerStrategy the state already lives once, on the ps. Drop it.")
    if isinstance(strategy, (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy,
                             tf.distribute.MultiWorkerMirroredStrategy)):
        raise ConfigurationError(
            f"communication={sharding!r} runs under MirroredStrategy for now; "
            f"{type(strategy).__name__} is not built yet. Drop it.")


def _check_optimizer(sharding, optimizer) -> None:
    name = type(optimizer).__name__
    if not patches.has_gradient_all_reduce(optimizer) or name not in ELEMENTWISE:
        raise ConfigurationError(
            f"communication={sharding!r} needs a Keras optimizer that updates each weight "
            f"element from its own gradient and state ({', '.join(ELEMENTWISE)}); {name} "
            "is not one of them. Drop the sharding for this optimizer.")
    refused = {"use_ema": "the moving averages would be a full copy per replica",
               "gradient_accumulation_steps": "the accumulators would be a full copy per "
                                              "replica"}
    for option, why in refused.items():
        if getattr(optimizer, option, None):
            raise ConfigurationError(
                f"communication={sharding!r} with {option}={getattr(optimizer, option)!r}: "
                f"not built yet ({why}). Drop one of the two.")
