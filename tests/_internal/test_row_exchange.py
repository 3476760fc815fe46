"""`tfdist._internal.row_exchange`: pieces of any length (zero too) from
every replica to every other over TensorFlow's all-to-all, on 3 replicas
of a MirroredStrategy, compared with the NumPy answer: what each replica
receives, and the gradient each sender gets back; in tfdist's traced
functions (instance keys fixed at trace, each padded length its key's)
with lengths that change from call to call. (The shape each key keeps
is checked across workers' processes, where a reused key with another
shape fails: not by this in-process test.)"""

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist._internal import collective_shapes, collectives, row_exchange

REPLICAS = 3


def _piece(sender, destination, offset):
    """Sender's rows for destination: (sender + 2 destination + offset) % 4 of them."""
    rows = (sender + 2 * destination + offset) % 4
    return (np.arange(rows * 2, dtype="float32").reshape(rows, 2)
            + 100 * sender + 10 * destination)


def _weight(receiver, sender):
    return 1.0 + sender + 10.0 * receiver


def _dynamic_piece(sender, destination, offset):
    """`_piece(sender, destination, offset)` for a tensor ``offset``: a
    slice of the 4 offsets' pieces, of a length known when it runs."""
    pieces = [_piece(sender, destination, o) for o in range(4)]
    starts = np.cumsum([0] + [len(p) for p in pieces])
    table = tf.constant(np.concatenate(pieces))
    start = tf.gather(tf.constant(starts, tf.int32), offset)
    length = tf.gather(tf.constant(starts, tf.int32), offset + 1) - start
    return tf.slice(table, tf.stack([start, 0]), tf.stack([length, 2]))


def _exchanges(strategy, traces):
    """A function of ``offset`` running one exchange of floats (and its
    gradient) and one of ints on every replica; each trace appends to
    ``traces``."""
    def replica_step(offset):
        traces.append(collective_shapes.keys_fixed_at_trace())
        context = tf.distribute.get_replica_context()
        me = int(tf.get_static_value(context.replica_id_in_sync_group))
        launcher = collectives.replica_launcher(strategy, me)
        pieces = [_dynamic_piece(me, j, offset) for j in range(REPLICAS)]
        with tf.GradientTape() as tape:
            tape.watch(pieces)
            received = row_exchange.exchange(launcher, me, pieces)
            loss = tf.add_n([tf.reduce_sum(rows) * _weight(me, i)
                             for i, rows in enumerate(received)])
        ids = row_exchange.exchange(launcher, me, [tf.cast(p[:, 0], tf.int64) for p in pieces])
        return received, tape.gradient(loss, pieces), ids
    return lambda offset: strategy.run(replica_step, args=(offset,))


@pytest.mark.parametrize("traced", ["tf_function", "fixed_keys"])
def test_pieces_of_any_length_reach_their_replica_and_gradients_return(traced):
    strategy = tfdist.make_strategy("mirrored", num_replicas=REPLICAS)
    assert collectives.replica_launcher(strategy, 0) is not None
    traces = []
    function = (tf.function if traced == "tf_function" else collectives.function)(
        _exchanges(strategy, traces))
    for offset in (0, 1, 3, 2):  # (one trace; lengths 0 to 3 change from call to call)
        received, gradients, ids = function(tf.constant(offset))
        local = strategy.experimental_local_results
        for me in range(REPLICAS):
            for sender in range(REPLICAS):
                want = _piece(sender, me, offset)
                np.testing.assert_array_equal(local(received[sender])[me].numpy(), want)
                np.testing.assert_array_equal(local(ids[sender])[me].numpy(),
                                              want[:, 0].astype("int64"))
            for destination in range(REPLICAS):
                got = local(gradients[destination])[me].numpy()
                np.testing.assert_array_equal(
                    got, np.full_like(_piece(me, destination, offset), _weight(destination, me)))
    # (traced once: every call ran the trace's keys, fixed ones in tfdist's functions)
    assert traces == [traced == "fixed_keys"] * REPLICAS, traces
