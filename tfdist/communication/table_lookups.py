"""Embedding tables sharded by vocabulary over the replicas, looked up
where their rows live (`tfdist.communication.FullySharded`).

Under ``FullySharded`` every weight lives as one slice per replica. An
``Embedding`` table's slices hold whole rows, in ranges: with N replicas
and V rows, replica ``r`` owns rows ``r * ceil(V / N)`` onwards
(`tfdist.communication.shard_layout.ShardLayout.by_rows`). A step looks
its ids up without gathering the table:

1. each replica sends each of its ids (every occurrence, duplicates
   kept) to the replica that owns its row: one exchange of ids
   (`tfdist._internal.row_exchange`: an all-gather of the pieces'
   lengths and one all-to-all);
2. each owner gathers the rows it was sent from its slice (a gather on
   its variable: those rows, nothing else) and sends them back: a second
   exchange;
3. the backward pass runs the second exchange in reverse: each
   occurrence's gradient reaches the owner of its row (in 16 bits under
   `tfdist.communication.Compression`, as a replica's sparse entries
   cross without the sharding), which updates its
   slice (and its optimizer state) from every entry, duplicates kept, as
   one device's optimizer updates the whole table from the batch's
   entries (Adam's and Adagrad's squares are of each entry).

A step then moves the ids and vectors of the batch's lookups, and no
replica ever holds the whole table: what makes a table that does not fit
one device trainable. Without it, ``FullySharded`` would gather the
whole table at every step.

The ids must come from the batch (token ids, a user's or an item's id):
an id every replica looks up alike (a position embedding's
``ops.arange(length)``) is looked up once on one device, its gradient
summed over the batch before the optimizer squares it, so such a lookup
reads the table whole, as ``FullySharded`` reads any weight
(`tfdist._internal.sparse_gradients.lookup_kind`). So does a table read
another way (a tied output projection's matmul); the gradients of both
reads add up.

Ranges rather than ids modulo N: the slices are ``FullySharded``'s own
(saved whole, restored under any replica count, optimizer state and
gradient accumulation in slices, with nothing added); ids sorted by
frequency put the frequent rows on the first replica (hash ids before
the lookup to spread them).
"""

from typing import Callable, Optional

import tensorflow as tf

from tfdist._internal import replica_share, row_exchange, sparse_gradients
from tfdist._internal.tensorflow import distributed_variables


def rows_reader(storage, rows: int, slice_rows: int, width: int,
                site: Callable, launcher: Callable,
                compression: Callable = lambda: None) -> Callable:
    """The lookup of a table's rows from its slices (module doc), as
    `tfdist._internal.keras.sliced_weights.SlicedReads.rows_in_replica`.

    Args:
      storage: the table's slices (a distributed variable of ``[slice_rows
        * width]`` elements per replica).
      rows: the table's rows, V.
      slice_rows: rows per slice.
      width: elements per row.
      site: returns the replica running here (its index in the
        collective group), or None outside a replica of a traced step.
      launcher: ``launcher(replica)``, the replica's collective launcher
        (None where the strategy has no collective ops).
      compression: returns the `tfdist.communication.Compression` the
        optimizer's gradients cross in, or None: each occurrence's
        gradient then crosses back to its row's owner in 16 bits, as a
        replica's sparse entries cross without the sharding.
    """

    def rows_in_replica(ids) -> Optional[tf.Tensor]:
        replica = site()
        if replica is None or sparse_gradients.lookup_kind(ids) != sparse_gradients.ROWS:
            return None
        group = launcher(replica)
        if group is None:
            return None
        return _look_up(group, replica, distributed_variables.running_copy(storage), ids,
                        rows, slice_rows, width, compression())

    return rows_in_replica


def _look_up(group, replica: int, local, ids, rows: int, slice_rows: int, width: int,
             compressed=None):
    """Rows ``ids`` (1-D) of the table, ``[len(ids), width]``, from their owners."""
    replicas = group._group_size  # pylint: disable=protected-access
    ids = tf.cast(ids, tf.int64)
    checked = tf.debugging.assert_less(
        ids, tf.constant(rows, tf.int64),
        message=f"an Embedding id is not below {rows}, the number of rows of its table")
    with tf.control_dependencies([checked]):
        owners = tf.cast(ids // slice_rows, tf.int32)
    local_ids = ids - tf.cast(owners, tf.int64) * slice_rows
    positions = tf.range(tf.size(ids))
    asked = tf.dynamic_partition(local_ids, owners, replicas)
    where = tf.dynamic_partition(positions, owners, replicas)
    received = row_exchange.exchange(group, replica, asked)  # (ids of my rows, per sender)
    found = [_rows_of(local, wanted, width) for wanted in received]
    codec = None if compressed is None else (
        lambda gradient: compressed.compress(gradient, replicas),
        lambda gradient: compressed.restore(gradient, local.dtype, replicas))
    returned = row_exchange.exchange(group, replica, found,  # (my ids' rows, per owner)
                                     gradient_codec=codec)
    vectors = tf.dynamic_stitch(where, returned)
    return _gradient_scaled(tf.reshape(vectors, [-1, width]), replica_share.gradient_scale())


def _rows_of(local, wanted, width: int) -> tf.Tensor:
    """Rows ``wanted`` of this replica's slice (a flat variable), ``[n,
    width]``: a gather of their elements (``ResourceGather``), whose
    gradient is a sparse one of those elements."""
    elements = wanted[:, None] * width + tf.range(width, dtype=tf.int64)[None, :]
    return tf.reshape(tf.gather(local, elements), [-1, width])


def _gradient_scaled(vectors, scale: float):
    """``vectors``, whose gradient is multiplied by ``scale`` (a user's own
    step's replica share, `tfdist._internal.replica_share.gradient_scale`)."""
    if scale == 1.0:
        return vectors

    @tf.custom_gradient
    def scaled(value):
        return tf.identity(value), lambda upstream: upstream * tf.cast(scale, upstream.dtype)

    return scaled(vectors)
