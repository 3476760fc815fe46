"""Rows sent from every replica to every other, as many as each pair
needs: the exchange under tables sharded by vocabulary across replicas
(each replica sends each id to the replica that owns its row, and the
owner sends the row's vector back).

TensorFlow's all-to-all (``CollectiveAllToAllV2``, which runs on CPUs as
on GPUs) sends equal parts: each member's input is ``[N, ...]`` and member
j receives part j of every member's. `exchange` sends pieces of any
length, zero too: one all-gather of the N x N lengths, then one
all-to-all of the pieces padded to the longest of them all (rounded up
to a power of two), each received piece cut back to its length. A
replica therefore sends N x (the longest piece) rows, at most twice the
longest piece's rows per destination.

Under instance keys fixed at trace time (tfdist's traced loops: each key
keeps the shape it was first used with, `tfdist._internal.collective_shapes`)
the all-to-all reserves one key per power of two and uses the padded
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
        longest = tf.reduce_max(every)
        padded_length, bucket = collective_shapes.padded_size_and_bucket(tf.maximum(longest, 1))
        padded = tf.stack([tf.pad(p, [[0, padded_length - tf.shape(p)[0]]]
                                  + [[0, 0]] * (p.shape.rank - 1)) for p in pieces])
        received = _all_to_all(launcher, padded, bucket)
        return [received[i, :every[i * count + member]] for i in range(count)]


def _all_to_all(launcher, padded, bucket):
    key = collective_shapes.reserve_keys(launcher) + bucket \
        if collective_shapes.keys_fixed_at_trace() else None  # (else: the next key)
    return collectives._launch(launcher, collective_ops.all_to_all_v2, padded,  # pylint: disable=protected-access
                               instance_key=key)
