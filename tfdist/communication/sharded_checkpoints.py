"""Sharded optimizer state saved in the ordinary Keras form.

With `tfdist.communication.ShardedOptimizerState` each replica holds one
slice of every state variable (Adam's momentum and velocity of slice ``r``
of each weight, one ``[slice]`` variable per weight and slot). What is saved
is nevertheless the ordinary Keras optimizer state: a checkpoint
(``tf.train.Checkpoint``, the Trainer's ``tfdist.CheckpointOptions``,
background saves) and ``model.save`` / ``save_weights`` see the optimizer
exactly as an unsharded one, with one whole state variable per weight
and slot, under the same names and in the same order. So a checkpoint written with sharded
state restores under any replica count, with or without the sharding, and
an ordinary checkpoint restores into sharded state.

How: each of the ordinary optimizer's state variables is stood for by a
`WholeSlot`, a checkpoint object that, when saved, puts the N slices of
one sharded state variable back together (from the worker's own replicas;
under a multi-worker strategy through one all-gather per weight and slot,
every worker taking part as every worker saves), and, when restored, keeps
only each local replica's slice of the whole value. Keras builds the shard
variables' state in the order it builds a whole model's (weight by weight,
slot by slot), so the optimizer's checkpoint children
(``_trackable_children``) and ``save_own_variables`` /
``load_own_variables`` list the views in Keras' own order, each in its
shard variable's place (`OrdinaryLayout`).

A save therefore holds the whole state once, on every worker, while it is
written (as an ordinary save does); training holds only the shards. A
background save across workers holds only each worker's own slices on its
host instead: `Shards.worker_pieces` cuts them into the rectangles the
checkpoint format stores slices in, each worker writes its own, and the
chief merges them into one checkpoint of the same ordinary form
(`tfdist.checkpoint.slice_writes`).

>>> import tempfile, keras, numpy as np, tensorflow as tf, tfdist
>>> strategy = tfdist.make_strategy("mirrored", num_replicas=2)
>>> with strategy.scope():
...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
...     model.compile(optimizer="adam", loss="mse")
>>> model = tfdist.attach(model, strategy,
...                       communication=tfdist.communication.ShardedOptimizerState())
>>> _ = model.fit(np.ones((4, 3)), np.ones((4, 2)), batch_size=4, verbose=0)
>>> [tuple(v.shape) for v in model.optimizer.variables]  # per replica: half of each weight
[(), (), (3,), (3,), (1,), (1,)]
>>> path = tf.train.Checkpoint(optimizer=model.optimizer).write(tempfile.mkdtemp() + "/ckpt")
>>> sorted(shape for name, shape in tf.train.list_variables(path) if "/_variables/" in name)
[[2], [2], [3, 2], [3, 2]]
"""

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tfdist._internal import collectives, flat_pieces, host_copies
from tfdist._internal.keras import optimizer as keras_optimizer, patches
from tfdist._internal.tensorflow import trackable_lists

_VALUE = "VARIABLE_VALUE"  # the name a variable's value is saved under


@dataclasses.dataclass
class BuildRecord:
    """The state variables Keras' ``build`` made, each with the index of
    the shard variable (so of the weight) it was made for, in the order
    they were made."""

    weight_of: Dict[int, int] = dataclasses.field(default_factory=dict)  # id(state) -> weight
    made: List[object] = dataclasses.field(default_factory=list)

    def recording(self, optimizer, shards: Sequence):
        """Notes the state variables ``optimizer`` makes from ``shards``
        during a ``with`` block (its ``build``)."""
        weight_of_shard = {id(shard): index for index, shard in enumerate(shards)}

        def made(reference_variable, variable) -> None:
            weight = weight_of_shard.get(id(reference_variable))
            if weight is not None:
                self.weight_of[id(variable)] = weight
                self.made.append(variable)

        return keras_optimizer.recording_state_variables(optimizer, made)

    def state_variables(self) -> List[object]:
        return list(self.made)


@dataclasses.dataclass
class WorkerPieces:
    """What one worker holds of one value stored in slices: the whole
    value when its replicas' slices cover every element, else the
    rectangles they cover (none when they hold only padding).

    Attributes:
      whole: the value, when this worker holds all of it.
      pieces: each rectangle (`tfdist._internal.flat_pieces.Piece`) with
        its values, in the rectangle's shape.
      replicas: the indices of this worker's replicas.
      all_replicas: N, the replicas the slices are spread over.
    """

    whole: Optional[tf.Tensor]
    pieces: List[Tuple[flat_pieces.Piece, tf.Tensor]]
    replicas: Tuple[int, ...]
    all_replicas: int


class Shards:
    """The sharded state variables' values on this worker, and how to read
    and write one of them whole."""

    def __init__(self, strategy: tf.distribute.Strategy, layout):
        self._strategy = strategy
        self._layout = layout
        ids = strategy.experimental_distribute_values_from_function(
            lambda context: context.replica_id_in_sync_group)
        self._replicas = [int(i) for i in strategy.experimental_local_results(ids)]
        self._gathers: Dict[int, object] = {}

    def shape_of(self, weight: int) -> tuple:
        """Weight ``weight``'s whole shape."""
        return tuple(self._layout.shapes[weight])

    def _components(self, state) -> list:
        return list(self._strategy.experimental_local_results(_tensorflow_variable(state)))

    def whole(self, state, weight: int) -> tf.Tensor:
        """``state`` (weight ``weight``'s slice of one slot) whole: the
        weight's shape."""
        layout = self._layout
        if len(self._replicas) == layout.replicas:  # every slice is on this worker
            by_replica = dict(zip(self._replicas, self._components(state)))
            with tf.device("/cpu:0"):
                slices = tf.concat([by_replica[r] for r in range(layout.replicas)], axis=0)
        else:
            slices = self._gather(state)()
        return layout.whole(weight, slices)

    def worker_pieces(self, state, weight: int) -> WorkerPieces:
        """This worker's slices of ``state`` as rectangles of the weight's
        shape, read without any collective (a background save's host copy,
        `tfdist.checkpoint.slice_writes`)."""
        layout, replicas = self._layout, tuple(sorted(self._replicas))
        shape, size = layout.shapes[weight], layout.sizes[weight]
        length = layout.slice_sizes[weight]
        by_replica = dict(zip(self._replicas, self._components(state)))
        if len(replicas) == layout.replicas:
            return WorkerPieces(self.whole(state, weight), [], replicas, layout.replicas)
        runs = []  # [start, stop, [values]]: this worker's runs of flat elements
        for replica in replicas:
            start, stop = min(replica * length, size), min((replica + 1) * length, size)
            if stop > start:
                values = by_replica[replica][:stop - start]
                if runs and runs[-1][1] == start:
                    runs[-1][1] = stop
                    runs[-1][2].append(values)
                else:
                    runs.append([start, stop, [values]])
        if len(runs) == 1 and runs[0][:2] == [0, size]:
            return WorkerPieces(tf.reshape(tf.concat(runs[0][2], 0), shape), [], replicas,
                                layout.replicas)
        cut = []
        for start, stop, values in runs:
            flat = tf.concat(values, 0)
            cut += [(piece, tf.reshape(flat[piece.start - start:piece.stop - start],
                                       piece.lengths))
                    for piece in flat_pieces.pieces(shape, start, stop)]
        return WorkerPieces(None, cut, replicas, layout.replicas)

    def _gather(self, state):
        """A traced all-gather of every replica's slice of ``state`` (one
        trace per state variable; its collective keys fixed,
        `tfdist._internal.collectives.function`)."""
        if id(state) not in self._gathers:
            strategy, variable = self._strategy, _tensorflow_variable(state)

            def gather():
                def replica_slice():
                    return tf.distribute.get_replica_context().all_gather(
                        tf.identity(variable), axis=0)

                return strategy.experimental_local_results(strategy.run(replica_slice))[0]

            self._gathers[id(state)] = collectives.function(gather)
        return self._gathers[id(state)]

    def assign_whole(self, state, weight: int, value, replica=None) -> None:
        """Keeps each local replica's slice of ``value`` (``state`` whole);
        with ``replica`` (inside that replica of a step: a constraint's
        result, which every replica computes) only that replica's. (Each
        replica writing every slice would make a replica's later read of its
        slice wait for the others' writes, which wait for its collectives.)"""
        if isinstance(value, np.ndarray) and tf.executing_eagerly():
            # (a weight being sliced: each slice cut on the host, so the
            # devices never hold the whole value beside the weight's copies)
            self._assign_host_slices(state, weight, value, replica)
            return
        rows = self._layout.rows(weight, tf.cast(value, state.dtype))
        for index, component in zip(self._replicas, self._components(state)):
            if replica is not None and index != replica:
                continue
            replica_rows = rows[index]
            # A row of ``rows`` is a view of the whole value's buffer, and an
            # assign may keep the buffer it is given: a copy, so that the
            # variable holds its slice, not the whole value.
            component.assign(tf.raw_ops.DeepCopy(x=replica_rows))


    def _assign_host_slices(self, state, weight: int, value: np.ndarray, replica) -> None:
        """`assign_whole` of a NumPy value: each local replica's slice cut
        from it and padded on the host, then assigned."""
        value = value.astype(tf.as_dtype(state.dtype).as_numpy_dtype, copy=False)
        for index, component in zip(self._replicas, self._components(state)):
            if replica is not None and index != replica:
                continue
            component.assign(self._layout.own_slice(weight, value, index))


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
        """A background save's host copy: a variable of the whole value, or
        of this worker's pieces of it (`tfdist._internal.host_copies`)."""
        host_copies.keep_host_copy(object_map, self,
                                   lambda: self._shards.whole(self._state, self._weight),
                                   self.worker_pieces)

    def worker_pieces(self) -> WorkerPieces:
        """This worker's slices, as `Shards.worker_pieces`."""
        return self._shards.worker_pieces(self._state, self._weight)

    @property
    def shape(self) -> tf.TensorShape:
        """The whole value's shape (the weight's)."""
        return tf.TensorShape(self._shards.shape_of(self._weight))

    def read_whole(self) -> tf.Tensor:
        """The whole value (a tensor of the weight's shape)."""
        return self._shards.whole(self._state, self._weight)

    def numpy(self):
        return self.read_whole().numpy()

    def assign(self, value) -> None:
        self._shards.assign_whole(self._state, self._weight, value)


class OrdinaryLayout:
    """The optimizer's state as an unsharded Keras optimizer lists it: each
    sharded state variable's `WholeSlot` view in its place.

    Keras' ``build`` makes state weight by weight (Adam: momentum and
    velocity of the first weight, then of the second...); given the shard
    variables in the weights' order, it makes theirs in the same order, so
    the ordinary list is the sharded one with each state variable replaced
    by its view. The optimizer's other variables (iterations, learning
    rate) keep their places.
    """

    def __init__(self, record: BuildRecord, shards: Shards, weights: Sequence):
        self._weights = list(weights)
        self._views = {id(state): WholeSlot(shards, state, record.weight_of[id(state)])
                       for state in record.state_variables()}
        self._record = BuildRecord()
        for state in record.state_variables():
            view = self._views[id(state)]
            self._record.weight_of[id(view)] = record.weight_of[id(state)]
            self._record.made.append(view)
        self._children = None

    def record(self) -> BuildRecord:
        """The views, each with its weight's index, in the order Keras
        made the state they stand for."""
        return self._record

    def variables(self, sharded_variables) -> list:
        """The ordinary ``optimizer.variables`` for the sharded ones."""
        return [self._views.get(id(variable), variable) for variable in sharded_variables]

    def children(self, sharded_children: dict) -> dict:
        """The optimizer's checkpoint children with the views in the shard
        variables' places: ``_variables`` and each slot's own list
        (``_momentums``) in the ordinary order, and the model's weights as
        ``_trainable_variables``. The lists are made once, so the
        checkpoint's objects stay the same from save to save."""
        if self._children is None:
            children = {}
            for name, child in sharded_children.items():
                if keras_optimizer.is_weights_child(name):
                    child = list(self._weights)
                elif _is_list(child) and any(id(item) in self._views for item in child):
                    child = self.variables(list(child))
                else:
                    children[name] = child
                    continue
                children[name] = trackable_lists.tracked_list(child)
            self._children = children
        return self._children


def save_in_ordinary_form(optimizer, ordinary_variables, what: str) -> None:
    """Makes ``optimizer``'s ``save_own_variables`` / ``load_own_variables``
    (``model.save``, ``save_weights``) write and read
    ``ordinary_variables()``: its state as an unsharded Keras optimizer
    lists it (each a variable or a `WholeSlot`). ``what``: how an error
    names the sharding."""
    from tfdist.errors import ConfigurationError  # pylint: disable=import-outside-toplevel

    def save_own_variables(store) -> None:
        for index, variable in enumerate(ordinary_variables()):
            store[str(index)] = variable.numpy()

    def load_own_variables(store) -> None:
        variables = ordinary_variables()
        if len(store.keys()) != len(variables):
            raise ConfigurationError(
                f"The saved optimizer state has {len(store.keys())} variables; this "
                f"{type(optimizer).__name__} (with {what}) has {len(variables)} once built. "
                "Load it into the model and optimizer that saved it.")
        for index, variable in enumerate(variables):
            variable.assign(store[str(index)])

    patches.replace_methods_of(optimizer, {"save_own_variables": save_own_variables,
                                           "load_own_variables": load_own_variables})


def _is_list(child) -> bool:
    return trackable_lists.is_list(child)
