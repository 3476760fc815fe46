"""Sequence parallelism (`tfdist.parallel.sharded_sequence`): ``"<path>/output"``
rules that put the model axis on the sequence dimension of a pre-norm
transformer block's replicated region (its layer norms, residual sums,
dropout and the outputs of its row-split layers). The block, written as
one Keras layer with its rules by path, trains, evaluates and predicts as
single-device Keras does (1e-5) on meshes 1x2, 1x4 (a sequence of 6 in
chunks of 2, 2, 1, 1) and 2x2, with fully sharded weights too, and two
blocks in two pipeline stages of 2 model devices each; one traced
step moves sequence chunks where plain tensor parallelism moves whole
activations (each all-gather and reduce-scatter counted per phase);
rules tfdist cannot run are refused by name."""

import collections

import numpy as np
import pytest
import tensorflow as tf

import keras
import tfdist
from tests.parallel import test_tensor_parallel_layers as layers
from tests.support import reference as ref
from tfdist.communication import FullySharded
from tfdist.errors import ConfigurationError
from tfdist.parallel import device_traffic

LENGTH, WIDTH, BATCH = layers.LENGTH, layers.WIDTH, layers.BATCH


@keras.saving.register_keras_serializable("tfdist_tests")
class PreNormBlock(keras.layers.Layer):
    """A pre-norm transformer block as one layer, its residual sums
    ``Add`` layers (paths ``block/norm1``, ``block/attention``,
    ``block/add1``, ``block/norm2``, ``block/up``, ``block/down``,
    ``block/drop``, ``block/add2``)."""

    def __init__(self, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.dropout = dropout
        self.norm1 = keras.layers.LayerNormalization(name="norm1")
        self.attention = keras.layers.MultiHeadAttention(layers.HEADS, WIDTH // 2,
                                                         name="attention")
        self.add1 = keras.layers.Add(name="add1")
        self.norm2 = keras.layers.LayerNormalization(name="norm2")
        self.up = keras.layers.EinsumDense("abc,cd->abd", (None, 2 * WIDTH), bias_axes="d",
                                           activation="gelu", name="up")
        self.down = keras.layers.EinsumDense("abd,dc->abc", (None, WIDTH), bias_axes="c",
                                             name="down")
        self.drop = keras.layers.Dropout(dropout, name="drop")
        self.add2 = keras.layers.Add(name="add2")

    def build(self, input_shape):
        self.attention.build(input_shape, input_shape)
        for layer in (self.norm1, self.norm2, self.up):
            layer.build(input_shape)
        self.down.build(tuple(input_shape[:-1]) + (2 * WIDTH,))

    def call(self, x):
        h = self.norm1(x)
        x = self.add1([x, self.attention(h, h)])
        h = self.norm2(x)
        return self.add2([x, self.drop(self.down(self.up(h)))])

    def get_config(self):
        return {**super().get_config(), "dropout": self.dropout}


SEQUENCE = ("batch", "model", None)
RULES = {**layers.TRANSFORMER,
         # the replicated region, split by sequence: the norms, the sums, dropout,
         # and the outputs of the two row-split layers (reduce-scattered)
         "block/(norm1|attention|add1|norm2|down|drop|add2)/output": SEQUENCE}


def _model(dropout=0.0):
    """The embedding, a `PreNormBlock`, pooling and a head, with SGD and
    momentum: in this block the key projection's bias has a gradient of
    zero in exact arithmetic (it adds one constant to each query's scores),
    which Adam's normalization turns into steps of round-off's size and
    either sign, on one device as under any split."""
    model = layers._model(body=lambda: PreNormBlock(dropout, name="block"))  # pylint: disable=protected-access
    model.compile(optimizer=ref.make_optimizer("sgd"), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def _split(data, model_devices, rules=RULES, dropout=0.0, communication=None):
    devices = tfdist.strategies.configure_logical_cpus(4)
    strategy = tfdist.make_strategy("mirrored", devices=devices[:data * model_devices:model_devices]) \
        if data > 1 else None
    if strategy is None:
        model = _model(dropout)
    else:
        with strategy.scope():
            model = _model(dropout)
    tfdist.attach(model, strategy, communication=communication, parallel=layers._layout(  # pylint: disable=protected-access
        data, model_devices, devices[:data * model_devices], rules))
    return model


@pytest.mark.parametrize("data,model_devices,sharded", [
    (1, 2, False), (1, 4, False), (2, 2, False), (2, 2, True)])
def test_a_block_split_by_sequence_equals_one_device(data, model_devices, sharded):
    x, y = layers._data()  # pylint: disable=protected-access
    single = _model()
    expected = single.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    model = _split(data, model_devices, communication=FullySharded() if sharded else None)
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    ref.assert_logs_close(expected, history)
    ref.assert_weights_close(single, model)
    ref.assert_evaluates_and_predicts_alike(single, model, x, y, BATCH)


def _two_blocks():
    keras.utils.set_random_seed(5)
    ids = keras.Input((LENGTH,), dtype="int32")
    x = keras.layers.Embedding(layers.VOCABULARY, WIDTH, name="embedding")(ids)
    x = PreNormBlock(name="block_1")(PreNormBlock(name="block_0")(x))
    outputs = keras.layers.Dense(3, activation="softmax", name="head")(
        keras.layers.GlobalAveragePooling1D()(x))
    model = keras.Model(ids, outputs)
    model.compile(optimizer=ref.make_optimizer("sgd"), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def test_blocks_split_by_sequence_in_pipeline_stages_equal_one_device():
    """Data x pipeline x model with sequence rules: two blocks, a stage each
    (cut after the first), each block's weights split over its stage's 2
    model devices and its replicated region by sequence (1 x 2 x 2)."""
    devices = tfdist.strategies.configure_logical_cpus(4)
    rules = {key.replace("block/", "block_./"): axes for key, axes in RULES.items()
             if key.startswith("block/")}
    x, y = layers._data()  # pylint: disable=protected-access
    single = _two_blocks()
    expected = single.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    model = _two_blocks()
    mesh = keras.distribution.DeviceMesh((1, 2, 2), ["batch", "pipeline", "model"], devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    for key, axes in rules.items():
        layout_map[key] = axes
    tfdist.attach(model, parallel=[
        tfdist.parallel.Pipeline(cuts=["block_0"], micro_batches=2),
        keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")])
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    ref.assert_logs_close(expected, history)
    ref.assert_weights_close(single, model)
    ref.assert_evaluates_and_predicts_alike(single, model, x, y, BATCH)


def _crossings_by_phase(model, x, y):
    """(from, to, shape) of each shaped tensor crossing devices in one
    traced training step, by phase."""
    from tfdist.training import keras_fit  # pylint: disable=import-outside-toplevel

    steps = keras_fit.attachment_of(model).trainer()._steps  # pylint: disable=protected-access
    batch = tfdist.Batch(tf.constant(x[:BATCH]), tf.constant(y[:BATCH])).to_structure()
    graph = tf.function(steps.train).get_concrete_function(batch).graph
    by_phase, phases = {}, layers._phases(graph, model.optimizer)  # pylint: disable=protected-access
    for crossing in device_traffic.crossings(graph, default_device="/cpu:0"):
        if crossing.shape:
            by_phase.setdefault(phases[crossing.tensor.split(":")[0]], []).append(
                (crossing.source[-1], crossing.destination[-1], crossing.shape))
    return by_phase


def test_the_replicated_region_moves_chunks_of_the_sequence():
    """One traced step on a 1x2 mesh, what crosses devices, counted by
    kind. Forward: the ids and the embedding's partial vectors (split by
    vocabulary, as without the rules); the block's input cut once (its
    second chunk to device 1); an all-gather before each column-split
    pair (attention, up) and a reduce-scatter after each row-split one
    (attention's output, down): one chunk each way for each; the block's
    output joined once for the pooling; and the replicated region's
    vectors read on device 1 (two norms' gamma and beta, two row biases).
    Backward: the same chunks the other way, and four more where two
    layers read one chunk (below). Never a whole activation of the block,
    never a split weight's shape."""
    model = _split(1, 2)
    x, y = layers._data()  # pylint: disable=protected-access
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    by_phase = _crossings_by_phase(model, x, y)
    chunk, whole = (BATCH, LENGTH // 2, WIDTH), (BATCH, LENGTH, WIDTH)
    forward = collections.Counter(by_phase["forward"])
    assert forward == collections.Counter({
        ("0", "1", (BATCH, LENGTH)): 1,  # the ids
        ("1", "0", whole): 1,  # the embedding's partial vectors
        ("0", "1", chunk): 1 + 2 + 2,  # the input's cut; 2 all-gathers, 2 reduce-scatters
        ("1", "0", chunk): 2 + 2 + 1,  # ... and the output joined for the pooling
        ("0", "1", (WIDTH,)): 6,  # norms' gamma and beta, the row layers' biases
    }), forward
    backward = collections.Counter(by_phase["backward"])
    assert backward == collections.Counter({
        ("0", "1", whole): 1,  # the embedding's vectors' gradient
        # each all-gather's and reduce-scatter's gradient, one chunk each way (8);
        # the pooling's gradient cut (0 -> 1) and the input's cut joined (1 -> 0);
        # and the residual stream: the block's input and add1's output are each
        # read by a norm and a sum, and TensorFlow's tape adds the two gradients of
        # such a chunk on the device the gradient is asked on (the first), so
        # device 1's chunk of each goes there twice (4 where 2 would do) and
        # add1's comes back once
        ("1", "0", chunk): 4 + 1 + 3,
        ("0", "1", chunk): 4 + 1 + 1,
        ("1", "0", (WIDTH,)): 6,  # the vectors' gradients, to where they live
    }), backward
    assert "optimizer" not in by_phase, by_phase["optimizer"]


def test_plain_tensor_parallelism_moves_the_whole_activations_instead():
    """The same block without the sequence rules (the comparison the test
    above stands on): its forward pass sends whole activations, no chunk."""
    model = _split(1, 2, rules=layers.TRANSFORMER)
    x, y = layers._data()  # pylint: disable=protected-access
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    forward = collections.Counter(_crossings_by_phase(model, x, y)["forward"])
    whole = (BATCH, LENGTH, WIDTH)
    assert forward[("0", "1", whole)] == 2 and forward[("1", "0", whole)] == 3, forward
    assert not [c for c in forward if c[2] == (BATCH, LENGTH // 2, WIDTH)], forward


def test_dropout_over_chunks_warns_and_evaluates_as_one_device():
    x, y = layers._data()  # pylint: disable=protected-access
    model = _split(1, 2, dropout=0.25)
    with pytest.warns(UserWarning, match="dropout over sequence chunks draws each chunk's mask"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # (the layout applies here)
    single = _model(dropout=0.25)
    single.set_weights(model.get_weights())
    ref.assert_evaluates_and_predicts_alike(single, model, x, y, BATCH)


def test_a_model_split_by_sequence_saves_and_loads_in_plain_keras(tmp_path):
    x, y = layers._data()  # pylint: disable=protected-access
    model = _split(1, 2)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0),
                               atol=1e-6)


@pytest.mark.parametrize("rule,axes,message", [
    ("block/up/output", SEQUENCE, "already divides its output"),
    ("global_average.*/output", ("batch", "model"), "one sequence dimension"),
    ("block/norm1/output", ("batch", None, "model"), "one sequence dimension"),
    ("block/output", SEQUENCE, "for layers split by rows .* and for position-wise layers"),
])
def test_rules_tfdist_cannot_run_are_refused_by_name(rule, axes, message):
    with pytest.raises(ConfigurationError, match=message):
        _split(1, 2, rules={**layers.TRANSFORMER, rule: axes}).fit(
            *layers._data(), batch_size=BATCH, verbose=0)  # pylint: disable=protected-access


def test_a_norm_over_the_split_dimension_is_refused():
    devices = tfdist.strategies.configure_logical_cpus(2)
    inputs = keras.Input((LENGTH, WIDTH))
    outputs = keras.layers.LayerNormalization(axis=1, name="norm")(inputs)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ConfigurationError, match="normalizes over the dimension the rule splits"):
        tfdist.attach(model, parallel=layers._layout(1, 2, devices, {"norm/output": SEQUENCE}))  # pylint: disable=protected-access
        model.fit(np.ones((4, LENGTH, WIDTH), "float32"), np.ones((4, LENGTH, WIDTH), "float32"),
                  verbose=0)
