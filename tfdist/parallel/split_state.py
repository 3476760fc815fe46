"""A tensor-parallel model's optimizer state saved in the ordinary Keras
form (`tfdist.parallel.tensor_parallel`).

The user's optimizer is built for the split weights' shards, so it keeps
one state variable per shard and slot (Adam: the momentum and velocity of
each of the k shards of ``d1/kernel``), each beside its shard. What is
saved is the state of an unsplit optimizer: one whole variable per weight
and slot, in Keras' order, under its names. So ``model.save`` loads in
plain Keras (``keras.models.load_model``), a ``tf.train.Checkpoint`` of
the optimizer restores into a model without the layout or with another
one, and an ordinary checkpoint restores into the shards.

How: Keras' ``build`` makes state shard by shard, in the order of the
weights it is given, the same states for each shard; so the i-th state
made for shard j of a weight is part j of the weight's i-th state. Each
weight's i-th state is stood for by one view (a
`tfdist.communication.sharded_checkpoints.WholeSlot`), which joins its
shards' states when saved and splits a restored value into them; the
views take the places of shard 0's states in every list a checkpoint and
``save_own_variables`` read, and the other shards' states are left out.
"""

import dataclasses
from typing import Dict, List, Sequence

import tensorflow as tf

from tfdist._internal import flat_pieces
from tfdist._internal.keras import optimizer as keras_optimizer, patches
from tfdist._internal.tensorflow import trackable_lists
from tfdist.communication import sharded_checkpoints
from tfdist.communication.sharded_checkpoints import WholeSlot, WorkerPieces


@dataclasses.dataclass(frozen=True)
class SplitState:
    """One weight's i-th state variable, as its shards' states."""

    parts: tuple
    dimension: int


class ShardStates:
    """Reads and writes a `SplitState` whole (what a `WholeSlot` asks)."""

    @staticmethod
    def whole(state: SplitState, weight: int) -> tf.Tensor:
        del weight
        with tf.device("/cpu:0"):
            return tf.concat([_read(p) for p in state.parts], axis=state.dimension)

    def assign_whole(self, state: SplitState, weight: int, value, replica=None) -> None:
        del weight, replica
        value = tf.cast(tf.convert_to_tensor(value), _read(state.parts[0]).dtype)
        for part, piece in zip(state.parts, tf.split(value, len(state.parts),
                                                     axis=state.dimension)):
            part.assign(piece)

    def worker_pieces(self, state: SplitState, weight: int) -> WorkerPieces:
        del weight
        if not isinstance(state.parts[0], WholeSlot):
            return WorkerPieces(self.whole(state, 0), [], (0,), 1)  # (every shard is local)
        return joined_worker_pieces([part.worker_pieces() for part in state.parts],
                                    [tuple(part.shape) for part in state.parts],
                                    state.dimension)


def joined_worker_pieces(parts: Sequence[WorkerPieces], shapes: Sequence[tuple],
                        dimension: int) -> WorkerPieces:
    """What this worker holds of a weight split along ``dimension`` into
    parts of ``shapes``, each part's held as ``parts`` (its slices over the
    replicas, `tfdist.communication.sharded_checkpoints.Shards.worker_pieces`):
    the whole weight when the worker holds every part whole, else each
    part's rectangles moved to where the part sits in the weight, so a
    background save copies only the worker's own slices to its host
    (`tfdist.checkpoint.slice_writes`)."""
    if all(part.whole is not None for part in parts):
        with tf.device("/cpu:0"):
            whole = tf.concat([part.whole for part in parts], axis=dimension)
        return WorkerPieces(whole, [], parts[0].replicas, parts[0].all_replicas)
    whole_shape = list(shapes[0])
    whole_shape[dimension] = sum(shape[dimension] for shape in shapes)
    pieces, offset = [], 0
    for part, shape in zip(parts, shapes):
        if part.whole is not None:  # (a small part whose elements this worker holds)
            offsets = [0] * len(shape)
            offsets[dimension] = offset
            pieces.append((flat_pieces.Piece(tuple(whole_shape), tuple(offsets), tuple(shape),
                                             0, 0), part.whole))
        for piece, values in part.pieces:
            offsets = list(piece.offsets)
            offsets[dimension] += offset
            pieces.append((flat_pieces.Piece(tuple(whole_shape), tuple(offsets), piece.lengths,
                                             piece.start, piece.stop), values))
        offset += shape[dimension]
    return WorkerPieces(None, pieces, parts[0].replicas, parts[0].all_replicas)


def _read(part) -> tf.Tensor:
    """A shard's state variable's value (or its gradient accumulation's
    sum); whole when fully sharded weights keep it in slices over the data
    axis (a `WholeSlot`)."""
    if isinstance(part, WholeSlot):
        return part.read_whole()
    return tf.convert_to_tensor(part)  # (a sync-on-read sum: its total over the replicas)


class OrdinaryState:
    """The optimizer's lists as an unsplit optimizer has them (module doc)."""

    def __init__(self, record: sharded_checkpoints.BuildRecord, shards: Sequence,
                 weights: Sequence):
        """``record``: the states Keras' build made, each by its shard's
        index in ``shards`` (each shard a ``(weight index, part j,
        dimension)`` triple in ``record``'s terms); ``weights``: the
        model's trainable weights (what the optimizer lists as its own)."""
        self._weights = list(weights)
        made_for: Dict[int, List] = {}
        for state in record.state_variables():
            made_for.setdefault(record.weight_of[id(state)], []).append(state)
        self._views, self._dropped = {}, set()
        groups: Dict[int, List[int]] = {}
        for index, (weight, part, _) in enumerate(shards):
            groups.setdefault(weight, []).append(index)
        for weight, indices in groups.items():
            if len(indices) == 1:
                continue
            dimension = shards[indices[0]][2]
            per_shard = [made_for.get(index, []) for index in indices]
            for slot, first in enumerate(per_shard[0]):
                parts = tuple(states[slot] for states in per_shard)
                self._views[id(first)] = WholeSlot(ShardStates(), SplitState(parts, dimension),
                                                   weight)
                self._dropped.update(id(p) for p in parts[1:])
        self._children = None

    def variables(self, split_variables) -> list:
        return [self._views.get(id(v), v) for v in split_variables if id(v) not in self._dropped]

    def children(self, split_children: dict) -> dict:
        if self._children is None:
            children = {}
            for name, child in split_children.items():
                if keras_optimizer.is_weights_child(name):
                    children[name] = trackable_lists.tracked_list(self._weights)
                elif trackable_lists.is_list(child) and any(
                        id(item) in self._views or id(item) in self._dropped for item in child):
                    children[name] = trackable_lists.tracked_list(self.variables(list(child)))
                else:
                    children[name] = child
            self._children = children
        return self._children


def joined_by_weight(parts: Sequence, weights: Sequence, shards_of, dimension_of) -> list:
    """``parts`` (one saved object per shard of ``weights``, in the flat
    order: each split weight's shards in its place) joined into one per
    weight: a split weight's a view of its shards' (a `WholeSlot`), an
    unsplit one's as it is. What gradient accumulation saves for a split
    model (`tfdist.replica.accumulation.sums_saved_as`)."""
    parts, joined = list(parts), []
    for index, weight in enumerate(weights):
        count = len(shards_of(weight) or [weight])
        own, parts = parts[:count], parts[count:]
        joined.append(own[0] if count == 1 else WholeSlot(
            ShardStates(), SplitState(tuple(own), dimension_of(weight)), index))
    return joined


def save_whole(optimizer, ordinary: OrdinaryState, below=None) -> None:
    """Makes ``optimizer`` save and load through ``ordinary`` (its
    checkpoint children, ``save_own_variables`` / ``load_own_variables``).
    ``below``: the optimizer's variables as fully sharded weights save
    them (each shard's state whole, `tfdist.communication.FullySharded`
    over the data axis), which ``ordinary`` then joins by weight; by
    default its own variables."""
    patches.replace_checkpoint_children_of(optimizer, ordinary.children)
    below = below or (lambda: list(optimizer.variables))

    sharded_checkpoints.save_in_ordinary_form(
        optimizer, lambda: ordinary.variables(below()), "a tensor-parallel layout")
