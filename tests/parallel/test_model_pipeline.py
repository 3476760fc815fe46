"""The model axis composed with a pipeline on one plan (data x pipeline x
model): ``parallel=[Pipeline(...), ModelParallel(...)]`` over a mesh whose
axes are the batch's, ``"pipeline"`` and the model's, on 4 logical CPUs
(1 x 2 stages x 2 model devices). Each stage's split layers keep their
shards on that stage's model devices and run their sharded forms inside
the stage's passes; weights, History, evaluation and predictions equal
single-device Keras' (1e-5); what one traced step sends between devices is
the layout's activations, per phase, never a weight; what the composition
cannot run is refused by name. Over 2 workers (data 2):
`tests.parallel.test_tensor_parallel_on_workers`."""

import collections

import numpy as np
import pytest
import tensorflow as tf

import keras
import tfdist
from tests.parallel import test_tensor_parallel as flat
from tests.parallel import test_tensor_parallel_layers as layers
from tests.support import reference as ref
from tfdist.errors import ConfigurationError
from tfdist.parallel import device_traffic, tensor_parallel

FEATURES, HIDDEN, CLASSES, BATCH = flat.FEATURES, flat.HIDDEN, flat.CLASSES, flat.BATCH

# Two Megatron pairs, one per stage (cut after d2), and a replicated head
# (a Sequential's paths start with its name).
PAIRS = {".*d1/kernel": (None, "model"), ".*d1/bias": ("model",),
         ".*d2/kernel": ("model", None), ".*d3/kernel": (None, "model"),
         ".*d4/kernel": ("model", None)}


def _mlp(regularizer=None, with_input=True) -> keras.Model:
    keras.utils.set_random_seed(3)
    stack = [keras.layers.Dense(HIDDEN, activation=activation, name=name,
                                kernel_regularizer=regularizer)
             for name, activation in (("d1", "relu"), ("d2", "tanh"), ("d3", "relu"),
                                      ("d4", "tanh"))]
    stack.append(keras.layers.Dense(CLASSES, activation="softmax", name="head"))
    if with_input:
        stack.insert(0, keras.Input((FEATURES,)))
    return keras.Sequential(stack)


def _mesh_layout(rules, devices, data=1):
    mesh = keras.distribution.DeviceMesh((data, 2, 2), ["batch", "pipeline", "model"], devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    for key, axes in rules.items():
        layout_map[key] = axes
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")


def _composed(model, cuts, micro_batches, rules=PAIRS, **attach):
    devices = tfdist.strategies.configure_logical_cpus(4)
    pipeline = tfdist.parallel.Pipeline(cuts=cuts, micro_batches=micro_batches)
    return tfdist.attach(model, parallel=[pipeline, _mesh_layout(rules, devices)], **attach)


def _assert_equal(expected, expected_history, model, history, x, y) -> None:
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history, history)
    ref.assert_evaluates_and_predicts_alike(expected, model, x, y, BATCH)


@pytest.mark.parametrize("optimizer,micro_batches,regularized,with_input,clipnorm", [
    ("adam", 3, False, True, None),
    ("sgd", 5, True, True, 0.05),   # (the last batch's 4 rows: an empty micro-batch)
    ("adam", 2, True, False, None),  # (a Sequential Keras builds on its first batch)
])
def test_mlp_over_stages_and_model_devices_equals_one_device(optimizer, micro_batches,
                                                             regularized, with_input, clipnorm):
    x, y = flat._data()  # pylint: disable=protected-access
    regularizer = keras.regularizers.L2(0.01) if regularized else None

    def compiled(model):
        model = flat._compiled(model, optimizer)  # pylint: disable=protected-access
        model.optimizer.clipnorm = clipnorm
        return model

    expected = compiled(_mlp(regularizer))
    expected_history = expected.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                                    verbose=0).history
    model = _composed(compiled(_mlp(regularizer, with_input)), ["d2"], micro_batches)
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    _assert_equal(expected, expected_history, model, history, x, y)
    where = {name: [shard.value.device[-5:] for shard in
                    (tensor_parallel.shards_of(model.get_layer(name).kernel) or [])]
             for name in ("d1", "d2", "d3", "d4")}
    assert where == {"d1": ["CPU:0", "CPU:1"], "d2": ["CPU:0", "CPU:1"],
                     "d3": ["CPU:2", "CPU:3"], "d4": ["CPU:2", "CPU:3"]}, where
    assert model.get_layer("head").kernel.value.device.endswith("CPU:2")  # (stage 1's first)


class Backbone(keras.layers.Layer):
    """A keras-hub-style backbone: two transformer blocks inside one layer
    (paths ``backbone/block_0/...``), cut between them by path."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.block_0 = layers.Block(name="block_0")
        self.block_1 = layers.Block(causal=True, name="block_1")

    def build(self, input_shape):
        self.block_0.build(input_shape)
        self.block_1.build(input_shape)

    def call(self, x):
        return self.block_1(self.block_0(x))


def _backbone_model() -> keras.Model:
    return layers._model(body=lambda: Backbone(name="backbone"))  # pylint: disable=protected-access


BACKBONE = {"embedding/embeddings": ("model", None),
            **{key.replace("block/", r"backbone/block_\d/"): axes
               for key, axes in layers.TRANSFORMER.items() if key.startswith("block/")}}


def _rows_reversed_in_each_batch(array):
    return np.concatenate([array[start:start + BATCH][::-1]
                           for start in range(0, len(array), BATCH)])


def test_transformer_blocks_split_by_heads_in_two_stages_equal_one_device():
    """The embedding split by vocabulary and block 0 by heads on stage 0,
    block 1 (causal) on stage 1, cut inside the backbone by path. Adam at
    its calibrated bound: 4x what reversing each batch's rows moves one
    device's weights (the key projections' biases have no gradient but
    round-off, which Adam's normalization scales up to its step size)."""
    x, y = layers._data()  # pylint: disable=protected-access
    expected = _backbone_model()
    expected_history = expected.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                                    verbose=0).history
    reordered = _backbone_model()
    reordered.fit(_rows_reversed_in_each_batch(x), _rows_reversed_in_each_batch(y),
                  batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    bound = max(1e-5, 4 * ref.largest_difference(expected.get_weights(),
                                                 reordered.get_weights()))
    assert bound < 1e-3, bound
    model = _composed(_backbone_model(), ["backbone/block_0"], 3, BACKBONE)
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    ref.assert_weights_close(expected, model, atol=bound)
    ref.assert_logs_close(expected_history, history)
    ref.assert_evaluates_and_predicts_alike(expected, model, x, y, BATCH)
    query = {block: [shard.value.device[-5:] for shard in tensor_parallel.shards_of(
        model.get_layer("backbone").__dict__[block].attention.query_dense.kernel)]
        for block in ("block_0", "block_1")}
    assert query == {"block_0": ["CPU:0", "CPU:1"], "block_1": ["CPU:2", "CPU:3"]}, query


def test_the_step_moves_activations_never_a_weight():
    """What one traced step of the 1 x 2 x 2 MLP sends between devices,
    on a batch of 12 rows in 2 micro-batches of 6 (no weight or shard has
    a dimension of 6): each crossing is a micro-batch's activation or its
    gradient. Per micro-batch, on each stage (devices 0, 1 and 2, 3): the
    pair's input to model device 1 and the row layer's partial product
    back; d1's (d3's) output parts joined on the stage's first device and
    cut again for d2 (d4), as each layer is a unit of its stage's pass
    and a column layer's parts do not cross a pass; backward, the same
    once each way. Between the stages, the cut's activation and its
    gradient, the labels and sample weights to the last stage, the
    predictions back. No gradient of the data (d1's input) is computed. The
    optimizer moves no tensor: each shard is updated on its device."""
    x, y = flat._data()  # pylint: disable=protected-access
    model = _composed(flat._compiled(_mlp(), "adam"), ["d2"], 2)  # pylint: disable=protected-access
    rows = 6
    model.fit(x, y, batch_size=2 * rows, epochs=1, verbose=0)
    from tfdist.training import keras_fit  # pylint: disable=import-outside-toplevel

    steps = keras_fit.attachment_of(model).trainer()._steps  # pylint: disable=protected-access
    batch = tfdist.Batch(tf.constant(x[:2 * rows]), tf.constant(y[:2 * rows])).to_structure()
    graph = tf.function(steps.train).get_concrete_function(batch).graph
    moved = collections.Counter(
        (c.source[-1], c.destination[-1], c.shape)
        for c in device_traffic.crossings(graph, default_device="/cpu:0") if c.shape)
    half = HIDDEN // 2
    per_micro_batch = collections.Counter({
        # stage 0: d1's input; d1's part joined, cut for d2; d2's partial
        # product; backward: d2's output gradient, its input's part 1
        # gradient joined, d1's part 1 gradient
        ("0", "1", (rows, FEATURES)): 1, ("1", "0", (rows, half)): 2,
        ("0", "1", (rows, half)): 2, ("1", "0", (rows, HIDDEN)): 1,
        ("0", "1", (rows, HIDDEN)): 1,
        # the cut and its gradient; the labels and sample weights; the predictions
        ("0", "2", (rows, HIDDEN)): 1, ("2", "0", (rows, HIDDEN)): 1,
        ("0", "2", (rows,)): 2, ("2", "0", (rows, CLASSES)): 1,
        # stage 1 as stage 0, and d3's input gradient back for the cut's
        ("2", "3", (rows, HIDDEN)): 2, ("3", "2", (rows, half)): 2,
        ("2", "3", (rows, half)): 2, ("3", "2", (rows, HIDDEN)): 2,
    })
    expected = collections.Counter({key: 2 * count for key, count in per_micro_batch.items()})
    assert moved == expected, sorted((moved - expected).items()) + ["missing:"] + sorted(
        (expected - moved).items())


def test_a_composed_model_saves_whole_and_restores_under_another_split(tmp_path):
    """``model.save`` of the composed model loads in plain Keras (weights
    and optimizer state whole) and trains on as it does; its checkpoint
    restores into a model axis alone (1 x 2)."""
    x, y = flat._data()  # pylint: disable=protected-access
    model = _composed(flat._compiled(_mlp(), "adam"), ["d2"], 2)  # pylint: disable=protected-access
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    path = str(tmp_path / "composed.keras")
    with flat._no_skipped_optimizer():  # pylint: disable=protected-access
        model.save(path)
        loaded = keras.models.load_model(path)
    ref.assert_weights_close(model, loaded, atol=0)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(
        str(tmp_path / "ckpt"))
    devices = tfdist.strategies.configure_logical_cpus(4)
    flat_split = tfdist.attach(flat._compiled(_mlp(), "adam"), parallel=flat._layout(  # pylint: disable=protected-access
        1, 2, devices[:2], {".*d1/kernel": (None, "model"), ".*d2/kernel": ("model", None)}))
    flat_split.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)  # (built)
    ref.restore_into(flat_split, checkpoint)
    ref.assert_weights_close(model, flat_split, atol=0)
    ref.assert_train_on_alike([loaded, model, flat_split], x, y, BATCH)


def _refusal(parallel, **attach):
    model = flat._compiled(_mlp(), "adam")  # pylint: disable=protected-access
    with pytest.raises(ConfigurationError) as error:
        tfdist.attach(model, parallel=parallel, **attach).fit(
            *flat._data(), batch_size=BATCH, verbose=0)  # pylint: disable=protected-access
    return str(error.value)


def test_what_the_composition_cannot_run_is_refused_by_name():
    devices = tfdist.strategies.configure_logical_cpus(4)
    pipeline = lambda **kw: tfdist.parallel.Pipeline(cuts=["d2"], micro_batches=2, **kw)  # noqa: E731
    assert "give the Pipeline whose stages it places" in _refusal(_mesh_layout(PAIRS, devices))
    assert "the mesh needs a 'pipeline' axis of that size" in _refusal(
        [pipeline(), flat._layout(1, 2, devices[:2], PAIRS)])  # pylint: disable=protected-access
    assert "splits a dimension over the pipeline axis 'pipeline'" in _refusal(
        [pipeline(), _mesh_layout({".*d1/kernel": ("pipeline", "model")}, devices)])
    assert "its stages run on the mesh's devices" in _refusal(
        [pipeline(devices=["/cpu:0", "/cpu:1"]), _mesh_layout(PAIRS, devices)])
    assert "FullySharded() composes with the model axis" in _refusal(
        [pipeline(), _mesh_layout(PAIRS, devices)],
        communication=tfdist.communication.Compression("bf16"))
    assert "a list of one of each" in _refusal([pipeline(), pipeline()])
