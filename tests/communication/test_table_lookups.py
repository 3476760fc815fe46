"""Embedding tables sharded by vocabulary under ``FullySharded``, looked
up where their rows live (`tfdist.communication.table_lookups`), against
single-device Keras: a user tower (one id per example) and an item
history (six ids, padded with 0 under ``mask_zero``, combined over the
mask by sum, mean or sqrtn), with the same ids repeated within a batch and across the replicas'
parts of it, a partial last batch that leaves replicas empty, and SGD,
Adagrad and Adam (whose squares are taken of each occurrence's entry)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import recommenders, reference as ref
from tests.support.models import GuideTrainStep
from tfdist.communication import FullySharded

USERS, ITEMS = 23, 31
EXAMPLES, BATCH = 37, 12  # (a last batch of 1: two of three replicas empty)


@keras.saving.register_keras_serializable(package="tfdist_tests")
class MaskedCombiner(keras.layers.Layer):
    """A bag of looked-up rows combined over its mask as keras-rs' and
    TensorFlow's embedding combiners do: ``sum``, ``mean`` or ``sqrtn``
    (the sum over the square root of the count)."""

    def __init__(self, combiner: str, **kwargs):
        super().__init__(**kwargs)
        self.combiner = combiner
        self.supports_masking = True

    def call(self, rows, mask=None):
        weights = keras.ops.cast(mask, rows.dtype)[..., None]
        total = keras.ops.sum(rows * weights, axis=1)
        count = keras.ops.maximum(keras.ops.sum(weights, axis=1), 1.0)
        if self.combiner == "mean":
            return total / count
        return total / keras.ops.sqrt(count) if self.combiner == "sqrtn" else total

    def compute_mask(self, inputs, mask=None):
        return None

    def get_config(self):
        return {**super().get_config(), "combiner": self.combiner}


def _recommender(optimizer: str, model_class=keras.Model, combiner: str = "mean"):
    keras.utils.set_random_seed(3)
    user = keras.Input((), dtype="int32", name="user")
    items = keras.Input((6,), dtype="int32", name="items")
    user_vector = keras.layers.Embedding(USERS, 4, name="users")(user)
    history = keras.layers.Embedding(ITEMS, 4, mask_zero=True, name="items_table")(items)
    pooled = MaskedCombiner(combiner)(history)
    joined = keras.layers.Concatenate()([user_vector, pooled])
    score = keras.layers.Dense(1, name="score")(keras.layers.Dense(8, activation="relu")(joined))
    model = model_class({"user": user, "items": items}, score)
    model.compile(optimizer={"sgd": keras.optimizers.SGD(0.5),
                             "adagrad": keras.optimizers.Adagrad(0.5),
                             "adam": keras.optimizers.Adam(0.05)}[optimizer],
                  loss="mse", metrics=["mae"])
    return model


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    users = rng.integers(0, USERS, EXAMPLES).astype("int32")
    users[::3] = USERS - 1  # (one user in many rows: on the last replica's slice)
    items = rng.integers(1, ITEMS, (EXAMPLES, 6)).astype("int32")
    items[:, 0] = 5  # (every example: a duplicate within and across replicas)
    items[:, 4:] = np.where(rng.random((EXAMPLES, 2)) < 0.5, 0, items[:, 4:])  # (padding)
    labels = rng.normal(size=(EXAMPLES, 1)).astype("float32")
    return {"user": users, "items": items}, labels


def _sharded(replicas: int, optimizer: str, model_class=keras.Model, combiner: str = "mean"):
    strategy = tfdist.make_strategy("mirrored", num_replicas=replicas)
    with strategy.scope():
        model = _recommender(optimizer, model_class, combiner)
    return tfdist.attach(model, strategy, communication=FullySharded())


@pytest.mark.parametrize("optimizer,replicas,combiner",
                         [("adam", 3, "mean"), ("adagrad", 2, "sqrtn"), ("sgd", 3, "sum")])
def test_tables_sharded_by_rows_train_as_one_device(monkeypatch, optimizer, replicas, combiner):
    """fit History, weights (the tables whole), evaluate and predict; the
    item history combined over its mask by each combiner in turn."""
    calls = recommenders.routed_lookups(monkeypatch)
    x, y = _data()
    expected = _recommender(optimizer, combiner=combiner)
    expected_history = expected.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    model = _sharded(replicas, optimizer, combiner=combiner)
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert sorted(set(calls)) == [USERS, ITEMS]  # (both tables' lookups routed)
    ref.assert_logs_close(expected_history.history, history.history)
    ref.assert_weights_close(expected, model)
    ref.assert_evaluates_and_predicts_alike(expected, model, x, y, BATCH)
    rows = -(-USERS // replicas)  # each replica: a range of whole rows
    assert [c.shape.as_list() for c in model.get_layer("users").embeddings.value.values] == \
        [[rows * 4]] * replicas


def test_a_users_own_train_step_scales_the_routed_gradients_as_one_device():
    """keras.io's own ``train_step`` (its loss carries the replica count,
    `tfdist._internal.replica_share`): the rows' gradients are scaled back."""
    x, y = _data(1)
    expected = _recommender("adam", GuideTrainStep)
    expected.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    model = _sharded(2, "adam", GuideTrainStep)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    ref.assert_weights_close(expected, model)


def test_a_sharded_table_saves_whole_and_restores_on_another_replica_count(tmp_path):
    """``model.save`` holds the whole tables (plain Keras loads them), and
    a checkpoint of 3 replicas' slices restores into 2 replicas' slices,
    which then train on as one device does."""
    x, y = _data(2)
    expected = _recommender("adagrad")
    expected.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    model = _sharded(3, "adagrad")
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    model.save(tmp_path / "model.keras")
    ref.assert_weights_close(expected, keras.models.load_model(tmp_path / "model.keras"))
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(
        str(tmp_path / "ckpt"))
    moved = _sharded(2, "adagrad")
    moved.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)  # (builds the state)
    ref.restore_into(moved, path)
    ref.assert_weights_close(expected, moved)
    ref.assert_train_on_alike([expected, moved], x, y, BATCH)


def _sharded_over_3_equals_one_device(build, x, y):
    """``build()`` fitted 2 epochs on one device and with every weight
    sharded over 3 replicas: History and weights equal. Returns the sharded model."""
    expected = build()
    expected_history = expected.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    strategy = tfdist.make_strategy("mirrored", num_replicas=3)
    with strategy.scope():
        model = build()
    tfdist.attach(model, strategy, communication=FullySharded())
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    ref.assert_logs_close(expected_history.history, history.history)
    ref.assert_weights_close(expected, model)
    return model


def _ragged_model():
    """An item history made ragged inside the model (padding 0 dropped),
    looked up and averaged per example: each example its own number of ids."""
    keras.utils.set_random_seed(3)
    items = keras.Input((6,), dtype="int32", name="items")
    ragged = keras.layers.Lambda(lambda t: tf.RaggedTensor.from_tensor(t, padding=0))(items)
    history = keras.layers.Embedding(ITEMS, 4, name="items_table")(ragged)
    pooled = keras.layers.Lambda(lambda t: tf.reduce_mean(t, axis=1))(history)
    model = keras.Model(items, keras.layers.Dense(1, name="score")(pooled))
    model.compile(optimizer=keras.optimizers.Adagrad(0.5), loss="mse")
    return model


def test_ragged_ids_sharded_by_rows_equal_one_device(monkeypatch):
    """Ragged ids (1 to 6 per example) are routed by their values: equal
    to one device, the table in ranges of rows over 3 replicas."""
    calls = recommenders.routed_lookups(monkeypatch)
    x, y = _data()
    items = x["items"]
    for example in range(len(items)):
        items[example, 1 + example % 6:] = 0
    _sharded_over_3_equals_one_device(_ragged_model, items, y)
    assert set(calls) == {ITEMS}


def test_an_id_past_the_table_is_a_clear_error():
    """As Keras on a CPU refuses an id past the table (the ids routed to
    the last replica would find its slice's padding)."""
    x, y = _data()
    x["items"][3, 2] = ITEMS + 1
    model = _sharded(2, "sgd")
    with pytest.raises(tf.errors.InvalidArgumentError, match="an Embedding id is not below 31, the number of rows of its table"):
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)


def test_tables_sharded_over_two_workers_train_as_one_device(tmp_path):
    """2 MultiWorkerMirroredStrategy workers x 2 replicas (real tfdist-run
    processes on 127.0.0.1): each of the cluster's 4 replicas keeps a range
    of each table's rows, ids and rows cross between the processes, and
    every worker ends at one device's weights, History, evaluation and
    predictions."""
    from tests.support import recommenders  # pylint: disable=import-outside-toplevel

    x, y = _data()
    expected = _recommender("adam")
    expected_history = expected.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    for result in recommenders.worker_results(tmp_path / "out"):
        ref.assert_worker_result_equals(expected, expected_history, result, x, y, BATCH)
        rows = -(-USERS // 4)  # (a quarter of the rows on each of this worker's 2 replicas)
        assert result["slice_shapes"]["users"] == [[rows * 4]] * 2


def _compressed_one_device(x, y, dtype: str, replicas: int, epochs: int):
    """SGD on one device as tfdist compresses under sharded tables
    (`tests.communication.test_compression.sixteen_bit_shares`): a
    table's gradient entries (one per occurrence) each rounded to
    ``dtype`` and applied, duplicates kept; a dense weight's shares rounded
    and summed in ``dtype`` (its reduce-scatter)."""
    from tests.communication import test_compression  # pylint: disable=import-outside-toplevel

    batches = [(x[start:start + BATCH], y[start:start + BATCH])
               for start in range(0, len(y), BATCH)]
    return test_compression.sixteen_bit_shares(
        _table_model(), batches,
        keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum"),
        0.5, epochs, dtype, replicas)


def _table_model():
    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((3,), dtype="int32"),
                              keras.layers.Embedding(ITEMS, 4, name="items_table"),
                              keras.layers.Flatten(), keras.layers.Dense(3, name="head")])
    model.compile(optimizer=keras.optimizers.SGD(0.5),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_with_compression_each_routed_gradient_entry_crosses_in_16_bits(monkeypatch, dtype):
    """``(FullySharded(), Compression(dtype))`` over 2 replicas: each
    occurrence's gradient crosses back to its row's owner in 16 bits, as
    a one-device loop that rounds each entry (and each dense share) does,
    and not as the uncompressed run."""
    calls = recommenders.routed_lookups(monkeypatch)
    rng = np.random.default_rng(5)
    x = rng.integers(0, ITEMS, (EXAMPLES, 3)).astype("int32")
    x[:, 0] = 7  # (a duplicate in every example)
    y = rng.integers(0, 3, EXAMPLES)
    strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    with strategy.scope():
        model = _table_model()
    tfdist.attach(model, strategy, communication=(
        FullySharded(), tfdist.communication.Compression(dtype)))
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert set(calls) == {ITEMS}  # (the lookup routed to the rows' owners)
    expected = _compressed_one_device(x, y, dtype, 2, 2)
    exact = _table_model()
    exact.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert ref.largest_difference(exact.get_weights(), expected) > 1e-5  # (rounding visible)
    assert ref.largest_difference(model.get_weights(), expected) < 1e-5


def test_a_table_in_a_model_keras_builds_on_its_first_batch_is_sharded_by_rows(monkeypatch):
    """A ``Sequential`` without an ``Input`` (Keras builds it on the first
    batch; tfdist slices it then, `tfdist.parallel.plan`): its table is
    sliced in rows and looked up where they live, equal to one device."""
    calls = recommenders.routed_lookups(monkeypatch)

    def unbuilt():
        keras.utils.set_random_seed(6)
        model = keras.Sequential([keras.layers.Embedding(ITEMS, 4, name="items_table"),
                                  keras.layers.GlobalAveragePooling1D(),
                                  keras.layers.Dense(3, name="head")])
        model.compile(optimizer=keras.optimizers.Adagrad(0.3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    rng = np.random.default_rng(6)
    x = rng.integers(0, ITEMS, (EXAMPLES, 5)).astype("int32")
    y = rng.integers(0, 3, EXAMPLES)
    model = _sharded_over_3_equals_one_device(unbuilt, x, y)
    assert set(calls) == {ITEMS}
    rows = -(-ITEMS // 3)
    assert [c.shape.as_list() for c in model.get_layer("items_table").embeddings.value.values] \
        == [[rows * 4]] * 3
