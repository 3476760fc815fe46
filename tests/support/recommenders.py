"""Recommenders as users write them with ``model.fit`` (the corpus of
issue "large embedding tables", point 4), each with its seeded data:

- ``two_tower``: TensorFlow Recommenders' retrieval shape, a query tower
  (a user table and the user's recent items, pooled) and a candidate
  tower (an item table and the item's category) scored by their dot
  product, trained point-wise on (user, item, clicked) rows with binary
  cross-entropy. (TFRS' ``Retrieval`` task scores every query against
  the batch's candidates, in-batch negatives: under data parallelism each
  replica's queries meet only its own part of the batch, a known limit
  the recommenders guide states. The point-wise form is the one every
  replica count computes alike.)
- ``dcn``: a ranking model with feature crosses (Wang et al. 2021,
  DCN-V2; keras-rs' ``FeatureCross`` computes ``x0 * (W x + b) + x``):
  dense features and two tables, two crosses, then a tower.
- ``dlrm``: dense features through a bottom MLP, three tables, the
  pairwise dot products of all their vectors (keras-rs' ``DotInteraction``,
  the upper triangle), then a top MLP (Naumov et al. 2019).

The ids repeat within a batch and across the replicas' parts of it, and
the last batch is partial.
"""

import json
import pathlib
import sys
from typing import Callable, NamedTuple

import keras
import numpy as np

EXAMPLES, BATCH = 41, 12  # (a last batch of 5: on 3 replicas, 2 + 2 + 1)
USERS, ITEMS, CATEGORIES = 29, 37, 7
DENSE_FEATURES = 5


class Recommender(NamedTuple):
    """A family: ``build(optimizer)`` (a compiled model, the same initial
    weights every call) and ``data(seed)`` (features, labels)."""
    build: Callable
    data: Callable
    tables: tuple  # the names of its Embedding layers


@keras.saving.register_keras_serializable(package="tfdist_tests")
class FeatureCross(keras.layers.Layer):
    """DCN-V2's cross layer: ``x0 * (x @ W + b) + x`` (keras-rs' ``FeatureCross``)."""

    def build(self, input_shape):
        width = input_shape[0][-1]
        self.dense = keras.layers.Dense(width, name="cross_dense")
        self.dense.build(input_shape[0])

    def call(self, inputs):
        first, current = inputs
        return first * self.dense(current) + current


@keras.saving.register_keras_serializable(package="tfdist_tests")
class DotInteraction(keras.layers.Layer):
    """DLRM's interaction: the dot products of every pair of the given
    vectors (the upper triangle, no self-products), as keras-rs'
    ``DotInteraction(self_interaction=False)``."""

    def call(self, vectors):
        stacked = keras.ops.stack(vectors, axis=1)  # [batch, features, width]
        products = keras.ops.matmul(stacked, keras.ops.transpose(stacked, (0, 2, 1)))
        count = len(vectors)
        rows, columns = np.triu_indices(count, k=1)
        flat = keras.ops.reshape(products, (-1, count * count))
        return keras.ops.take(flat, rows * count + columns, axis=1)


def _optimizer(name: str):
    return {"sgd": lambda: keras.optimizers.SGD(0.3),
            "momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
            "adagrad": lambda: keras.optimizers.Adagrad(0.3),
            "adam": lambda: keras.optimizers.Adam(0.02)}[name]()


def _compile(model, optimizer: str):
    model.compile(optimizer=_optimizer(optimizer),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=[keras.metrics.BinaryAccuracy(threshold=0.0, name="accuracy"),
                           keras.metrics.AUC(from_logits=True, num_thresholds=50, name="auc")])
    return model


def _two_tower(optimizer: str):
    keras.utils.set_random_seed(11)
    user = keras.Input((), dtype="int32", name="user")
    recent = keras.Input((4,), dtype="int32", name="recent")
    item = keras.Input((), dtype="int32", name="item")
    category = keras.Input((), dtype="int32", name="category")
    items_table = keras.layers.Embedding(ITEMS, 8, name="item_ids")
    query = keras.layers.Concatenate()([
        keras.layers.Embedding(USERS, 8, name="user_ids")(user),
        keras.ops.mean(items_table(recent), axis=1)])
    query = keras.layers.Dense(8, name="query_tower")(
        keras.layers.Dense(16, activation="relu", name="query_hidden")(query))
    candidate = keras.layers.Concatenate()([
        items_table(item), keras.layers.Embedding(CATEGORIES, 4, name="category_ids")(category)])
    candidate = keras.layers.Dense(8, name="candidate_tower")(candidate)
    score = keras.layers.Dot(axes=1)([query, candidate])
    model = keras.Model({"user": user, "recent": recent, "item": item, "category": category},
                        score, name="two_tower")
    return _compile(model, optimizer)


def _two_tower_data(seed: int = 0):
    rng = np.random.default_rng(seed)
    users = rng.integers(0, USERS, EXAMPLES).astype("int32")
    users[::4] = USERS - 1  # (one heavy user: the last replica's rows)
    items = rng.integers(0, ITEMS, EXAMPLES).astype("int32")
    items[::3] = 2  # (a popular item, within and across replicas)
    recent = rng.integers(0, ITEMS, (EXAMPLES, 4)).astype("int32")
    recent[:, 0] = items  # (the item in the history too: two reads of one table)
    features = {"user": users, "recent": recent, "item": items,
                "category": (items % CATEGORIES).astype("int32")}
    return features, rng.integers(0, 2, (EXAMPLES, 1)).astype("float32")


def _sparse_and_dense(names_and_rows, dense_width: int, seed: int):
    rng = np.random.default_rng(seed)
    features = {"dense": rng.normal(size=(EXAMPLES, dense_width)).astype("float32")}
    for name, rows in names_and_rows:
        ids = rng.integers(0, rows, EXAMPLES).astype("int32")
        ids[::3] = rows // 2  # (a frequent id)
        features[name] = ids
    return features, rng.integers(0, 2, (EXAMPLES, 1)).astype("float32")


def _dcn(optimizer: str):
    keras.utils.set_random_seed(12)
    dense = keras.Input((DENSE_FEATURES,), name="dense")
    user = keras.Input((), dtype="int32", name="user")
    item = keras.Input((), dtype="int32", name="item")
    first = keras.layers.Concatenate()([
        dense, keras.layers.Embedding(USERS, 6, name="user_ids")(user),
        keras.layers.Embedding(ITEMS, 6, name="item_ids")(item)])
    crossed = FeatureCross(name="cross_1")([first, first])
    crossed = FeatureCross(name="cross_2")([first, crossed])
    hidden = keras.layers.Dense(12, activation="relu", name="deep")(crossed)
    model = keras.Model({"dense": dense, "user": user, "item": item},
                        keras.layers.Dense(1, name="logit")(hidden), name="dcn")
    return _compile(model, optimizer)


def _dcn_data(seed: int = 0):
    return _sparse_and_dense([("user", USERS), ("item", ITEMS)], DENSE_FEATURES, seed)


def _dlrm(optimizer: str):
    keras.utils.set_random_seed(13)
    dense = keras.Input((DENSE_FEATURES,), name="dense")
    bottom = keras.layers.Dense(6, activation="relu", name="bottom_out")(
        keras.layers.Dense(10, activation="relu", name="bottom_hidden")(dense))
    sparse = {name: keras.Input((), dtype="int32", name=name)
              for name in ("user", "item", "category")}
    vectors = [bottom] + [keras.layers.Embedding(rows, 6, name=f"{name}_ids")(sparse[name])
                          for name, rows in (("user", USERS), ("item", ITEMS),
                                             ("category", CATEGORIES))]
    interactions = DotInteraction(name="interactions")(vectors)
    top = keras.layers.Dense(8, activation="relu", name="top_hidden")(
        keras.layers.Concatenate()([bottom, interactions]))
    model = keras.Model({"dense": dense, **sparse},
                        keras.layers.Dense(1, name="logit")(top), name="dlrm")
    return _compile(model, optimizer)


def _dlrm_data(seed: int = 0):
    return _sparse_and_dense([("user", USERS), ("item", ITEMS), ("category", CATEGORIES)],
                             DENSE_FEATURES, seed)


FAMILIES = {
    "two_tower": Recommender(_two_tower, _two_tower_data,
                             ("user_ids", "item_ids", "category_ids")),
    "dcn": Recommender(_dcn, _dcn_data, ("user_ids", "item_ids")),
    "dlrm": Recommender(_dlrm, _dlrm_data, ("user_ids", "item_ids", "category_ids")),
}


def worker_results(output_dir: pathlib.Path, *flags: str) -> list:
    """tests/programs/sharded_tables_per_worker.py (``flags``: its own) on 2
    workers x 2 replicas under a real ``tfdist-run`` on 127.0.0.1; each
    worker's result (its JSON), in task order."""
    from tests.support.launcher_harness import LauncherRun  # pylint: disable=import-outside-toplevel

    program = [sys.executable, "tests/programs/sharded_tables_per_worker.py",
               f"--output_dir={output_dir}", *flags]
    with LauncherRun(["--num_workers=2"], program) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    return [json.loads((output_dir / f"worker-{task}.json").read_text()) for task in (0, 1)]


def routed_lookups(monkeypatch) -> list:
    """Counts the lookups that route ids to their rows' owners under
    sharded tables (`tfdist.communication.table_lookups`): the returned
    list gets each routed lookup's table size (its rows)."""
    from tfdist.communication import table_lookups  # pylint: disable=import-outside-toplevel

    calls, original = [], table_lookups._look_up  # pylint: disable=protected-access

    def counted(*args, **kwargs):
        calls.append(args[4])  # (the table's rows: _look_up(group, replica, local, ids, rows, ...))
        return original(*args, **kwargs)

    monkeypatch.setattr(table_lookups, "_look_up", counted)
    return calls
