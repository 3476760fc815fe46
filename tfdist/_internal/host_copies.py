"""A background save's host copy of a value that is stored in slices.

TensorFlow's asynchronous checkpoint copies each saved object to the host
(``_copy_trackable_to_cpu(object_map)``) and writes the copies while
training goes on. An object whose value is read whole from per-replica
slices (sharded optimizer state, fully sharded weights) is copied as one
host variable of its whole value, made at the first save and assigned at
the next ones.

Within `worker_pieces_only` (tfdist's background saves across workers,
`tfdist.checkpoint.slice_writes`) it is copied as this worker's slices
only: `PiecesCopy`, host variables of the rectangles its replicas hold,
which the checkpoint writes as slices of the value (the other workers
write theirs; the chief merges them). No collective runs, and no host
holds more than its own slices.
"""

import contextlib
from typing import Callable

import tensorflow as tf
from tensorflow.python.trackable import base as trackable_base

from tfdist._internal.thread_values import ThreadValue

_VALUE = "VARIABLE_VALUE"  # the name a variable's value is saved under
_PIECES = ThreadValue(default=False)  # within `worker_pieces_only`


@contextlib.contextmanager
def worker_pieces_only():
    """Within this block (on this thread), host copies of values stored in
    slices hold this worker's pieces only."""
    with _PIECES.set_to(True):
        yield


def copying_pieces() -> bool:
    """True within `worker_pieces_only`."""
    return _PIECES.get()


class PiecesCopy(trackable_base.Trackable):
    """A host copy of one worker's pieces of a value: saved as slices of
    it, each under its slice spec (a worker holding none saves nothing)."""

    def __init__(self, pieces):
        with tf.device("/cpu:0"):
            self._pieces = {piece.spec: tf.Variable(host_copy(values), trainable=False)
                            for piece, values in pieces}

    def assign(self, pieces) -> None:
        for piece, values in pieces:
            self._pieces[piece.spec].assign(host_copy(values))

    def nbytes(self) -> int:
        return sum(v.shape.num_elements() * v.dtype.size for v in self._pieces.values())

    def _serialize_to_tensors(self):
        return {_VALUE: dict(self._pieces)}


def host_copy(values) -> tf.Tensor:
    """A copy of ``values`` on the host, never a view of the variable it was
    read from (an assign may keep the buffer it is given)."""
    with tf.device("/cpu:0"):
        return tf.raw_ops.DeepCopy(x=tf.convert_to_tensor(values))


def keep_host_copy(object_map: dict, trackable, whole: Callable[[], tf.Tensor],
                   worker_pieces: Callable = None) -> None:
    """``object_map[trackable]``: a host variable holding ``whole()``, or,
    within `worker_pieces_only`, a `PiecesCopy` of ``worker_pieces()``
    (a `tfdist.communication.sharded_checkpoints.WorkerPieces`; a host
    variable when this worker holds the whole value)."""
    value, pieces = None, None
    if worker_pieces is not None and copying_pieces():
        held = worker_pieces()
        value, pieces = held.whole, (None if held.whole is not None else held.pieces)
    if pieces is None:
        value = whole() if value is None else value
        if trackable not in object_map:
            with tf.device("/cpu:0"):
                object_map[trackable] = tf.Variable(value, trainable=False)
        else:
            object_map[trackable].assign(value)
    elif trackable not in object_map:
        object_map[trackable] = PiecesCopy(pieces)
    else:
        object_map[trackable].assign(pieces)


def nbytes(copy) -> int:
    """The bytes a host copy holds (a variable or a `PiecesCopy`)."""
    if isinstance(copy, PiecesCopy):
        return copy.nbytes()
    return copy.shape.num_elements() * copy.dtype.size
