"""A step that reads and updates only the rows of a table its batch touches
(`tfdist.replica.table_rows`): exact against one-device Keras ``fit``
(weights, optimizer state, History), and the traced step reads the table's
rows, never the whole table."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import short_form

VOCABULARY, WIDTH, IDS = 60, 4, 5
EPOCHS, BATCH = 2, 8
OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.5),
    "adagrad": lambda: keras.optimizers.Adagrad(0.5),
    "momentum": lambda: keras.optimizers.SGD(0.5, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.05),
    "loss_scale_adagrad": lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adagrad(0.5)),
}


def _data(examples: int = 21):
    """Ids with duplicates within an example and across examples (row 3 in
    every one), negative ids (row -1 is the last), rows never touched; 21
    examples: a partial last batch (and an empty replica at 4)."""
    rng = np.random.RandomState(0)
    ids = rng.randint(0, VOCABULARY // 2, (examples, IDS)).astype("int32")
    ids[:, 0] = 3
    ids[:, 1] = ids[:, 2]
    ids[::4, 3] = -1
    y = rng.randn(examples, 1).astype("float32")
    return ids, y


def _model(optimizer: str, ragged: bool = False, **embedding) -> keras.Model:
    keras.utils.set_random_seed(1)
    inputs = keras.Input((IDS,), dtype="int32")
    if ragged:  # (padded with 0 in the data; made ragged inside the model)
        ids = keras.layers.Lambda(lambda t: tf.RaggedTensor.from_tensor(t, padding=0))(inputs)
        looked_up = keras.layers.Embedding(VOCABULARY, WIDTH, name="table", **embedding)(ids)
        pooled = keras.layers.Lambda(lambda t: tf.reduce_mean(t, axis=1))(looked_up)
    else:
        looked_up = keras.layers.Embedding(VOCABULARY, WIDTH, name="table", **embedding)(inputs)
        pooled = keras.layers.GlobalAveragePooling1D()(looked_up)
    model = keras.Model(inputs, keras.layers.Dense(1)(pooled))
    model.compile(optimizer=OPTIMIZERS[optimizer](), loss="mse", metrics=["mae"])
    return model


def _fit(model, x, y):
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    return model.fit(dataset, epochs=EPOCHS, verbose=0).history


def _state(model) -> list:
    return model.get_weights() + [np.asarray(v) for v in model.optimizer.variables]


def _assert_equal(expected, actual, history, expected_history):
    assert len(expected) == len(actual)
    for a, b in zip(expected, actual):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    for name, values in expected_history.items():
        np.testing.assert_allclose(history[name], values, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer, replicas", short_form.in_turn(sorted(OPTIMIZERS), (2, 4, 1)))
def test_equals_one_device_keras(make_strategy, optimizer, replicas):
    x, y = _data()
    reference = _model(optimizer)
    expected_history = _fit(reference, x, y)
    strategy = make_strategy(replicas)
    with strategy.scope():
        model = _model(optimizer)
    history = _fit(tfdist.attach(model, strategy), x, y)
    _assert_equal(_state(reference), _state(model), history, expected_history)
    touched = np.unique(np.where(x < 0, x + VOCABULARY, x))
    table = model.get_layer("table").embeddings.numpy()
    untouched = np.setdiff1d(np.arange(VOCABULARY), touched)
    initial = _model(optimizer).get_layer("table").embeddings.numpy()
    if optimizer in ("sgd", "adagrad", "loss_scale_adagrad"):  # (the test can tell rows apart)
        np.testing.assert_array_equal(table[untouched], initial[untouched])


def test_ragged_ids_equal_one_device_keras(make_strategy):
    x, y = _data()
    x = np.where(x == 0, 1, x)
    for example in range(len(x)):  # (1 to IDS ids, then padding)
        x[example, 1 + example % IDS:] = 0
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    reference = _model("adagrad", ragged=True)
    expected_history = reference.fit(dataset, epochs=EPOCHS, verbose=0).history
    strategy = make_strategy(2)
    with strategy.scope():
        model = _model("adagrad", ragged=True)
    history = tfdist.attach(model, strategy).fit(dataset, epochs=EPOCHS, verbose=0).history
    _assert_equal(_state(reference), _state(model), history, expected_history)


def _table_reads(model, strategy, x, y) -> list:
    """The types of the ops of one traced replica step that read a
    table-sized variable (the table, Adagrad's accumulator): a whole read
    (``ReadVariableOp`` of the table's shape) or a gather of its rows."""
    from tfdist.training import keras_fit  # pylint: disable=import-outside-toplevel

    steps = keras_fit.attachment_of(model).trainer()._steps  # pylint: disable=protected-access
    batch = strategy.experimental_distribute_values_from_function(
        lambda _: tfdist.Batch(tf.constant(x[:BATCH]), tf.constant(y[:BATCH])).to_structure())
    graph = tf.function(lambda structure: strategy.run(steps.train, args=(structure,))
                        ).get_concrete_function(batch).graph
    table_shape = tuple(model.get_layer("table").embeddings.shape)
    reads = []
    for op in graph.get_operations():
        if not op.outputs:
            continue
        shape = tuple(op.outputs[0].shape)
        if (op.type == "ReadVariableOp" and shape == table_shape) or (
                op.type == "ResourceGather" and shape[-1:] == (WIDTH,)):
            reads.append(op.type)
    return reads


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_the_step_reads_rows_never_a_whole_table(make_strategy, optimizer):
    """The lookup gathers the table's rows and Adagrad the accumulator's;
    nothing reads a table-sized variable whole (Keras' lookup and Adagrad do)."""
    x, y = _data()
    strategy = make_strategy(2)
    with strategy.scope():
        model = _model(optimizer)
    _fit(tfdist.attach(model, strategy), x, y)
    reads = _table_reads(model, strategy, x, y)
    # each replica: the lookup's rows (and Adagrad: the accumulator's touched rows)
    assert reads == ["ResourceGather"] * 2 * (2 if optimizer == "adagrad" else 1), reads


def test_keras_own_update_runs_where_reading_rows_would_differ(make_strategy):
    """Adagrad with epsilon=0 and a zero initial accumulator: Keras divides
    0 by 0 on the untouched rows (NaN there); tfdist keeps Keras' update and
    its numbers rather than reading the touched rows only. (Distinct ids:
    with duplicates, Keras' own update fails on one device.)"""
    x = np.arange(BATCH * IDS, dtype="int32").reshape(BATCH, IDS)
    y = np.ones((BATCH, 1), "float32")

    def model():
        keras.utils.set_random_seed(1)
        built = _model("adagrad")
        built.compile(optimizer=keras.optimizers.Adagrad(0.5, initial_accumulator_value=0.0,
                                                         epsilon=0.0), loss="mse")
        return built

    reference = model()
    _fit(reference, x, y)
    assert np.isnan(reference.get_layer("table").embeddings.numpy()).any()
    strategy = make_strategy(2)
    with strategy.scope():
        actual = model()
    _fit(tfdist.attach(actual, strategy), x, y)
    for a, b in zip(_state(reference), _state(actual)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_a_subclass_looks_up_by_rows_through_super_and_a_lora_table_as_keras_does():
    """A subclass whose own call looks ids up with ``super().call`` (as
    keras-rs' ``EmbedReduce`` does) reads its table by rows too; a LoRA
    embedding keeps Keras' lookup (its table is a sum of weights, read
    whole). The values stay Keras'."""

    class Scaled(keras.layers.Embedding):
        def call(self, inputs):
            return 2.0 * super().call(inputs)

    inputs = keras.Input((IDS,), dtype="int32")
    lora = keras.layers.Embedding(VOCABULARY, WIDTH, lora_rank=2, name="lora")
    scaled = Scaled(VOCABULARY, WIDTH, name="scaled")
    plain = keras.layers.Embedding(VOCABULARY, WIDTH, name="plain")
    outputs = keras.layers.Concatenate()([lora(inputs), scaled(inputs), plain(inputs)])
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss="mse")
    x, _ = _data()
    expected = model.predict(x, verbose=0)
    tfdist.attach(model)
    np.testing.assert_allclose(model.predict(x, verbose=0), expected, rtol=1e-6)
    graph = tf.function(model).get_concrete_function(tf.constant(x[:BATCH])).graph
    reads = sorted(op.type for op in graph.get_operations()
                   if (op.type == "ReadVariableOp" and op.outputs[0].shape == [VOCABULARY, WIDTH])
                   or op.type == "ResourceGather")
    assert reads == ["ReadVariableOp", "ResourceGather", "ResourceGather"], reads  # (lora's read)
