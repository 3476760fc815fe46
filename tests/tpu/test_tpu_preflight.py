"""tfdist.tpu.preflight on CPU: clean models pass; each planted TPU problem is
found and names its layer or data component and a fix."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.errors import ConfigurationError

REPLICAS, GLOBAL_BATCH = 8, 64


def _arrays(n=128, features=5, seed=0):
    rng = np.random.RandomState(seed)
    return rng.rand(n, features).astype("float32"), rng.randint(0, 3, n)


def _dataset(x=None, y=None, batch=GLOBAL_BATCH, drop_remainder=True):
    if x is None:
        x, y = _arrays()
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=drop_remainder)


def _compiled(inputs, outputs):
    model = keras.Model(inputs, outputs)
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _mlp(*middle, dtype=None):
    inputs = keras.Input((5,), dtype=dtype)
    h = keras.layers.Dense(8, activation="relu", dtype=dtype)(inputs)
    for layer in middle:
        h = layer(h)
    return _compiled(inputs, keras.layers.Dense(3, activation="softmax", dtype=dtype)(h))


def _convnet():
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return _compiled(inputs, keras.layers.Dense(3, activation="softmax")(h))


def _embedding_model():
    inputs = keras.Input((6,), dtype="int32")
    h = keras.layers.Embedding(50, 8)(inputs)
    h = keras.layers.GlobalAveragePooling1D()(h)
    return _compiled(inputs, keras.layers.Dense(3, activation="softmax")(h))


def _in_step(name, function):
    """A layer whose call runs ``function`` (the planted problem)."""

    class Planted(keras.layers.Layer):
        def call(self, x):
            return function(x)

    return Planted(name=name)


def _clean_cases():
    rng = np.random.RandomState(1)
    return {
        "mlp": (_mlp(), _dataset()),
        "convnet": (_convnet(), _dataset(rng.rand(128, 8, 8, 1).astype("float32"),
                                         rng.randint(0, 3, 128))),
        "embedding": (_embedding_model(), _dataset(rng.randint(0, 50, (128, 6)).astype("int32"),
                                                   rng.randint(0, 3, 128))),
    }


@pytest.mark.parametrize("name", ["mlp", "convnet", "embedding"])
def test_clean_models_pass(name):
    model, dataset = _clean_cases()[name]
    before = [w.copy() for w in model.get_weights()]

    report = tfdist.tpu.preflight(model, dataset, num_replicas=REPLICAS)

    assert report.ok, str(report)
    assert report.problems == [] and report.compiled
    assert report.per_replica_batch_size == GLOBAL_BATCH // REPLICAS
    assert "OK" in str(report)
    for a, b in zip(before, model.get_weights()):  # nothing trained
        np.testing.assert_array_equal(a, b)


def _shape_kept(function):
    def wrapped(x):
        result = function(x)
        result.set_shape(x.shape)
        return result
    return wrapped


_PLANTED_LAYERS = {
    "boolean_mask": ("dynamic shape", lambda x: x + tf.reduce_sum(tf.boolean_mask(x, x[:, 0] > 0))),
    "where_one_argument": ("dynamic shape",
                           lambda x: x + tf.cast(tf.reduce_sum(tf.where(x > 0.5)), x.dtype)),
    "unique": ("dynamic shape", lambda x: x + tf.cast(
        tf.reduce_sum(tf.unique(tf.reshape(tf.cast(x > 0, tf.int32), [-1]))[0]), x.dtype)),
    "py_function": ("host-only op", _shape_kept(
        lambda x: tf.py_function(lambda t: t * 2, [x], tf.float32))),
    "numpy_function": ("host-only op", _shape_kept(
        lambda x: tf.numpy_function(lambda t: t * 2, [x], tf.float32))),
    "string_op": ("host-only op", lambda x: x + tf.cast(
        tf.strings.length(tf.strings.as_string(x[:, :1]))[:, :1], x.dtype)),
    "float64_math": ("float64", lambda x: tf.cast(tf.cast(x, tf.float64) * 2.0, tf.float32)),
    "histogram": ("XLA", lambda x: x + tf.cast(
        tf.reduce_sum(tf.histogram_fixed_width(x, [0.0, 1.0], nbins=4)), x.dtype)),
}


@pytest.mark.parametrize("layer_name", sorted(_PLANTED_LAYERS))
def test_planted_step_problem_is_named_with_its_layer(layer_name):
    check, function = _PLANTED_LAYERS[layer_name]
    model = _mlp(_in_step(layer_name, function))

    report = tfdist.tpu.preflight(model, _dataset(), num_replicas=REPLICAS)

    assert not report.ok
    found = [p for p in report.problems if p.check == check]
    assert found, str(report)
    assert found[0].where == f"layer {layer_name!r}", str(report)
    assert found[0].fix and layer_name in str(report)


def test_float64_model_is_named():
    report = tfdist.tpu.preflight(_mlp(dtype="float64"), _dataset(), num_replicas=REPLICAS)
    assert any(p.check == "float64" and "variable" in p.where for p in report.problems), str(report)


def _generator_dataset():
    x, y = _arrays(GLOBAL_BATCH)  # one batch: the first pass reads them all
    rows = iter(zip(x, y))
    return tf.data.Dataset.from_generator(
        lambda: rows, output_signature=(tf.TensorSpec([5], tf.float32), tf.TensorSpec([], tf.int64)),
    ).batch(GLOBAL_BATCH, drop_remainder=True)


_PLANTED_DATA = {
    "float64 data": ("float64", "data x",
                     lambda: _dataset(_arrays()[0].astype("float64"), _arrays()[1])),
    "ragged data": ("dynamic shape", "data x", lambda: tf.data.Dataset.from_tensor_slices(
        (tf.ragged.constant([[1.0, 2.0], [3.0]] * 64), np.zeros(128, "int64"))).batch(64)),
    # x's rows have shape (5,), which could be a batch; y's () can not.
    "unbatched data": ("unbatched data", "data y",
                       lambda: tf.data.Dataset.from_tensor_slices(_arrays())),
    "string data": ("host-only op", "data x", lambda: tf.data.Dataset.from_tensor_slices(
        (np.array(["a b"] * 128), np.zeros(128, "int64"))).batch(64, drop_remainder=True)),
    "uneven over cores": ("batch size", "data", lambda: _dataset(batch=60)),
    "python generator": ("not repeatable", "data", lambda: iter(_dataset())),
    "exhausted the second time": ("not repeatable", "data", _generator_dataset),
}


@pytest.mark.parametrize("case", sorted(_PLANTED_DATA))
def test_planted_data_problem_is_named(case):
    check, where, make = _PLANTED_DATA[case]

    report = tfdist.tpu.preflight(_mlp(), make(), num_replicas=REPLICAS)

    assert not report.ok
    assert any(p.check == check and p.where == where for p in report.problems), str(report)


def test_unknown_batch_size_is_read_from_the_first_batch():
    """``ds.batch(n)`` without drop_remainder: the global batch is the first
    batch's (tfdist pads the last partial one), or the one given."""
    dataset = _dataset(x=_arrays(100)[0], y=_arrays(100)[1], batch=GLOBAL_BATCH,
                       drop_remainder=False)  # batches of 64 and 36
    report = tfdist.tpu.preflight(_mlp(), dataset, num_replicas=REPLICAS)
    assert report.ok, str(report)
    assert report.per_replica_batch_size == GLOBAL_BATCH // REPLICAS
    assert any("read from the first batch" in note for note in report.notes), str(report)
    report = tfdist.tpu.preflight(_mlp(), dataset, num_replicas=REPLICAS,
                                  global_batch_size=GLOBAL_BATCH)
    assert report.ok and not any("first batch" in note for note in report.notes), str(report)


def test_a_host_only_op_is_found_when_the_batch_size_comes_from_the_first_batch():
    """The step is compiled at the first batch's shape, so a problem in it
    is found (before, preflight stopped at 'no static batch dimension')."""
    model = _mlp(_in_step("py_function", _PLANTED_LAYERS["py_function"][1]))
    report = tfdist.tpu.preflight(model, _dataset(batch=16, drop_remainder=False),
                                  num_replicas=2)
    assert [p.check for p in report.problems] == ["host-only op"], str(report)


def test_an_empty_dataset_without_a_static_batch_is_named():
    empty = _dataset(batch=GLOBAL_BATCH, drop_remainder=False).take(0)
    report = tfdist.tpu.preflight(_mlp(), empty, num_replicas=REPLICAS)
    assert {p.check for p in report.problems} >= {"not repeatable"}, str(report)


def test_batch_not_a_multiple_of_128_is_advice_not_a_problem():
    report = tfdist.tpu.preflight(_mlp(), _dataset(), num_replicas=REPLICAS)
    assert report.ok and [a.check for a in report.advice] == ["batch size"], str(report)
    assert "128" in report.advice[0].detail


@pytest.mark.parametrize("batch, drop_remainder", [(16, True), (48, False)],
                         ids=["static", "read from the first batch"])
def test_a_per_core_batch_off_multiples_of_8_runs_and_is_advice(batch, drop_remainder):
    """A small clean model, ``batch(16)`` over 8 cores: 2 rows per core.
    It runs on a TPU (the matrix unit pads each core's batch to 8 rows), so
    the report is ``ok``, with one line of advice saying what is wasted."""
    report = tfdist.tpu.preflight(_mlp(), _dataset(batch=batch, drop_remainder=drop_remainder),
                                  num_replicas=REPLICAS)
    assert report.ok and report.compiled, str(report)
    (advice,) = report.advice
    assert advice.check == "batch size" and "not a multiple of 8" in advice.detail
    assert "a global batch of 64" in advice.change or "a global batch of 64" in str(advice)
    assert sum(line.startswith("  advice:") for line in str(report).splitlines()) == 1


@pytest.mark.parametrize("options, named", [
    ({"num_replicas": 0}, "`num_replicas`"), ({"global_batch_size": -1}, "`global_batch_size`"),
])
def test_bad_arguments_name_the_argument(options, named):
    with pytest.raises(ConfigurationError, match=named):
        tfdist.tpu.preflight(_mlp(), _dataset(), **options)


def test_uncompiled_model_is_a_clear_error():
    inputs = keras.Input((5,))
    with pytest.raises(ConfigurationError, match="not compiled"):
        tfdist.tpu.preflight(keras.Model(inputs, keras.layers.Dense(3)(inputs)), _dataset())
