"""Which elements of each weight a replica owns under sharded optimizer
state (`tfdist.communication.sharding`): slice ``r`` of every weight,
flattened and padded to N equal slices; an embedding table's slices hold
whole rows (a range of rows each), so a lookup finds each row on one
replica (`tfdist.communication.table_lookups`)."""

import dataclasses
from typing import Tuple

import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """Which elements of each weight a replica owns: slice ``r`` of every
    weight, flattened and padded to N equal slices.

    >>> layout = ShardLayout(shapes=((2, 3), (2,)), replicas=2)
    >>> layout.slice_sizes
    (3, 1)
    >>> [row.tolist() for row in layout.rows(0, [[1., 2., 3.], [4., 5., 6.]]).numpy()]
    [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    >>> layout.whole(1, [7., 8.]).numpy().tolist()
    [7.0, 8.0]
    >>> table = ShardLayout(shapes=((5, 2),), replicas=2, by_rows=(0,))
    >>> table.slice_sizes, table.slice_rows(0)  # rows 0-2 on replica 0, 3-4 (and padding) on 1
    ((6,), 3)

    Attributes:
      shapes: each trainable weight's shape, in the optimizer's order.
      replicas: N, the number of shards.
      by_rows: the weights whose slices hold whole rows: ``ceil(rows / N)``
        rows each, the last slices padded (embedding tables looked up by
        rows); the others are cut in N equal runs of elements.
    """

    shapes: Tuple[Tuple[int, ...], ...]
    replicas: int
    by_rows: Tuple[int, ...] = ()

    @classmethod
    def of(cls, variables, replicas: int, by_rows=()) -> "ShardLayout":
        return cls(tuple(tuple(int(d) for d in v.shape) for v in variables), replicas,
                   tuple(by_rows))

    @property
    def sizes(self) -> Tuple[int, ...]:
        """Each weight's number of elements."""
        return tuple(int(tf.TensorShape(shape).num_elements()) for shape in self.shapes)

    @property
    def slice_sizes(self) -> Tuple[int, ...]:
        """Elements of each weight in one replica's slice (the last slices padded)."""
        return tuple(self.slice_rows(weight) * (size // max(self.shapes[weight][0], 1))
                     if weight in self.by_rows else -(-size // self.replicas)
                     for weight, size in enumerate(self.sizes))

    def slice_rows(self, weight: int) -> int:
        """Rows of weight ``weight`` (one of `by_rows`) in each replica's
        slice: replica ``r`` holds rows ``r * slice_rows`` onwards."""
        return -(-self.shapes[weight][0] // self.replicas)

    def rows(self, weight: int, tensor) -> tf.Tensor:
        """Weight ``weight``'s ``tensor`` (its shape) as ``[N, slice]``, row
        ``r`` replica ``r``'s slice (the last rows padded with zeros)."""
        size, length = self.sizes[weight], self.slice_sizes[weight]
        flat = tf.reshape(tf.convert_to_tensor(tensor), [-1])
        return tf.reshape(tf.pad(flat, [[0, length * self.replicas - size]]),
                          [self.replicas, length])

    def own_slice(self, weight: int, tensor, replica: int) -> tf.Tensor:
        """Row ``replica`` of `rows`, cut from ``tensor`` alone (the other
        rows are not made); from a NumPy array, as an array cut on the host."""
        size, length = self.sizes[weight], self.slice_sizes[weight]
        start = min(replica * length, size)
        stop = min(start + length, size)
        if isinstance(tensor, np.ndarray):  # (cut on the host: the whole never on a device)
            part = np.zeros([length], tensor.dtype)
            part[:stop - start] = tensor.reshape(-1)[start:stop]
            return part
        part = tf.reshape(tf.convert_to_tensor(tensor), [-1])[start:stop]
        return part if stop - start == length else tf.pad(part, [[0, length - (stop - start)]])

    def whole(self, weight: int, slices) -> tf.Tensor:
        """Weight ``weight`` from its N slices, one after the other in
        replica order (its shape, without the padding)."""
        slices, size = tf.convert_to_tensor(slices), self.sizes[weight]
        return tf.reshape(slices if slices.shape[0] == size else slices[:size],
                          self.shapes[weight])
