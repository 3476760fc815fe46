"""keras-rs' ``DistributedEmbedding`` on CPUs under tfdist (issue "large
embedding tables", point 3).

On TensorFlow without a TPU's SparseCore, keras-rs places every table on
the default device: one ``EmbedReduce`` layer per table (an ``Embedding``
subclass whose call looks ids up with ``super().call`` and applies the
table's combiner). tfdist looks those ids up by rows
(`tfdist._internal.keras.embedding_rows`): replicated, a step reads only
the touched rows; with ``FullySharded``, each replica keeps a range of the
table's rows and the ids are routed to their owners. Both are compared
with the same keras-rs model trained by plain Keras on one device.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import recommenders, reference as ref
from tfdist.communication import FullySharded

keras_rs = pytest.importorskip("keras_rs", reason="keras-rs is the optional extra tfdist[recommenders]")

USERS, ITEMS, HISTORY = 23, 31, 5
EXAMPLES, BATCH = 37, 12  # (a last batch of 1: on 3 replicas, two are empty)


def _model(optimizer: str, combiner: str):
    """A user, the user's recent items (combined by ``combiner``) and a
    candidate item looked up in the same item table, scored by a tower."""
    keras.utils.set_random_seed(7)
    users = keras_rs.layers.TableConfig(name="users", vocabulary_size=USERS, embedding_dim=4)
    items = keras_rs.layers.TableConfig(name="items", vocabulary_size=ITEMS, embedding_dim=4,
                                        combiner=combiner)
    features = {
        "user": keras_rs.layers.FeatureConfig(name="user", table=users, input_shape=(None,),
                                              output_shape=(None, 4)),
        "history": keras_rs.layers.FeatureConfig(name="history", table=items,
                                                 input_shape=(None, HISTORY),
                                                 output_shape=(None, 4)),
        "candidate": keras_rs.layers.FeatureConfig(name="candidate", table=items,
                                                   input_shape=(None,), output_shape=(None, 4)),
    }
    inputs = {"user": keras.Input((), dtype="int32", name="user"),
              "history": keras.Input((HISTORY,), dtype="int32", name="history"),
              "candidate": keras.Input((), dtype="int32", name="candidate")}
    vectors = keras_rs.layers.DistributedEmbedding(features, name="tables")(inputs)
    joined = keras.layers.Concatenate()([vectors["user"], vectors["history"],
                                         vectors["candidate"]])
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(joined)
    model = keras.Model(inputs, keras.layers.Dense(1, name="score")(hidden))
    model.compile(optimizer={"adagrad": keras.optimizers.Adagrad(0.5),
                             "adam": keras.optimizers.Adam(0.05)}[optimizer],
                  loss="mse", metrics=["mae"])
    return model


def _data():
    rng = np.random.default_rng(3)
    x = {"user": rng.integers(0, USERS, EXAMPLES).astype("int32"),
         "history": rng.integers(0, ITEMS, (EXAMPLES, HISTORY)).astype("int32"),
         "candidate": rng.integers(0, ITEMS, EXAMPLES).astype("int32")}
    x["user"][::3] = USERS - 1  # (one user in many rows: on the last replica's range)
    x["history"][:, 0] = 5  # (every example: a duplicate within and across replicas)
    x["candidate"][::2] = 5  # (and the same row read by a second feature)
    return x, rng.normal(size=(EXAMPLES, 1)).astype("float32")


def _table_layers(model) -> dict:
    tables = model.get_layer("tables")
    return {layer.name: layer for layer in tables._flatten_layers(include_self=False)  # pylint: disable=protected-access
            if isinstance(layer, keras.layers.Embedding)}


@pytest.mark.parametrize("optimizer,combiner", [("adam", "mean"), ("adagrad", "sqrtn"),
                                                ("adam", "sum")])
def test_distributed_embedding_with_tables_sharded_by_rows_equals_one_device(
        monkeypatch, optimizer, combiner):
    """History, weights (each table whole), evaluate and predict of 3
    replicas with every table in ranges of rows, against one device."""
    calls = recommenders.routed_lookups(monkeypatch)
    x, y = _data()
    expected = _model(optimizer, combiner)
    expected_history = expected.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    strategy = tfdist.make_strategy("mirrored", num_replicas=3)
    with strategy.scope():
        model = _model(optimizer, combiner)
    tfdist.attach(model, strategy, communication=FullySharded())
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert sorted(set(calls)) == [USERS, ITEMS]  # (every feature's lookup routed)
    ref.assert_logs_close(expected_history.history, history.history)
    ref.assert_weights_close(expected, model)
    ref.assert_evaluates_and_predicts_alike(expected, model, x, y, BATCH)
    slices = {name: [piece.shape.as_list() for piece in layer.embeddings.value.values]
              for name, layer in _table_layers(model).items()}
    assert slices == {"users": [[-(-USERS // 3) * 4]] * 3, "items": [[-(-ITEMS // 3) * 4]] * 3}


def test_distributed_embedding_replicated_reads_only_the_touched_rows():
    """On 2 replicas with the tables replicated: equal to one device, and
    the traced step reads no table whole (a gather of its rows)."""
    x, y = _data()
    expected = _model("adagrad", "mean")
    expected_history = expected.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    with strategy.scope():
        model = _model("adagrad", "mean")
    tfdist.attach(model, strategy)
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    ref.assert_logs_close(expected_history.history, history.history)
    ref.assert_weights_close(expected, model)
    reads = _table_reads(model, strategy, x)
    assert reads.count("ResourceGather") == 3 * 2, reads  # (each feature, each replica)
    assert "ReadVariableOp" not in reads, reads


def _table_reads(model, strategy, x) -> list:
    """The ops of a traced replicated forward pass that read a table: a
    whole read (``ReadVariableOp`` of a table's shape) or a gather of rows."""
    shapes = {tuple(layer.embeddings.shape) for layer in _table_layers(model).values()}
    batch = {name: tf.constant(values[:BATCH]) for name, values in x.items()}
    graph = tf.function(lambda inputs: strategy.run(model, args=(inputs,))
                        ).get_concrete_function(batch).graph
    return [op.type for op in graph.get_operations()
            if (op.type == "ReadVariableOp" and tuple(op.outputs[0].shape) in shapes)
            or (op.type == "ResourceGather" and op.outputs[0].shape[-1:] == [4])]
