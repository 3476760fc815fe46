"""Sharded optimizer state saved in the ordinary Keras form.

With `tfdist.communication.ShardedOptimizerState` each replica holds one
slice of every state variable (Adam's momentum and velocity of slice ``r``
of every weight, in one ``[shard_size]`` variable per slot). What is saved
is nevertheless the ordinary Keras optimizer state: a checkpoint
(``tf.train.Checkpoint``, the Trainer's ``checkpoint_dir``, background
saves) and ``model.save`` / ``save_weights`` see the optimizer exactly as
an unsharded one, with one whole state variable per weight and slot, under
the same names and in the same order. So a checkpoint written with sharded
state restores under any replica count, with or without the sharding, and
an ordinary checkpoint restores into sharded state.

How: each of the ordinary optimizer's state variables is stood for by a
`WholeSlot`, a checkpoint object that, when saved, puts weight ``i``'s
slices of one slot back together (from the worker's own replicas; under a
multi-worker strategy through one all-gather per weight and slot, every
worker taking part as every worker saves), and, when restored, keeps only
each local replica's slice of the whole value. The optimizer's checkpoint
children (``_trackable_children``) and ``save_own_variables`` /
``load_own_variables`` list these in Keras' own order (`OrdinaryLayout`).

A save therefore holds the whole state once, on every worker, while it is
written (as an ordinary save does); training holds only the shards.

>>> import tempfile, keras, numpy as np, tensorflow as tf, tfdist
>>> strategy = tfdist.make_strategy("mirrored", num_replicas=2)
>>> with strategy.scope():
...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
...     model.compile(optimizer="adam", loss="mse")
>>> model = tfdist.attach(model, strategy,
...                       communication=tfdist.communication.ShardedOptimizerState())
>>> _ = model.fit(np.ones((4, 3)), np.ones((4, 2)), batch_size=4, verbose=0)
>>> [tuple(v.shape) for v in model.optimizer.variables]  # per replica: half of 8 weights
[(), (), (4,), (4,)]
>>> path = tf.train.Checkpoint(optimizer=model.optimizer).write(tempfile.mkdtemp() + "/ckpt")
>>> sorted(shape for name, shape in tf.train.list_variables(path) if "/_variables/" in name)
[[2], [2], [3, 2], [3, 2]]
"""

import dataclasses
from typing import Dict, List, Sequence

import tensorflow as tf
from tensorflow.python.trackable import data_structures

from tfdist._internal import collectives

_VALUE = "VARIABLE_VALUE"  # the name a variable's value is saved under


@dataclasses.dataclass
class BuildRecord:
    """The state variables Keras' ``build`` made for the shard, in the
    groups it made them in: one group per ``add_optimizer_variables`` call
    (Adam: momentum and velocity together; amsgrad's ``velocity_hat`` in a
    group of its own), one per lone ``add_variable_from_reference``."""

    groups: List[List[object]] = dataclasses.field(default_factory=list)

    def recording(self, optimizer) -> "_Recording":
        """Wraps ``optimizer``'s two ways of making state variables for the
        duration of a ``with`` block (its ``build``)."""
        return _Recording(self, optimizer)

    def state_variables(self) -> List[object]:
        return [variable for group in self.groups for variable in group]


class _Recording:
    """Notes each state variable ``build`` makes into a `BuildRecord`."""

    def __init__(self, record: BuildRecord, optimizer):
        self._record, self._optimizer = record, optimizer
        self._in_group = False  # inside an add_optimizer_variables call

    def __enter__(self) -> BuildRecord:
        optimizer, groups = self._optimizer, self._record.groups
        make_one, make_group = (optimizer.add_variable_from_reference,
                                optimizer.add_optimizer_variables)

        def add_variable_from_reference(*args, **kwargs):
            variable = make_one(*args, **kwargs)
            if self._in_group:
                groups[-1].append(variable)
            else:
                groups.append([variable])
            return variable

        def add_optimizer_variables(*args, **kwargs):
            groups.append([])
            self._in_group = True
            try:
                return make_group(*args, **kwargs)
            finally:
                self._in_group = False

        object.__setattr__(optimizer, "add_variable_from_reference", add_variable_from_reference)
        object.__setattr__(optimizer, "add_optimizer_variables", add_optimizer_variables)
        return self._record

    def __exit__(self, *unused) -> None:
        for name in ("add_variable_from_reference", "add_optimizer_variables"):
            self._optimizer.__dict__.pop(name, None)


class Shards:
    """One sharded state variable's values on this worker, and how to read
    and write the whole of one weight's part of it."""

    def __init__(self, strategy: tf.distribute.Strategy, layout):
        self._strategy = strategy
        self._layout = layout
        self._offsets = layout.offsets
        ids = strategy.experimental_distribute_values_from_function(
            lambda context: context.replica_id_in_sync_group)
        self._replicas = [int(i) for i in strategy.experimental_local_results(ids)]
        self._gathers: Dict[tuple, object] = {}

    def _components(self, state) -> list:
        return list(self._strategy.experimental_local_results(_tensorflow_variable(state)))

    def whole(self, state, weight: int) -> tf.Tensor:
        """Weight ``weight``'s part of ``state``, whole (its shape)."""
        layout = self._layout
        offset, length = self._offsets[weight], layout.slice_sizes[weight]
        if len(self._replicas) == layout.replicas:  # every slice is on this worker
            by_replica = dict(zip(self._replicas, self._components(state)))
            with tf.device("/cpu:0"):
                slices = tf.concat([by_replica[r][offset:offset + length]
                                    for r in range(layout.replicas)], axis=0)
        else:
            slices = self._gather(state, length)(tf.constant(offset, tf.int32))
        return tf.reshape(slices[:layout.sizes[weight]], layout.shapes[weight])

    def _gather(self, state, length: int):
        """A traced all-gather of every replica's ``length`` elements of
        ``state`` from an offset (one trace per state variable and length;
        its collective keys fixed, `tfdist._internal.collectives.function`)."""
        key = (id(state), length)
        if key not in self._gathers:
            strategy, variable = self._strategy, _tensorflow_variable(state)

            def gather(offset):
                def replica_slice():
                    value = tf.slice(tf.identity(variable), [offset], [length])
                    return tf.distribute.get_replica_context().all_gather(value, axis=0)

                return strategy.experimental_local_results(strategy.run(replica_slice))[0]

            self._gathers[key] = collectives.function(gather)
        return self._gathers[key]

    def assign_whole(self, state, weight: int, value) -> None:
        """Keeps each local replica's slice of ``value`` (weight ``weight``'s
        whole part of ``state``)."""
        layout = self._layout
        offset, length = self._offsets[weight], layout.slice_sizes[weight]
        rows = layout.rows(weight, tf.cast(value, state.dtype))
        for replica, component in zip(self._replicas, self._components(state)):
            component[offset:offset + length].assign(rows[replica])


def _tensorflow_variable(variable):
    return getattr(variable, "value", variable)


class WholeSlot(tf.__internal__.tracking.Trackable):
    """What a checkpoint sees of one weight's part of one sharded state
    variable: a variable of the weight's shape (module doc)."""

    def __init__(self, shards: Shards, state, weight: int):
        self._shards, self._state, self._weight = shards, state, weight

    def _serialize_to_tensors(self):
        return {_VALUE: self._shards.whole(self._state, self._weight)}

    def _restore_from_tensors(self, restored_tensors):
        self._shards.assign_whole(self._state, self._weight, restored_tensors[_VALUE])

    def _copy_trackable_to_cpu(self, object_map):
        """A background save's host copy: a variable of the whole value."""
        whole = self._shards.whole(self._state, self._weight)
        if self not in object_map:
            with tf.device("/cpu:0"):
                object_map[self] = tf.Variable(whole, trainable=False)
        else:
            object_map[self].assign(whole)

    def numpy(self):
        return self._shards.whole(self._state, self._weight).numpy()

    def assign(self, value) -> None:
        self._shards.assign_whole(self._state, self._weight, value)


class OrdinaryLayout:
    """The optimizer's state as an unsharded Keras optimizer lists it,
    made of the sharded state's `WholeSlot` views.

    Keras' ``add_optimizer_variables`` makes a group's variables weight by
    weight (Adam: momentum and velocity of the first weight, then of the
    second...), so each recorded group of shard variables stands for
    ``len(group) * weights`` ordinary variables in that order; the
    optimizer's other variables (iterations, learning rate) keep their
    places.
    """

    def __init__(self, record: BuildRecord, shards: Shards, weights: Sequence):
        self._record = record
        self._weights = list(weights)
        self._views = {id(state): [WholeSlot(shards, state, i) for i in range(len(weights))]
                       for state in record.state_variables()}
        self._children = None

    def variables(self, sharded_variables) -> list:
        """The ordinary ``optimizer.variables`` for the sharded ones."""
        group_of = {id(state): group for group in self._record.groups for state in group}
        ordinary, done = [], set()
        for variable in sharded_variables:
            group = group_of.get(id(variable))
            if group is None:
                ordinary.append(variable)
            elif id(group[0]) not in done:
                done.add(id(group[0]))
                ordinary.extend(self._views[id(state)][i]
                                for i in range(len(self._weights)) for state in group)
        return ordinary

    def children(self, sharded_children: dict) -> dict:
        """The optimizer's checkpoint children with the views in the shard
        variables' places: ``_variables`` in the ordinary order, each slot's
        own list (``_momentums``) one view per weight, and the model's
        weights as ``_trainable_variables``. The lists are made once, so
        the checkpoint's objects stay the same from save to save."""
        if self._children is None:
            children = {}
            for name, child in sharded_children.items():
                if name == "_variables":
                    child = self.variables(list(child))
                elif name == "_trainable_variables":
                    child = list(self._weights)
                elif _is_list(child) and any(id(item) in self._views for item in child):
                    child = [view for item in child for view in self._views[id(item)]]
                else:
                    children[name] = child
                    continue
                children[name] = data_structures.ListWrapper(child)
            self._children = children
        return self._children


def _is_list(child) -> bool:
    return isinstance(child, (list, tuple, data_structures.ListWrapper))
