"""Keras weights whose TensorFlow storage holds one replica's slice
(`tfdist.communication.FullySharded`): the one place that changes how a
Keras variable is stored and read.

A Keras 3 variable on TensorFlow keeps its value in a ``tf.Variable``
(``_value``) and is read through it: TensorFlow ops convert it with
``__tf_tensor__``, NumPy with ``numpy`` / ``__array__``, its operators
(``w * 2``) and ``[...]`` through ``value``, checkpoints through
``_serialize_to_tensors``. `store_in_slices` gives one variable a
storage of per-replica slices (a distributed ``tf.Variable`` of shape
``[slice]`` whose replicas hold different elements) and a class, made
once per Keras variable class, whose reads are of the whole weight:

- inside a replica of a training step, ``read_in_replica`` (an all-gather
  of the slices, whose gradient is the reduce-scatter of the whole
  weight's gradient into the replica's slice);
- anywhere else (``get_weights``, saving, a callback), ``whole`` reads it
  from the slices, and ``assign_whole`` stores a whole value as slices.

``variable.value`` stays the storage, so what reaches the variable's
TensorFlow handle (``GradientTape``, the optimizer's update and its
state's keys) is the slice: the gradient a tape returns for the variable
is the replica's slice of the batch's gradient.
"""

from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from tfdist._internal import host_copies

# Operators Keras' Variable implements through ``self.value``: here through
# the whole weight (a tensor), with TensorFlow's semantics for each.
_OPERATORS = (
    "__neg__", "__abs__", "__invert__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__",
    "__ge__", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
    "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__",
    "__pow__", "__rpow__", "__matmul__", "__rmatmul__", "__and__", "__rand__", "__or__",
    "__ror__", "__xor__", "__rxor__", "__getitem__",
)
_VALUE = "VARIABLE_VALUE"  # the key a variable's value is saved under
_CLASSES = {}  # Keras variable class -> its sliced subclass
_READS = "_tfdist_sliced_reads"


class SlicedReads:
    """How one sliced weight is read and written whole.

    Attributes:
      read_in_replica: the whole weight inside a replica of a step (a
        tensor, differentiable with respect to the storage), or None
        outside one (then `whole` is used).
      whole: the whole weight from every replica's slice (a tensor).
      assign_whole: stores a whole value as each replica's slice.
      worker_pieces: this worker's slices, cut into the rectangles a
        checkpoint stores slices in (a background save across workers,
        `tfdist._internal.host_copies`).
      rows_in_replica: for a table whose slices hold whole rows,
        ``rows_in_replica(ids)``: the rows of ``ids`` (a 1-D tensor of
        non-negative ids) inside a replica of a step, differentiable with
        respect to the storage, without reading the table whole; None
        where it cannot (outside a step), or None for other weights.
    """

    def __init__(self, read_in_replica: Callable, whole: Callable, assign_whole: Callable,
                 worker_pieces: Callable, rows_in_replica: Optional[Callable] = None):
        self.read_in_replica = read_in_replica
        self.whole = whole
        self.assign_whole = assign_whole
        self.worker_pieces = worker_pieces
        self.rows_in_replica = rows_in_replica

    def read(self):
        value = self.read_in_replica()
        return self.whole() if value is None else value


def _whole(variable) -> tf.Tensor:
    return variable._maybe_autocast(getattr(variable, _READS).read())  # pylint: disable=protected-access


def _sliced_class(base: type) -> type:
    if base in _CLASSES:
        return _CLASSES[base]

    def tf_tensor(self, dtype=None, name=None):
        return tf.convert_to_tensor(_whole(self), dtype=dtype, name=name)

    def numpy(self):
        return np.asarray(getattr(self, _READS).whole())

    def array(self, dtype=None, copy=None):
        del copy  # (a new array either way)
        return np.asarray(getattr(self, _READS).whole(), dtype=dtype)

    def direct_assign(self, value):
        getattr(self, _READS).assign_whole(tf.cast(value, self.dtype))

    def serialize_to_tensors(self):
        return {_VALUE: getattr(self, _READS).whole()}

    def restore_from_tensors(self, restored_tensors):
        getattr(self, _READS).assign_whole(restored_tensors[_VALUE])

    def copy_trackable_to_cpu(self, object_map):
        reads = getattr(self, _READS)
        host_copies.keep_host_copy(object_map, self, reads.whole, reads.worker_pieces)

    def worker_pieces(self):
        return getattr(self, _READS).worker_pieces()

    def operator(name):
        return lambda self, *args: getattr(tf.convert_to_tensor(_whole(self)), name)(*args)

    methods = {
        "__tf_tensor__": tf_tensor, "numpy": numpy, "__array__": array,
        "_direct_assign": direct_assign, "_serialize_to_tensors": serialize_to_tensors,
        "_restore_from_tensors": restore_from_tensors,
        "_copy_trackable_to_cpu": copy_trackable_to_cpu, "worker_pieces": worker_pieces,
        "__hash__": base.__hash__,  # (as unhashable as Keras' own: it defines __eq__)
    }
    methods.update({name: operator(name) for name in _OPERATORS})
    _CLASSES[base] = type(f"Sliced{base.__name__}", (base,), methods)
    return _CLASSES[base]


def store_in_slices(variable, storage: tf.Variable, reads: SlicedReads) -> None:
    """Makes ``storage`` (a distributed variable of the replicas' slices)
    hold Keras variable ``variable``, read whole through ``reads``; its
    former storage is released to Python's collector."""
    variable._value = storage  # pylint: disable=protected-access
    object.__setattr__(variable, _READS, reads)
    variable.__class__ = _sliced_class(type(variable))


def is_sliced(variable) -> bool:
    return hasattr(variable, _READS)


def read(variable) -> tf.Tensor:
    """A sliced weight's value, whole, in its own dtype (inside a replica
    of a step: the gather ``read_in_replica`` makes)."""
    return getattr(variable, _READS).read()


def rows(variable, ids) -> Optional[tf.Tensor]:
    """The rows of ``ids`` of a sliced table, looked up where they live
    (`SlicedReads.rows_in_replica`), or None where that is not built for
    this weight or not here (then read it whole)."""
    reads = getattr(variable, _READS, None)
    if reads is None or reads.rows_in_replica is None:
        return None
    return reads.rows_in_replica(ids)


def whole(variable) -> tf.Tensor:
    """A sliced weight's value put together from every replica's slice
    (outside a step: a save, ``get_weights``)."""
    return getattr(variable, _READS).whole()


def storage(variable) -> tf.Variable:
    """The ``tf.Variable`` a Keras variable keeps its value in (a sliced
    one's: the replicas' slices)."""
    return variable._value  # pylint: disable=protected-access
