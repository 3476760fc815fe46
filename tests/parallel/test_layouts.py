"""Keras' layout API read for tensor parallelism (`tfdist.parallel.layouts`):
each rule of a ``keras.distribution.ModelParallel`` against a built model,
as Keras' LayoutMap matches it, and each layout tfdist cannot honour
refused naming the weight and the rule."""

import keras
import pytest

from tfdist.errors import ConfigurationError
from tfdist.parallel.layouts import ModelLayout

DEVICES = ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]


def _distribution(rules: dict, shape=(1, 2), names=("batch", "model"), batch="batch"):
    count = shape[0] * shape[1]
    mesh = keras.distribution.DeviceMesh(shape, list(names), DEVICES[:count])
    layout_map = keras.distribution.LayoutMap(mesh)
    for key, axes in rules.items():
        layout_map[key] = axes
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name=batch)


def _mlp(bias=True):
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu", use_bias=bias, name="d1")(inputs)
    return keras.Model(inputs, keras.layers.Dense(4, name="d2")(hidden))


def _sharded(layout):
    return [(w.path, w.layer_type, w.form, w.dimension) for w in layout.sharded]


def test_a_column_then_row_mlp():
    layout = ModelLayout.of(_distribution(
        {"d1/kernel": (None, "model"), "d1/bias": ("model",), "d2/kernel": ("model", None)}),
        _mlp())
    assert layout.axes == {"data": 1, "pipeline": 1, "model": 2}
    assert (layout.data_axis, layout.model_axis) == ("batch", "model")
    assert layout.devices == (("cpu:0", "cpu:1"),)
    assert _sharded(layout) == [("d1/kernel", "Dense", "column", 1),
                                ("d1/bias", "Dense", "column", 0),
                                ("d2/kernel", "Dense", "row", 0)]


def test_the_keras_io_guides_rules_run_with_a_warning_for_the_rule_that_matches_nothing():
    """keras.io's distribution guide: a column kernel, a bias rule for a
    layer without a bias (Keras ignores it; tfdist names it) and an output
    rule; regular expressions are matched whole, as Keras matches them."""
    distribution = _distribution({"d1/kernel": (None, "model"), "d1/bias": ("model",),
                                  "d2/output": ("batch", None)}, shape=(2, 2),
                                 names=("batch", "model"))
    with pytest.warns(UserWarning, match=r"\['d1/bias'\] match no weight"):
        layout = ModelLayout.of(distribution, _mlp(bias=False))
    assert _sharded(layout) == [("d1/kernel", "Dense", "column", 1)]
    assert layout.outputs == (("d2", ("batch", None)),)
    assert layout.axes == {"data": 2, "pipeline": 1, "model": 2}
    assert layout.devices == (("cpu:0", "cpu:1"), ("cpu:2", "cpu:3"))


def test_a_mesh_with_the_model_axis_first_gives_each_data_index_its_row():
    layout = ModelLayout.of(_distribution({"d1/kernel": (None, "model")}, shape=(2, 2),
                                          names=("model", "batch")), _mlp())
    assert layout.devices == (("cpu:0", "cpu:2"), ("cpu:1", "cpu:3"))


def test_attention_by_heads_and_an_embedding_by_vocabulary():
    tokens = keras.Input((5,), dtype="int32")
    x = keras.layers.Embedding(12, 4, name="tokens")(tokens)
    x = keras.layers.MultiHeadAttention(2, 3, name="mha")(x, x)
    model = keras.Model(tokens, keras.layers.Embedding(8, 4, name="other")(tokens) + x)
    layout = ModelLayout.of(_distribution({
        "tokens/embeddings": ("model", None), "other/embeddings": (None, "model"),
        "mha/(query|key|value)/kernel": (None, "model", None),
        "mha/(query|key|value)/bias": ("model", None),
        "mha/attention_output/kernel": ("model", None, None)}), model)
    assert sorted(_sharded(layout)) == sorted([
        ("tokens/embeddings", "Embedding", "vocabulary", 0),
        ("mha/query/kernel", "EinsumDense", "column", 1),
        ("mha/query/bias", "EinsumDense", "column", 0),
        ("mha/key/kernel", "EinsumDense", "column", 1),
        ("mha/key/bias", "EinsumDense", "column", 0),
        ("mha/value/kernel", "EinsumDense", "column", 1),
        ("mha/value/bias", "EinsumDense", "column", 0),
        ("mha/attention_output/kernel", "EinsumDense", "row", 0),
        ("other/embeddings", "Embedding", "embedding_columns", 1)])


def test_a_data_axis_of_one_in_a_weight_rule_changes_nothing():
    """keras-hub's layouts name the data axis too (weights also sharded
    over it, FSDP-style): with one data index that is no split."""
    layout = ModelLayout.of(_distribution({"d1/kernel": ("batch", "model")}), _mlp())
    assert _sharded(layout) == [("d1/kernel", "Dense", "column", 1)]


def test_a_weight_two_rules_match_is_refused_naming_both():
    """As Keras' LayoutMap: a rule that is the path itself wins; two regular
    expressions matching a path are an error (naming both)."""
    ModelLayout.of(_distribution({"d1/kernel": (None, "model"),
                                  "d.*/kernel": ("model", None)}), _mlp())
    with pytest.raises(ConfigurationError, match=r"weight 'd1/kernel' is matched by 2 layout "
                                                 r"rules: \['d1/.\*', '.\*/kernel'\]"):
        ModelLayout.of(_distribution({"d1/.*": (None, "model"),
                                      ".*/kernel": ("model", None)}), _mlp())


@pytest.mark.parametrize("rules,shape,message", [
    ({"d2/kernel": (None, "model")}, (1, 3),
     r"'d2/kernel'.*dimension 1 \(4\) does not divide over the model axis' 3 devices"),
    ({"d1/kernel": ("model", "model")}, (1, 2), r"'d1/kernel'.*splits 2 dimensions"),
    ({"d1/kernel": (None, None, "model")}, (1, 2), r"'d1/kernel'.*names 3 dimensions"),
    ({"d1/kernel": ("batch", "model")}, (2, 2),
     r"'d1/kernel'.*over the data axis 'batch'.*FullySharded"),
    ({"d2/kernel": ("model", None), "d2/bias": ("model",)}, (1, 2),
     r"'d2/bias'.*splits a bias.*kernel is split by rows"),
    ({"d2/bias": ("model",)}, (1, 2), r"'d2/bias'.*splits a bias.*kernel is not split"),
])
def test_a_layout_tfdist_cannot_honour_names_the_weight_and_the_rule(rules, shape, message):
    with pytest.raises(ConfigurationError, match=message):
        ModelLayout.of(_distribution(rules, shape), _mlp())


def test_a_layer_without_a_sharded_form_is_refused_naming_its_type():
    inputs = keras.Input((6, 6, 1))
    x = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    model = keras.Model(inputs, keras.layers.Flatten()(x))
    with pytest.raises(ConfigurationError, match=r"'conv/kernel'.*is a Conv2D, which has no "
                                                 r"sharded form"):
        ModelLayout.of(_distribution({"conv/kernel": (None, None, None, "model")}), model)


def test_a_mesh_of_other_axes_is_refused():
    mesh = keras.distribution.DeviceMesh((1, 2, 2), ["batch", "model", "seq"], DEVICES)
    layout_map = keras.distribution.LayoutMap(mesh)
    distribution = keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    with pytest.raises(ConfigurationError, match=r"mesh of two axes.*\['batch', 'model', 'seq'\]"):
        ModelLayout.of(distribution, _mlp())
    with pytest.raises(ConfigurationError, match="is a keras.distribution.ModelParallel"):
        ModelLayout.of(keras.distribution.DataParallel(devices=DEVICES[:2]), _mlp())
