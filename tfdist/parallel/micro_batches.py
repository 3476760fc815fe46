"""A batch cut into a pipeline's micro-batches (`tfdist.parallel.pipeline`).

A batch of B rows is cut into m micro-batches of ``ceil(B / m)`` rows,
the last ones shorter, and those past the end empty (B < m, or a B that m
does not divide). B is known only when the step runs, so every micro-batch
is traced. An empty one runs on one row of the batch, masked (``mask``
0): it counts in no loss, metric or batch statistic, and no layer sees 0
rows (oneDNN convolutions return wrong shapes on them). Every micro-batch
carries a mask (1 on real rows; the batch's own mask when it has one).

>>> import tensorflow as tf, tfdist
>>> from tfdist.parallel import micro_batches
>>> batch = tfdist.Batch(tf.reshape(tf.range(5.0), [5, 1]), tf.range(5))
>>> parts = micro_batches.cut(batch, 4)
>>> [p.structure["x"][:, 0].numpy().tolist() for p in parts]
[[0.0, 1.0], [2.0, 3.0], [4.0], [0.0]]
>>> [p.structure["mask"].numpy().tolist() for p in parts], [int(p.rows) for p in parts]
([[1.0, 1.0], [1.0, 1.0], [1.0], [0.0]], [2, 2, 1, 0])
"""

import dataclasses
from typing import List

import tensorflow as tf

from tfdist.data.batch import Batch


@dataclasses.dataclass
class MicroBatch:
    """One micro-batch: its `Batch` structure (x, y, sample_weight, mask)
    and its real rows (an int32 tensor; 0 for an empty one, which holds
    one masked row)."""

    structure: dict
    rows: tf.Tensor

    def batch(self) -> Batch:
        return Batch.from_structure(self.structure)

    def real_outputs(self, outputs):
        """``outputs`` (a structure of per-row tensors) without the masked
        row an empty micro-batch ran on."""
        return tf.nest.map_structure(lambda t: t[:self.rows], outputs)


def cut(batch: Batch, count: int, rows=None) -> List[MicroBatch]:
    """``batch`` (at least one row) as ``count`` micro-batches, in order
    (module doc); ``rows``: how many of its leading rows to cut (default
    all; 0 for a part that is itself one masked row, whose micro-batches
    are then all empty)."""
    rows = batch.size() if rows is None else rows
    length = (rows + count - 1) // count
    mask = (tf.ones([rows], tf.float32) if batch.mask is None
            else tf.cast(batch.mask, tf.float32))
    fields = batch.replace(mask=None).to_structure()
    parts = []
    for index in range(count):
        start = tf.minimum(index * length, rows)
        stop = tf.minimum(start + length, rows)
        empty = stop <= start
        first = tf.where(empty, 0, start)
        last = tf.where(empty, 1, stop)
        structure = tf.nest.map_structure(lambda t, a=first, b=last: t[a:b], fields)
        structure["mask"] = mask[first:last] * (1.0 - tf.cast(empty, tf.float32))
        parts.append(MicroBatch(structure, stop - start))
    return parts
