"""Tensor parallelism of the layers inside a transformer and a recommender
(`tfdist.parallel.sharded_layers`, `sharded_attention`,
`sharded_embeddings`): a block written as one Keras layer (a keras-hub-style
backbone: its rules by path), with an ``Embedding`` split by vocabulary
or by columns, a ``MultiHeadAttention`` split by heads and an
``EinsumDense`` feed-forward pair split by columns then rows, trains,
evaluates and predicts as single-device Keras does (1e-5) on meshes 1x2,
1x4 and 2x2; per phase of its traced step only the batch's activations
and scalars cross devices, as the layout implies; what it cannot run is
refused by name."""

import numpy as np
import pytest
import tensorflow as tf

import keras
import tfdist
from tests.support import reference as ref
from tfdist.errors import ConfigurationError
from tfdist.parallel import device_traffic, tensor_parallel

VOCABULARY, LENGTH, WIDTH, HEADS, EXAMPLES, BATCH = 16, 6, 8, 4, 20, 8  # (20: a partial batch)


@keras.saving.register_keras_serializable("tfdist_tests")
class Block(keras.layers.Layer):
    """A transformer encoder block as one layer (its sublayers' weights'
    paths: ``block/attention/query/kernel``, ``block/up/kernel``, ...)."""

    def __init__(self, causal=False, **kwargs):
        super().__init__(**kwargs)
        self.causal = causal
        self.attention = keras.layers.MultiHeadAttention(HEADS, WIDTH // 2, name="attention")
        self.norm1 = keras.layers.LayerNormalization(name="norm1")
        self.up = keras.layers.EinsumDense("abc,cd->abd", (None, 2 * WIDTH), bias_axes="d",
                                           activation="gelu", name="up")
        self.down = keras.layers.EinsumDense("abd,dc->abc", (None, WIDTH), bias_axes="c",
                                             name="down")
        self.norm2 = keras.layers.LayerNormalization(name="norm2")

    def build(self, input_shape):
        self.attention.build(input_shape, input_shape)
        for layer in (self.norm1, self.up, self.norm2):
            layer.build(input_shape)
        self.down.build(tuple(input_shape[:-1]) + (2 * WIDTH,))

    def call(self, x):
        x = self.norm1(x + self.attention(x, x, use_causal_mask=self.causal))
        return self.norm2(x + self.down(self.up(x)))

    def get_config(self):
        return {**super().get_config(), "causal": self.causal}


def _model(causal=False, seed=5, body=None) -> keras.Model:
    """Embedding, ``body()`` (default: one `Block`), pooling, a Dense head."""
    keras.utils.set_random_seed(seed)
    ids = keras.Input((LENGTH,), dtype="int32")
    x = keras.layers.Embedding(VOCABULARY, WIDTH, name="embedding")(ids)
    x = (body() if body is not None else Block(causal=causal, name="block"))(x)
    outputs = keras.layers.Dense(3, activation="softmax", name="head")(
        keras.layers.GlobalAveragePooling1D()(x))
    model = keras.Model(ids, outputs)
    model.compile(optimizer=ref.make_optimizer("adam"), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


TRANSFORMER = {
    "embedding/embeddings": ("model", None),
    "block/attention/(query|key|value)/kernel": (None, "model", None),
    "block/attention/(query|key|value)/bias": ("model", None),
    "block/attention/attention_output/kernel": ("model", None, None),
    "block/up/kernel": (None, "model"),
    "block/down/kernel": ("model", None),
}
COLUMNS = {**TRANSFORMER, "embedding/embeddings": (None, "model")}


def _data():
    rng = np.random.default_rng(7)
    ids = rng.integers(-2, VOCABULARY, (EXAMPLES, LENGTH)).astype("int32")  # (-1, -2: from the end)
    return ids, rng.integers(0, 3, EXAMPLES)


def _layout(data, model_devices, devices, rules):
    mesh = keras.distribution.DeviceMesh((data, model_devices), ["batch", "model"], devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    for key, axes in rules.items():
        layout_map[key] = axes
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")


def _split(data, model_devices, rules=TRANSFORMER, causal=False):
    devices = tfdist.strategies.configure_logical_cpus(4)
    first_column = devices[:data * model_devices:model_devices]
    strategy = tfdist.make_strategy("mirrored", devices=first_column) if data > 1 else None
    if strategy is None:
        model = _model(causal)
    else:
        with strategy.scope():
            model = _model(causal)
    tfdist.attach(model, strategy, parallel=_layout(data, model_devices,
                                                    devices[:data * model_devices], rules))
    return model


@pytest.mark.parametrize("data,model_devices,rules,causal", [
    (1, 2, TRANSFORMER, False), (1, 4, COLUMNS, True), (2, 2, TRANSFORMER, True)])
def test_transformer_equals_one_device(data, model_devices, rules, causal):
    x, y = _data()
    single = _model(causal)
    expected = single.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    model = _split(data, model_devices, rules, causal)
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    ref.assert_logs_close(expected, history)
    ref.assert_weights_close(single, model)
    ref.assert_evaluates_and_predicts_alike(single, model, x, y, BATCH)
    table = tensor_parallel.shards_of(model.get_layer("embedding").embeddings)
    axis = 0 if rules is TRANSFORMER else 1
    assert [s.shape[axis] for s in table] == [(VOCABULARY if axis == 0 else WIDTH)
                                              // model_devices] * model_devices


def _two_tower(seed=4) -> keras.Model:
    """A two-tower recommender: user and item ids (padded, id 0 masked)
    to embeddings pooled under the mask, each tower a Dense, scored by
    their dot product."""
    keras.utils.set_random_seed(seed)
    users = keras.Input((3,), dtype="int32", name="users")
    items = keras.Input((2,), dtype="int32", name="items")
    towers = []
    for ids, rows, name in ((users, 4 * VOCABULARY, "user"), (items, 2 * VOCABULARY, "item")):
        vectors = keras.layers.Embedding(rows, WIDTH, mask_zero=True, name=f"{name}_table")(ids)
        pooled = keras.layers.GlobalAveragePooling1D()(vectors)
        towers.append(keras.layers.Dense(WIDTH, activation="relu", name=f"{name}_tower")(pooled))
    score = keras.layers.Dot(axes=1)(towers)
    model = keras.Model([users, items], keras.layers.Activation("sigmoid")(score))
    model.compile(optimizer=ref.make_optimizer("adam"), loss="binary_crossentropy",
                  metrics=["accuracy"])
    return model


def test_two_tower_recommender_with_tables_split_by_vocabulary_equals_one_device():
    """Both tables split by vocabulary rows over 4 devices (each holds a
    quarter of the rows and its optimizer state), padded ids masked:
    History, weights and predictions equal one device's."""
    rng = np.random.default_rng(3)
    x = [rng.integers(0, 4 * VOCABULARY, (EXAMPLES, 3)).astype("int32"),
         rng.integers(0, 2 * VOCABULARY, (EXAMPLES, 2)).astype("int32")]
    x[0][:, 2][::2] = 0  # (padding)
    y = rng.integers(0, 2, (EXAMPLES, 1)).astype("float32")
    single = _two_tower()
    expected = single.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    model = _two_tower()
    devices = tfdist.strategies.configure_logical_cpus(4)
    tfdist.attach(model, parallel=_layout(1, 4, devices, {".*_table/embeddings": ("model", None)}))
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    ref.assert_logs_close(expected, history)
    ref.assert_weights_close(single, model)
    np.testing.assert_allclose(model.predict(x, verbose=0), single.predict(x, verbose=0),
                               atol=1e-6)
    table = tensor_parallel.shards_of(model.get_layer("user_table").embeddings)
    assert [tuple(s.shape) for s in table] == [(VOCABULARY, WIDTH)] * 4
    moments = [v for v in model.optimizer.variables if "user_table" in v.path]
    assert sorted(tuple(v.shape) for v in moments) == [(VOCABULARY, WIDTH)] * 8


def _phases(graph, optimizer):
    """Each op's phase by its name and when it was made: the optimizer's
    by its scope; backward from the tape's first gradient op on (the sums
    of an output's gradients are made outside the tape's name scope)."""
    phases, backward = {}, False
    for op in graph.get_operations():  # (in the order they were made)
        backward = backward or op.name.startswith("gradient_tape/")
        phases[op.name] = ("optimizer" if op.name.split("/")[0] == optimizer.name
                           else "backward" if backward else "forward")
    return phases


def test_the_step_moves_activations_never_a_weight():
    """Per phase of one traced step on a 1x2 mesh, the tensors that cross
    devices with a shape, by (from, to, shape). Forward: the ids to device
    1 and its partial vectors back (vocabulary), the block's input to
    device 1 (query, key and value by heads, one send for the three) and
    the attention's partial product back, the same for the feed-forward
    pair; backward: the gradients of those two partial products'
    outputs and of the vectors to device 1, and the inputs' gradient
    parts back. Never a weight's shape, never a head's query, key, value
    or attention."""
    model = _split(1, 2)
    x, y = _data()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    from tfdist.training import keras_fit  # pylint: disable=import-outside-toplevel

    steps = keras_fit.attachment_of(model).trainer()._steps  # pylint: disable=protected-access
    batch = tfdist.Batch(tf.constant(x[:BATCH]), tf.constant(y[:BATCH])).to_structure()
    graph = tf.function(steps.train).get_concrete_function(batch).graph
    by_phase, phases = {}, _phases(graph, model.optimizer)
    for crossing in device_traffic.crossings(graph, default_device="/cpu:0"):
        if crossing.shape:
            by_phase.setdefault(phases[crossing.tensor.split(":")[0]], []).append(
                (crossing.source[-1], crossing.destination[-1], crossing.shape))
    activation = (BATCH, LENGTH, WIDTH)
    assert sorted(by_phase["forward"]) == sorted([
        ("0", "1", (BATCH, LENGTH)),  # the ids
        ("1", "0", activation),  # the embedding's partial vectors
        ("0", "1", activation), ("1", "0", activation),  # attention: input there, partial back
        ("0", "1", activation), ("1", "0", activation),  # feed-forward: the same
    ]), by_phase["forward"]
    assert sorted(by_phase["backward"]) == sorted([
        ("0", "1", activation),  # the vectors' gradient
        ("0", "1", activation), ("1", "0", activation),  # attention: output's there, input's back
        ("0", "1", activation), ("1", "0", activation),  # feed-forward: the same
    ]), by_phase["backward"]
    assert "optimizer" not in by_phase, by_phase["optimizer"]


def test_saved_model_loads_in_plain_keras_and_checkpoints_cross_layouts(tmp_path):
    """``model.save`` of a split transformer loads in plain Keras, and a
    checkpoint of a 1x2 split (vocabulary) restores into a 1x4 one
    (columns); both train on equal to one device."""
    x, y = _data()
    model = _split(1, 2)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    path = str(tmp_path / "split.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    ref.assert_weights_close(model, loaded, atol=0)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(
        str(tmp_path / "ckpt"))
    wider = _split(1, 4, COLUMNS)
    wider.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)  # (built)
    ref.restore_into(wider, checkpoint)
    ref.assert_weights_close(model, wider, atol=0)
    ref.assert_train_on_alike([loaded, model, wider], x, y, BATCH)


def test_attention_by_heads_returns_its_scores():
    """A split attention asked for its scores returns one device's."""
    devices = tfdist.strategies.configure_logical_cpus(2)
    keras.utils.set_random_seed(2)
    query = keras.Input((LENGTH, WIDTH))
    output, scores = keras.layers.MultiHeadAttention(HEADS, 2, name="attention")(
        query, query, return_attention_scores=True)
    single = keras.Model(query, [output, scores])
    model = keras.models.clone_model(single)
    model.set_weights(single.get_weights())
    model.compile(optimizer="sgd", loss="mse")
    rules = {"attention/(query|key|value)/kernel": (None, "model", None),
             "attention/attention_output/kernel": ("model", None, None)}
    tfdist.attach(model, parallel=_layout(1, 2, devices, rules))
    x = np.random.default_rng(1).normal(size=(4, LENGTH, WIDTH)).astype("float32")
    for got, want in zip(model.predict(x, verbose=0), single.predict(x, verbose=0)):
        np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("rules,message", [
    ({"block/up/kernel": (None, "model"), "block/up/bias": ("model",),
      "block/attention/query/kernel": (None, None, "model"),
      "block/attention/query/bias": ("model", None)}, "splits the bias' dimension 0"),
    ({"block/norm1/gamma": ("model",)}, "LayerNormalization, which has no sharded form"),
    ({"embedding/.*ings": ("model", None), "embedding/embed.*": (None, "model")},
     "matched by 2 layout rules"),
])
def test_layouts_refused_by_name(rules, message):
    with pytest.raises(ConfigurationError, match=message):
        _split(1, 2, rules).fit(*_data(), batch_size=BATCH, verbose=0)


def test_an_id_outside_the_vocabulary_is_an_error_as_on_one_cpu():
    model = _split(1, 2)
    x, y = _data()
    x[3, 2] = VOCABULARY
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"(?s)is not in \[0, 16\).*embedding_ids_in_vocabulary"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
