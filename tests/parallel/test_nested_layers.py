"""Units and cuts by layer path (`tfdist._internal.keras.layer_paths`):
a model whose blocks sit inside one layer (a functional backbone used as
a layer, a layer of one's own holding a list of blocks) cut between its
blocks and sharded block by block, against one-device Keras; what cannot
be split that way is refused, naming the paths."""

import keras
import pytest
import tensorflow as tf

import tfdist
from tests.parallel.test_pipeline import _assert_equal_to, _fit
from tests.support import reference as ref
from tfdist._internal.keras import layer_paths, layer_units
from tfdist.communication import FullySharded
from tfdist.errors import ConfigurationError


class BlockStack(keras.layers.Layer):
    """Blocks held as a list, run in a loop with a residual addition: the
    way transformer encoders are often written as one layer."""

    def __init__(self, blocks: int, width: int, **kwargs):
        super().__init__(**kwargs)
        self.blocks = [keras.layers.Dense(width, "tanh", name=f"block_{index}")
                       for index in range(blocks)]

    def call(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x


def _backbone_model(kind: str) -> keras.Model:
    """stem -> backbone (4 blocks of 8) -> head: ``kind`` "functional" (the
    backbone a keras.Model used as a layer, with a residual Add between
    blocks) or "stack" (a `BlockStack`)."""
    keras.utils.set_random_seed(5)
    width = 8
    if kind == "functional":
        inner = keras.Input((width,))
        x = inner
        for index in range(4):
            y = keras.layers.Dense(width, "tanh", name=f"block_{index}")(x)
            x = keras.layers.Add(name=f"residual_{index}")([x, y])
        backbone = keras.Model(inner, x, name="backbone")
    else:
        backbone = BlockStack(4, width, name="backbone")
    inputs = keras.Input((ref.NUM_FEATURES,))
    x = keras.layers.Dense(width, "relu", name="stem",
                           kernel_regularizer=keras.regularizers.L2(0.01))(inputs)
    x = backbone(x)
    outputs = keras.layers.Dense(ref.NUM_CLASSES, "softmax", name="head")(x)
    return ref.compile_model(keras.Model(inputs, outputs), "adam")


def _device_index(device: str) -> int:
    return tf.DeviceSpec.from_string(device).device_index


@pytest.mark.parametrize("kind", ["functional", "stack"])
def test_a_pipeline_cut_between_nested_blocks_equals_one_device(kind):
    """cuts=["backbone/block_1"]: stage 0 holds the stem and blocks 0-1,
    stage 1 blocks 2-3 and the head (each weight and its Adam moments on
    its stage's device); one device's weights, History, evaluation and
    predictions."""
    expected = _fit(_backbone_model(kind))
    pipeline = tfdist.parallel.Pipeline(cuts=["backbone/block_1"], micro_batches=3)
    model = tfdist.attach(_backbone_model(kind), parallel=pipeline)
    _assert_equal_to(expected, _fit(model))
    stage_of = {"stem": 0, "block_0": 0, "block_1": 0, "block_2": 1, "block_3": 1, "head": 1}
    backbone = model.get_layer("backbone")
    for name, stage in stage_of.items():
        layer = model.get_layer(name) if name in ("stem", "head") else next(
            block for block in layer_paths.children(backbone) if block.name == name)
        for weight in layer.weights:
            assert _device_index(weight.value.device) == stage, (name, weight.value.device)
    assert pipeline.ordering_edges >= 2


def test_data_x_pipeline_x_fully_sharded_cut_inside_a_backbone_equals_one_device():
    """2 replicas x 2 stages cut inside the backbone, each stage's weights
    sharded over the replicas: one device's numbers."""
    expected = _fit(_backbone_model("functional"))
    strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    with strategy.scope():
        model = _backbone_model("functional")
    model = tfdist.attach(model, strategy, communication=FullySharded(),
                          parallel=tfdist.parallel.Pipeline(cuts=["backbone/block_2"],
                                                            micro_batches=2))
    _assert_equal_to(expected, _fit(model))
    block_3 = model.get_layer("backbone").get_layer("block_3")
    # (stage 1 of replica r on device 2 + r; each replica half the kernel)
    assert [(_device_index(c.device), tuple(c.shape)) for c in block_3.kernel.value.values] == [
        (2, (32,)), (3, (32,))]


@pytest.mark.parametrize("kind", ["functional", "stack"])
def test_fully_sharded_units_by_path_equal_one_device_and_make_each_block_a_unit(kind):
    """FullySharded(units=[r"backbone/block_\\d"]) over 2 replicas: each
    block is a unit (gathered, freed, recomputed on its own), the stem and
    the head beside them too, the backbone not; one device's numbers. Each
    weight is gathered in the forward and again in the backward pass."""
    expected = _fit(_backbone_model(kind))
    strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    with strategy.scope():
        model = _backbone_model(kind)
    model = tfdist.attach(model, strategy,
                          communication=FullySharded(units=[r"backbone/block_\d"]))
    _assert_equal_to(expected, _fit(model))
    backbone = model.get_layer("backbone")
    assert not layer_units.is_wrapped(backbone, "gather")
    assert [layer_units.is_wrapped(block, "gather")
            for block in layer_paths.children(backbone)
            if block.trainable_weights] == [True] * 4
    assert layer_units.is_wrapped(model.get_layer("stem"), "gather")


def test_paths_that_cannot_split_the_model_are_refused_naming_them():
    x, y, _ = ref.classification_arrays(8)
    model = _backbone_model("functional")
    with pytest.raises(ConfigurationError, match=r"no layer at path 'backbone/block_9'.*"
                                                 r"'backbone/block_0'"):
        tfdist.attach(model, parallel=tfdist.parallel.Pipeline(
            cuts=["backbone/block_9"], micro_batches=2)).fit(x, y, verbose=0)
    with pytest.raises(ConfigurationError, match="holds another named layer"):
        layer_paths.units(_backbone_model("functional"), ["backbone", "backbone/block_1"])
    with pytest.raises(ConfigurationError, match="must name different layers in the model"):
        tfdist.attach(_backbone_model("functional"), parallel=tfdist.parallel.Pipeline(
            cuts=["backbone/block_2", "backbone/block_1"], micro_batches=2)).fit(x, y, verbose=0)
    with pytest.raises(ConfigurationError, match="only reshard_after_forward=True"):
        FullySharded(units=["backbone/block_0"], reshard_after_forward=False)
    with pytest.raises(ConfigurationError, match="must be a list of layer paths"):
        FullySharded(units="backbone/block_0")
    strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    with strategy.scope():
        replicated = _backbone_model("functional")
    with pytest.raises(ConfigurationError, match=r"`units` \['encoder/.*'\] match no layer's "
                                                 r"path; the model's layers are \['stem'"):
        tfdist.attach(replicated, strategy, communication=FullySharded(
            units=["encoder/.*"])).fit(x, y, verbose=0)


def test_a_layer_opened_to_reach_a_cut_must_not_own_weights_of_its_own():
    """A layer that holds sublayers and a weight of its own: cutting inside
    it would leave its weight in no stage; refused, naming the weight."""

    class Scaled(BlockStack):
        def build(self, shape):
            self.scale = self.add_weight(shape=(), initializer="ones", name="scale")

        def call(self, x):
            return super().call(x) * self.scale

    def scaled_model():
        keras.utils.set_random_seed(5)
        inputs = keras.Input((ref.NUM_FEATURES,))
        x = keras.layers.Dense(8, name="stem")(inputs)
        x = Scaled(3, 8, name="scaled")(x)
        return ref.compile_model(keras.Model(inputs, keras.layers.Dense(
            ref.NUM_CLASSES, "softmax", name="head")(x)), "adam")

    with pytest.raises(ConfigurationError, match=r"'scaled' is opened.*owns weights of its "
                                                 r"own.*'scale'"):
        x, y, _ = ref.classification_arrays(8)
        tfdist.attach(scaled_model(), parallel=tfdist.parallel.Pipeline(
            cuts=["scaled/block_0"], micro_batches=2)).fit(x, y, verbose=0)
    # (cut at its own level instead: it runs as one unit, as one device does)
    expected = _fit(scaled_model())
    _assert_equal_to(expected, _fit(tfdist.attach(scaled_model(), parallel=tfdist.parallel.Pipeline(
        cuts=["stem"], micro_batches=2))))
