"""`tfdist._internal.sparse_gradients`: where a lookup's ids come from, the
lookups a gradient sums, one device's form from N replicas' gradients, and
the flat slice a sharded optimizer updates, each against NumPy."""

import numpy as np
import pytest
import tensorflow as tf

from tfdist._internal import sparse_gradients

TABLE = np.arange(40, dtype="float32").reshape(10, 4) / 40.0


def _kinds(lookup, batch=None):
    batch = tf.constant([[1, 2, 3], [3, 3, 9]]) if batch is None else batch
    table = tf.Variable(TABLE)
    found = []

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])  # (as batches come)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(lookup(table, x))
        gradient = tape.gradient(loss, table)
        # (scaled after the lookups are summed, as a loss scale's division is)
        scaled = tf.IndexedSlices(gradient.values * 0.5, gradient.indices, gradient.dense_shape)
        found.extend(sparse_gradients.lookup_kind(piece.indices)
                     for piece in sparse_gradients.pieces(scaled))
        return gradient.values

    step(batch)
    return found


@pytest.mark.parametrize("lookup,kinds", [
    (lambda t, x: tf.gather(t, x), ["rows"]),
    (lambda t, x: tf.gather(t, tf.reshape(tf.cast(x, tf.int64) % 7, [-1])), ["rows"]),
    (lambda t, x: tf.gather(t, tf.range(tf.shape(x)[1])), ["shared"]),
    (lambda t, x: tf.gather(t, tf.range(tf.shape(x)[-1])), ["shared"]),
    (lambda t, x: tf.gather(t, tf.constant([0, 4, 4])), ["shared"]),
    (lambda t, x: tf.gather(t, tf.range(tf.shape(x)[0])), ["rows"]),
    (lambda t, x: tf.gather(t, tf.random.uniform([3], 0, 10, tf.int32)), ["rows"]),
    (lambda t, x: tf.gather(t, tf.cast(tf.reduce_max(x), tf.int32)), ["rows"]),
], ids=["token_ids", "hashed_ids", "positions", "positions_from_the_end", "constant_ids",
        "row_numbers", "random_ids", "a_batch_statistic"])
def test_lookup_kind_follows_where_the_ids_come_from(lookup, kinds):
    assert _kinds(lookup) == kinds


def test_one_table_looked_up_both_ways_is_split_into_its_lookups():
    both = lambda t, x: tf.gather(t, x) + tf.gather(t, tf.range(tf.shape(x)[1]))[None]  # noqa: E731
    assert _kinds(both) == ["rows", "shared"]


def _replica_gradients(strategy, lookup, batches):
    """Each replica's gradient of ``sum(2 * gather)`` on its batch, combined."""
    with strategy.scope():
        table = tf.Variable(TABLE)

    @tf.function
    def run(per_replica):
        def replica_step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(lookup(table, x) * 2.0)
            gradient = tape.gradient(loss, table)
            combined = sparse_gradients.combine(gradient, tf.distribute.get_replica_context())
            return tf.convert_to_tensor(combined), tf.reduce_sum(tf.square(combined.values))
        return strategy.run(replica_step, args=(per_replica,))

    per_replica = strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(batches[context.replica_id_in_sync_group]))
    dense, squares = run(per_replica)
    return ([t.numpy() for t in strategy.experimental_local_results(dense)],
            [float(t) for t in strategy.experimental_local_results(squares)])


def test_combine_gathers_rows_and_sums_shared_lookups(make_strategy):
    strategy = make_strategy(2)
    batches = [[[1, 2], [2, 2]], [[2, 5], [7, 1]]]
    dense, squares = _replica_gradients(strategy, lambda t, x: tf.gather(t, x), batches)
    # One device: an entry of 2.0 per looked-up id, duplicates kept.
    ids = np.array(batches).reshape(-1)
    expected = np.zeros_like(TABLE)
    np.add.at(expected, ids, 2.0)
    for replica in range(2):
        np.testing.assert_allclose(dense[replica], expected)
        assert squares[replica] == pytest.approx(len(ids) * 4 * 4.0)
    dense, squares = _replica_gradients(
        strategy, lambda t, x: tf.gather(t, tf.range(tf.shape(x)[1])) * tf.cast(
            tf.shape(x)[0], tf.float32), batches)
    # One device on the 4 rows: positions 0 and 1 once each, entry 2 * 4.
    expected = np.zeros_like(TABLE)
    expected[:2] = 8.0
    for replica in range(2):
        np.testing.assert_allclose(dense[replica], expected)
        assert squares[replica] == pytest.approx(2 * 4 * 64.0)  # (not 4 entries of 16)


def test_flat_slice_keeps_every_entry_of_the_slice():
    rng = np.random.RandomState(0)
    ids = np.array([3, 1, 3, 9, 0, 3])
    values = rng.randn(len(ids), 4).astype("float32")
    gradient = tf.IndexedSlices(tf.constant(values), tf.constant(ids), tf.constant([10, 4]))
    whole = np.zeros((10, 4), "float32")
    squares = np.zeros((10, 4), "float32")
    np.add.at(whole, ids, values)
    np.add.at(squares, ids, values ** 2)
    for start, length in ((0, 14), (14, 14), (28, 14), (38, 4)):
        part = sparse_gradients.flat_slice(gradient, start, length, (4,))
        dense = np.zeros(length, "float32")
        part_squares = np.zeros(length, "float32")
        np.add.at(dense, part.indices.numpy(), part.values.numpy())
        np.add.at(part_squares, part.indices.numpy(), part.values.numpy() ** 2)
        stop = min(start + length, 40)
        np.testing.assert_allclose(dense[:stop - start], whole.reshape(-1)[start:stop], 1e-6)
        np.testing.assert_allclose(part_squares[:stop - start],
                                   squares.reshape(-1)[start:stop], 1e-6)
        assert part.dense_shape.numpy().tolist() == [length]


def test_lookup_kind_follows_ids_into_an_xla_function():
    """An XLA step's forward and backward pass are one function call: the
    walk goes on in its body and back out through its arguments."""
    table = tf.Variable(TABLE)
    positions = tf.function(lambda x: tf.gather(table, tf.range(tf.shape(x)[1])),
                            jit_compile=True)
    tokens = tf.function(lambda x: tf.gather(table, x), jit_compile=True)
    found = {}

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
    def step(x):
        for name, lookup in (("positions", positions), ("tokens", tokens)):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(lookup(x))
            found[name] = sparse_gradients.lookup_kind(tape.gradient(loss, table).indices)
        return x

    step(tf.constant([[1, 2, 3]]))
    assert found == {"positions": "shared", "tokens": "rows"}
