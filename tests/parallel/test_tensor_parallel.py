"""Tensor parallelism from Keras' layout API (`tfdist.parallel.tensor_parallel`):
a model attached with ``parallel=keras.distribution.ModelParallel(...)``
trains, evaluates and predicts as single-device Keras does (weights,
History, predictions to 1e-5), on meshes 1x2, 1x4 and 2x2; its split
weights live as shards on the model devices, read whole outside a step;
what crosses devices in the traced step is the batch's activations, never
a weight; what it cannot run is refused by name."""

import contextlib
import warnings

import numpy as np
import pytest
import tensorflow as tf

import keras
import tfdist
from tests.support import reference as ref
from tfdist.errors import ConfigurationError
from tfdist.parallel import device_traffic, tensor_parallel

FEATURES, HIDDEN, CLASSES, EXAMPLES, BATCH = 5, 8, 3, 36, 8  # (36 = 4 batches + a partial one)


def _mlp(seed: int = 3, regularizer=None) -> keras.Model:
    """Dense column-then-row pair, then a replicated head (keras.io's shape);
    ``regularizer`` on the pair's kernels and d1's bias."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(HIDDEN, activation="relu", name="d1",
                                kernel_regularizer=regularizer,
                                bias_regularizer=regularizer)(inputs)
    hidden = keras.layers.Dense(HIDDEN, activation="tanh", name="d2",
                                kernel_regularizer=regularizer)(hidden)
    outputs = keras.layers.Dense(CLASSES, activation="softmax", name="head")(hidden)
    return keras.Model(inputs, outputs)


def _compiled(model, optimizer="adam"):
    model.compile(optimizer=ref.make_optimizer(optimizer), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def _layout(data: int, model: int, devices, rules):
    mesh = keras.distribution.DeviceMesh((data, model), ["batch", "model"], devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    for key, axes in rules.items():
        layout_map[key] = axes
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")


MEGATRON = {"d1/kernel": (None, "model"), "d1/bias": ("model",), "d2/kernel": ("model", None)}


def _data():
    x, y, _ = ref.classification_arrays(EXAMPLES)
    return x[:, :FEATURES].astype("float32"), y


def _one_device(optimizer, epochs=2, regularizer=None):
    x, y = _data()
    model = _compiled(_mlp(regularizer=regularizer), optimizer)
    history = model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    return model, history.history


def _split(data, model_devices, optimizer, rules=MEGATRON, regularizer=None):
    devices = tfdist.strategies.configure_logical_cpus(4)
    if data == 1:
        strategy = None
        model = _compiled(_mlp(regularizer=regularizer), optimizer)
    else:
        strategy = tfdist.make_strategy(  # (over the mesh's first column)
            "mirrored", devices=devices[:data * model_devices:model_devices])
        with strategy.scope():
            model = _compiled(_mlp(regularizer=regularizer), optimizer)
    distribution = _layout(data, model_devices, devices[:data * model_devices], rules)
    tfdist.attach(model, strategy, parallel=distribution)
    return model, strategy


@pytest.mark.parametrize("data,model_devices,optimizer", [
    (1, 2, "adam"), (1, 4, "sgd"), (2, 2, "adam")])
def test_fit_evaluate_predict_equal_one_device(data, model_devices, optimizer):
    expected, expected_history = _one_device(optimizer)
    model, _ = _split(data, model_devices, optimizer)
    x, y = _data()
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history, history.history)
    np.testing.assert_allclose(model.predict(x, batch_size=BATCH, verbose=0),
                               expected.predict(x, batch_size=BATCH, verbose=0), atol=1e-5)
    ref.assert_logs_close(expected.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True),
                          model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True))


def test_shards_live_on_the_model_devices_of_each_replica():
    model, strategy = _split(2, 2, "adam")
    x, y = _data()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    kernel = model.get_layer("d1").kernel
    shards = tensor_parallel.shards_of(kernel)
    assert [tuple(s.shape) for s in shards] == [(FEATURES, HIDDEN // 2)] * 2
    by_replica = [[copy.device[-5:] for copy in s.value.values] for s in shards]
    assert by_replica == [["CPU:0", "CPU:2"], ["CPU:1", "CPU:3"]]  # shard j: row r's device j
    assert kernel.numpy().shape == (FEATURES, HIDDEN)  # read whole
    np.testing.assert_array_equal(
        kernel.numpy(), np.concatenate([s.numpy() for s in shards], axis=1))
    # Written whole: the shards take their parts.
    kernel.assign(np.arange(FEATURES * HIDDEN, dtype="float32").reshape(FEATURES, HIDDEN))
    np.testing.assert_array_equal(shards[1].numpy(), kernel.numpy()[:, HIDDEN // 2:])
    # The optimizer's state: per shard, beside it (not whole on one device).
    momentum_shapes = sorted(tuple(v.shape) for v in model.optimizer.variables
                             if "d1_kernel" in v.path)
    assert momentum_shapes == [(FEATURES, HIDDEN // 2)] * 4, momentum_shapes
    del strategy


@contextlib.contextmanager
def _no_skipped_optimizer():
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*Skipping variable loading for optimizer.*")
        yield


def _phase(crossing, optimizer) -> str:
    name = crossing.tensor
    if name.startswith("gradient_tape/"):
        return "backward"
    if name.split("/")[0] == optimizer.name:
        return "optimizer"
    return "forward"


@pytest.mark.parametrize("data,optimizer", [(1, "adam"), (2, "sgd")])
def test_l1_l2_regularizers_of_split_weights_equal_one_device(data, optimizer):
    """``kernel_regularizer`` / ``bias_regularizer`` L1L2 on split weights:
    the sum of each shard's term (`tfdist.parallel.split_regularizers`),
    equal to one device's loss and weights."""
    regularizer = keras.regularizers.L1L2(l1=0.01, l2=0.02)
    expected, expected_history = _one_device(optimizer, regularizer=regularizer)
    model, _ = _split(data, 2, optimizer, regularizer=regularizer)
    x, y = _data()
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history, history.history)


@pytest.mark.parametrize("axes", [("model", None), (None, "model")], ids=["rows", "columns"])
def test_a_regularized_embedding_split_equals_one_device(axes):
    """An ``Embedding`` with ``embeddings_regularizer=L2``, split by
    vocabulary rows (a sparse lookup gradient and the term's dense one,
    added on the shard's device) or by columns, on a 1x2 mesh."""
    tokens = np.random.default_rng(0).integers(0, 8, size=(24, 5)).astype("int32")
    labels = (tokens.sum(axis=1) % CLASSES).astype("int64")

    def model():
        keras.utils.set_random_seed(5)
        return _compiled(keras.Sequential([
            keras.Input((5,), dtype="int32"),
            keras.layers.Embedding(8, 4, embeddings_regularizer=keras.regularizers.L2(0.05),
                                   name="table"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(CLASSES, activation="softmax", name="head")]), "adam")

    expected = model()
    expected_history = expected.fit(tokens, labels, batch_size=BATCH, epochs=2, shuffle=False,
                                    verbose=0)
    devices = tfdist.strategies.configure_logical_cpus(2)
    split = tfdist.attach(model(), parallel=_layout(1, 2, devices, {".*table/embeddings": axes}))
    history = split.fit(tokens, labels, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert tensor_parallel.shards_of(split.get_layer("table").embeddings)
    ref.assert_weights_close(expected, split)
    ref.assert_logs_close(expected_history.history, history.history)


@pytest.mark.parametrize("regularized", [False, True])
def test_the_step_moves_activations_never_a_weight(regularized):
    """Per phase of one traced step on a 1x2 mesh, what crosses devices:
    forward, the batch's input to model device 1 (d1, column) and d2's
    partial product back (row); backward, the output's gradient to device
    1 (the input needs none); the optimizer, scalars only (its step and
    rate). Nothing of a weight's shape, and d1's split output never
    leaves its devices (its join is not needed). With L2 regularizers on
    the split weights, each of device 1's shards' terms crosses as a
    scalar; their gradients are computed and added to the layers' there."""
    model, _ = _split(1, 2, "adam",
                      regularizer=keras.regularizers.L2(0.01) if regularized else None)
    x, y = _data()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    from tfdist.training import keras_fit  # pylint: disable=import-outside-toplevel

    steps = keras_fit.attachment_of(model).trainer()._steps  # pylint: disable=protected-access
    batch = tfdist.Batch(tf.constant(x[:BATCH]), tf.constant(y[:BATCH])).to_structure()
    graph = tf.function(steps.train).get_concrete_function(batch).graph
    crossings = device_traffic.crossings(graph, default_device="/cpu:0")
    by_phase = {}
    for crossing in crossings:
        if crossing.shape:  # (scalars: the optimizer's step count and rate)
            by_phase.setdefault(_phase(crossing, model.optimizer), []).append(
                (crossing.source[-1], crossing.destination[-1], crossing.shape))
    assert by_phase == {
        "forward": [("0", "1", (BATCH, FEATURES)), ("1", "0", (BATCH, HIDDEN))],
        "backward": [("0", "1", (BATCH, HIDDEN))],
    }, by_phase
    scalars = [c for c in crossings if not c.shape]
    phases = {_phase(c, model.optimizer) for c in scalars}
    assert phases == ({"optimizer", "forward"} if regularized else {"optimizer"}), scalars
    if regularized:  # (d1's kernel and bias shards', d2's kernel shard's terms on device 1)
        assert sorted((c.source[-1], c.destination[-1]) for c in scalars
                      if _phase(c, model.optimizer) == "forward") == [("1", "0")] * 3, scalars


def test_saved_model_loads_in_plain_keras_and_trains_on(tmp_path):
    """``model.save`` of a 2x2-split model: plain Keras loads its weights
    and its optimizer's state whole, and its next epoch is the split
    model's next epoch (so one device's)."""
    model, _ = _split(2, 2, "adam")
    x, y = _data()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    path = str(tmp_path / "split.keras")
    with _no_skipped_optimizer():
        model.save(path)
        loaded = keras.models.load_model(path)
    ref.assert_weights_close(model, loaded, atol=0)
    assert [v.shape for v in loaded.optimizer.variables] == [
        v.shape for v in _one_device("adam", epochs=1)[0].optimizer.variables]
    loaded.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    ref.assert_weights_close(loaded, model)


def test_checkpoint_restores_across_layouts(tmp_path):
    """A tf.train.Checkpoint of a 1x2-split model's weights and optimizer
    restores into a 1x4 split and into a plain model (and back)."""
    source, _ = _split(1, 2, "adam")
    x, y = _data()
    source.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    path = tf.train.Checkpoint(model=source, optimizer=source.optimizer).write(
        str(tmp_path / "ckpt"))
    plain = _compiled(_mlp(seed=9), "adam")
    plain.optimizer.build(plain.trainable_variables)
    ref.restore_into(plain, path)
    ref.assert_weights_close(source, plain, atol=0)
    wider, _ = _split(1, 4, "adam")
    wider.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)  # (built)
    ref.restore_into(wider, path)
    ref.assert_weights_close(source, wider, atol=0)
    ref.assert_train_on_alike([plain, source, wider], x, y, BATCH)


@pytest.mark.parametrize("rules,message", [
    ({"d1/kernel": (None, "model"), "d2/kernel": (None, "model"),
      "head/kernel": ("model", None)}, None),  # (accepted: two column layers, then a row one)
    ({"d1/kernel": ("model", "model")}, "splits 2 dimensions"),
    ({"d1/kernel": (None, "model"), "d1/bias": ("batch",)}, None),
    ({"d1/kernel": (None, "model"), "head/output": ("batch", None)}, None),
    ({"d1/kernel": (None, "model"), "d1/output": (None, "model")}, "sequence parallelism"),
    ({"d1/kernel": (None, "model"), "d2/kernel": ("model", None),
      "d2/bias": ("model",)}, "splits a bias over the model axis"),
    ({"head/bias": ("model",), "head/kernel": (None, "model")}, "does not divide"),
])
def test_layouts_accepted_or_refused(rules, message):
    if message is None:
        model, _ = _split(1, 2, "sgd", rules)
        x, y = _data()
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
        return
    model, _ = _split(1, 2, "sgd", rules)
    with pytest.raises(ConfigurationError, match=message):
        model.fit(*_data(), batch_size=BATCH, verbose=0)


class OwnComputeLoss(keras.Model):
    """keras.io's ``compute_loss`` override: Keras' loss plus a term of its own."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training)
        return loss + 0.1 * tf.reduce_mean(tf.square(y_pred))


@pytest.mark.parametrize("data", [1, 2])
def test_a_models_own_compute_loss_runs_in_the_split_step(data):
    """A model overriding only ``compute_loss`` runs tfdist's step, which
    calls it with the split weights: one device's weights and History."""
    def own(model):
        return _compiled(OwnComputeLoss(model.inputs, model.outputs), "adam")

    x, y = _data()
    expected = own(_mlp())
    expected_history = expected.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    devices = tfdist.strategies.configure_logical_cpus(4)
    strategy = (tfdist.make_strategy("mirrored", devices=devices[::2]) if data > 1
                else tf.distribute.get_strategy())
    with strategy.scope():
        model = own(_mlp())
    tfdist.attach(model, strategy if data > 1 else None,
                  parallel=_layout(data, 2, devices[:2 * data], MEGATRON))
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert tensor_parallel.shards_of(model.get_layer("d1").kernel)
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history.history, history.history)


def test_mesh_devices_lists_each_replicas_model_devices():
    """One process: replica r's k model devices from its own device's
    index on (the strategy over the mesh's first column, as ``_split``)."""
    devices = tfdist.strategies.configure_logical_cpus(4)
    strategy = tfdist.make_strategy("mirrored", devices=devices[::2])
    assert tfdist.parallel.mesh_devices(strategy, model_devices=2) == [
        f"/device:CPU:{index}" for index in range(4)]
    assert tfdist.parallel.mesh_devices(None, model_devices=4) == [
        f"/device:CPU:{index}" for index in range(4)]


@pytest.mark.parametrize("data,optimizer", [(1, "adam"), (2, "sgd")])
def test_clipnorm_clips_each_split_weight_by_its_whole_norm(data, optimizer):
    """``clipnorm`` small enough to clip every step: each split weight's
    gradient scaled by its whole norm (summed from its shards' squares on
    their devices), as one device scales the whole weight's."""
    def clipped(model):
        model.optimizer.clipnorm = 0.05
        return model

    x, y = _data()
    expected = clipped(_compiled(_mlp(), optimizer))
    expected_history = expected.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    devices = tfdist.strategies.configure_logical_cpus(4)
    strategy = (tfdist.make_strategy("mirrored", devices=devices[::2]) if data > 1
                else tf.distribute.get_strategy())
    with strategy.scope():
        model = clipped(_compiled(_mlp(), optimizer))
    tfdist.attach(model, strategy if data > 1 else None,
                  parallel=_layout(data, 2, devices[:2 * data], MEGATRON))
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history.history, history.history)
    # (clipped for real: without clipping the weights end elsewhere)
    unclipped = _compiled(_mlp(), optimizer)
    unclipped.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert ref.largest_difference(unclipped.get_weights(), expected.get_weights()) > 1e-2


def test_refusals_name_what_cannot_run_yet():
    devices = tfdist.strategies.configure_logical_cpus(4)
    model = _compiled(_mlp(), "adam")
    with pytest.raises(ConfigurationError, match="strategy has 1 replica"):
        tfdist.attach(model, parallel=_layout(2, 2, devices, MEGATRON)).fit(
            *_data(), batch_size=BATCH, verbose=0)
