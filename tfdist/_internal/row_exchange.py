"""Rows sent from every replica to every other, as many as each pair
needs: the exchange under tables sharded by vocabulary across replicas
(each replica sends each id to the replica that owns its row, and the
owner sends the row's vector back).

TensorFlow's all-to-all (``CollectiveAllToAllV2``, which runs on CPUs as
on GPUs) sends equal parts: each member's input is ``[N, ...]`` and member
j receives part j of every member's. `exchange` sends pieces of any
length, zero too: one all-gather of the N x N lengths, then one
all-to-all of the pieces padded to the longest of them all, rounded up to
one of `PADDED_LENGTHS` (8 per power of two: 1 to 8, then 9, 10, ... 16,
18, 20, ... 32, 36, ...), each received piece cut back to its length. A
replica therefore sends to each destination the longest piece's rows
and at most 1/8 more. (Rounding up to a power of two, as the
variable-shaped all-gathers do, sent up to twice the rows: measured on 2
workers, a sharded table's step put twice its ids' and vectors' bytes on
the link.)

Under instance keys fixed at trace time (tfdist's traced loops: each key
keeps the shape it was first used with, `tfdist._internal.collective_shapes`)
the all-to-all reserves one key per padded length and uses the padded
length's, so every call, whatever its lengths, reuses the keys of its
trace. Differentiable: the gradient of what a replica received from
replica i goes back to replica i by the same exchange in reverse.

Call in replica context, every replica in the same order, with the
replica's launcher (`tfdist._internal.collectives.replica_launcher`).
"""

from typing import Callable, List, Optional, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.ops import collective_ops  # (see privates.PRIVATES)

from tfdist._internal import collective_shapes, collectives

# The lengths a piece is padded to: 1 to 8, then 8 steps per power of two
# (2**k + m * 2**(k-3) for m = 0..7), up to the largest int32 count.
PADDED_LENGTHS = tuple(sorted({length for k in range(31)
                               for length in range(1 << k, 1 << (k + 1), max(1, (1 << k) // 8))}
                              | {(1 << 31) - 1}))


def exchange(launcher, member: int, pieces: Sequence[tf.Tensor],
             gradient_codec: Optional[Tuple[Callable, Callable]] = None) -> List[tf.Tensor]:
    """``pieces[j]`` (``[n_j, ...]``, the same trailing shape and dtype for
    every j and on every replica) sent to replica j, from replica
    ``member`` (this one's index in the launcher's group); returns what
    each replica i sent to this one, in replica order (module doc).

    ``gradient_codec``: ``(encode, decode)``, applied to each gradient
    piece before and after it crosses back (`tfdist.communication.Compression`'s
    16 bits); the forward pieces cross as they are."""
    pieces = [tf.convert_to_tensor(p) for p in pieces]
    if not pieces[0].dtype.is_floating:
        return _exchange(launcher, member, pieces)
    encode, decode = gradient_codec or (lambda piece: piece, lambda piece: piece)

    @tf.custom_gradient
    def differentiable(*sent):
        received = _exchange(launcher, member, sent)

        def backward(*upstream):
            upstream = [tf.zeros_like(r) if g is None else g for r, g in zip(received, upstream)]
            returned = _exchange(launcher, member, [encode(g) for g in upstream])
            return [decode(g) for g in returned]  # (back to the senders)
        return received, backward

    return list(differentiable(*pieces))


def _exchange(launcher, member: int, pieces) -> List[tf.Tensor]:
    # pylint: disable=protected-access
    count = launcher._group_size
    if len(pieces) != count:
        raise ValueError(f"exchange takes one piece per replica ({count}); got {len(pieces)}.")
    with tf.device(launcher._device):
        lengths = tf.stack([tf.shape(p, out_type=tf.int32)[0] for p in pieces])
        # every replica's lengths, sender-major: [sender * count + destination]
        every = collectives.all_gather_rows(launcher, lengths)
        padded_length, bucket = padded_length_and_bucket(tf.reduce_max(every))
        padded = tf.stack([tf.pad(p, [[0, padded_length - tf.shape(p)[0]]]
                                  + [[0, 0]] * (p.shape.rank - 1)) for p in pieces])
        received = _all_to_all(launcher, padded, bucket)
        return [received[i, :every[i * count + member]] for i in range(count)]


def padded_length_and_bucket(longest: tf.Tensor):
    """The smallest of `PADDED_LENGTHS` >= ``longest`` (1 for 0) and its
    index (the all-to-all's key among the keys it reserves).

    >>> [int(padded_length_and_bucket(tf.constant(n))[0]) for n in (0, 8, 9, 17, 1000, 1025)]
    [1, 8, 9, 18, 1024, 1152]
    """
    lengths = tf.constant(PADDED_LENGTHS, tf.int32)
    bucket = tf.reduce_sum(tf.cast(lengths < tf.maximum(longest, 1), tf.int32))
    return tf.gather(lengths, bucket), bucket


def _all_to_all(launcher, padded, bucket):
    key = collective_shapes.reserve_keys(launcher, len(PADDED_LENGTHS)) + bucket \
        if collective_shapes.keys_fixed_at_trace() else None  # (else: the next key)
    return collectives._launch(launcher, collective_ops.all_to_all_v2, padded,  # pylint: disable=protected-access
                               instance_key=key)
