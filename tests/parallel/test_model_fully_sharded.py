"""The model axis composed with fully sharded weights over the data axis
(data x model x fully sharded): ``parallel=ModelParallel(...)`` with
``communication=FullySharded()`` on a mesh of 2 replicas x 2 model devices
(4 logical CPUs). Each split weight's shards are sliced over the replicas
(replica r keeps slice r of shard j on its model device j), each
replicated weight over the replicas' first devices; a step gathers each
shard among the devices that hold it, and reduce-scatters its gradient
there. Weights, History, evaluation and predictions equal single-device
Keras' (1e-5); the collectives of each phase of one traced step run where
the slices live and no weight crosses between devices; a checkpoint saves
the ordinary Keras form and restores under other splits."""

import collections

import numpy as np
import pytest
import tensorflow as tf

import keras
import tfdist
from tests.parallel import test_model_pipeline as stacked
from tests.parallel import test_tensor_parallel as flat
from tests.parallel import test_tensor_parallel_layers as layers
from tests.support import reference as ref
from tests.support.strategy_columns import collectives_bounded
from tfdist.communication import FullySharded
from tfdist.errors import ConfigurationError
from tfdist.parallel import device_traffic, tensor_parallel

BATCH = flat.BATCH
# The stacked MLP's Megatron pairs (d1 -> d2, d3 -> d4) and a replicated head.
PAIRS = stacked.PAIRS


def _mesh(rules):
    devices = tfdist.strategies.configure_logical_cpus(4)
    strategy = tfdist.make_strategy("mirrored", devices=devices[0:4:2])  # the mesh's first column
    return strategy, flat._layout(2, 2, devices, rules)  # pylint: disable=protected-access


def _sharded(build, rules=PAIRS):
    strategy, layout = _mesh(rules)
    with strategy.scope():
        model = build()
    tfdist.attach(model, strategy, parallel=layout, communication=FullySharded())
    return model, strategy


def _slices(variable, strategy):
    """(device, length) of each replica's slice of ``variable``."""
    return [(copy.device[-5:], int(copy.shape[0]))
            for copy in strategy.experimental_local_results(variable.value)]


@pytest.mark.parametrize("optimizer,regularized,clipnorm,with_input", [
    ("adam", False, None, True),
    ("sgd", True, 0.05, True),    # (L2 on the split kernels; clipnorm binds)
    ("adam", False, None, False),  # (a Sequential Keras builds on its first batch)
])
def test_mlp_sliced_over_replicas_and_split_over_model_devices_equals_one_device(
        optimizer, regularized, clipnorm, with_input):
    x, y = flat._data()  # pylint: disable=protected-access
    regularizer = keras.regularizers.L2(0.01) if regularized else None

    def build(with_input=True):
        model = flat._compiled(stacked._mlp(regularizer, with_input), optimizer)  # pylint: disable=protected-access
        model.optimizer.clipnorm = clipnorm
        return model

    expected = build()
    expected_history = expected.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                                    verbose=0).history
    model, strategy = _sharded(lambda: build(with_input))
    with collectives_bounded(strategy, seconds=120):
        history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    stacked._assert_equal(expected, expected_history, model, history, x, y)  # pylint: disable=protected-access
    kernel = model.get_layer("d1").kernel  # (5, 8): shards (5, 4) of 20, slices of 10
    assert [_slices(s, strategy) for s in tensor_parallel.shards_of(kernel)] == [
        [("CPU:0", 10), ("CPU:2", 10)], [("CPU:1", 10), ("CPU:3", 10)]]
    head = model.get_layer("head").kernel  # (8, 3): replicated, sliced 12 + 12
    assert _slices(head, strategy) == [("CPU:0", 12), ("CPU:2", 12)]
    if clipnorm:  # (the clip binds: a larger clipnorm trains otherwise)
        loose = build()
        loose.optimizer.clipnorm = 100.0
        loose.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        assert not np.allclose(loose.get_layer("d1").kernel.numpy(), kernel.numpy(), atol=1e-4)


def test_transformer_split_by_heads_and_vocabulary_and_sliced_equals_one_device():
    """The embedding split by vocabulary rows (its sparse gradient sliced
    as one device's), the attention by heads (causal) and the feed-forward
    pair by columns then rows, every shard sliced over the replicas."""
    x, y = layers._data()  # pylint: disable=protected-access
    expected = layers._model(causal=True)  # pylint: disable=protected-access
    expected_history = expected.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                                    verbose=0).history
    model, strategy = _sharded(lambda: layers._model(causal=True), layers.TRANSFORMER)  # pylint: disable=protected-access
    with collectives_bounded(strategy, seconds=120):
        history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    ref.assert_logs_close(expected_history, history)
    ref.assert_weights_close(expected, model)
    ref.assert_evaluates_and_predicts_alike(expected, model, x, y, BATCH)
    table = tensor_parallel.shards_of(model.get_layer("embedding").embeddings)
    assert [_slices(s, strategy) for s in table] == [  # (16 x 8: shards of 8 rows, 64 / 2)
        [("CPU:0", 32), ("CPU:2", 32)], [("CPU:1", 32), ("CPU:3", 32)]]


def _phases(graph, optimizer_name: str) -> dict:
    """Each op's (replica, phase) in a replica step's graph, by the order
    it was traced (MirroredStrategy traces each replica's step through,
    naming the second's ops ``replica_1/...``): forward until the replica's
    first gradient op, then backward until its optimizer's first op."""
    phase, started = {}, {}
    for op in graph.get_operations():
        replica = "replica_1" if "replica_1/" in op.name else "replica_0"
        name = op.name.replace("replica_1/", "")
        if "gradient_tape/" in name:
            started.setdefault(replica, "backward")
        if name.split("/")[0] == optimizer_name:
            started[replica] = "optimizer"
        phase[op.name] = (replica, started.get(replica, "forward"))
    return phase


def test_each_shard_is_gathered_and_scattered_where_its_slices_live():
    """Per replica and phase of one traced step of the MLP on 2 x 2: one
    gather of each sliced variable in the forward pass (16: d1 and d3's
    kernel and bias shards, d2 and d4's kernel shards and whole biases,
    the head's kernel and bias), each again in the backward pass (each
    layer is recomputed from its inputs) with one reduce-scatter (an
    all-to-all) of each gradient; the optimizer none. Each runs on the
    device of the slices it reads: a shard on model device 1 among the
    replicas' devices 1 (CPU:1, CPU:3), never through the replica's first
    device. Between devices, only the batch's activations and scalars
    cross: nothing of a weight's, a shard's or a slice's shape (the batch
    of 14 rows, 7 per replica, makes no activation of such a shape)."""
    x, y = flat._data()  # pylint: disable=protected-access
    model, strategy = _sharded(lambda: flat._compiled(stacked._mlp(), "adam"))  # pylint: disable=protected-access
    with collectives_bounded(strategy, seconds=120):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    from tfdist.training import keras_fit  # pylint: disable=import-outside-toplevel

    steps = keras_fit.attachment_of(model).trainer()._steps  # pylint: disable=protected-access
    rows = 14  # (7 per replica: no weight, shard or slice has a dimension of 7)
    batch = tfdist.Batch(tf.constant(x[:rows]), tf.constant(y[:rows])).to_structure()
    graph = tf.function(lambda b: strategy.run(steps.train, args=(b,))).get_concrete_function(
        batch).graph
    phase = _phases(graph, model.optimizer.name)
    variables = tensor_parallel.trainable_variables(model.trainable_variables)
    lengths = {}
    for variable in variables:
        for device, length in _slices(variable, strategy):
            lengths.setdefault(device, collections.Counter())[length] += 1
    counted = collections.Counter()
    for op in graph.get_operations():
        if op.type not in ("CollectiveGatherV2", "CollectiveAllToAllV2"):
            continue
        replica, when = phase[op.name]
        counted[(replica, when, op.type)] += 1
        device = op.device[-5:]
        operand = int(op.inputs[0].shape.num_elements())
        length = operand if op.type == "CollectiveGatherV2" else operand // 2
        assert lengths[device][length], (op.name, device, length)  # (a slice there)
    per_replica = len(variables)  # 16
    assert counted == {
        (replica, when, kind): per_replica
        for replica in ("replica_0", "replica_1")
        for when, kind in (("forward", "CollectiveGatherV2"), ("backward", "CollectiveGatherV2"),
                           ("backward", "CollectiveAllToAllV2"))}, counted
    shapes = {tuple(v.shape) for v in model.trainable_variables} | {
        tuple(v.shape) for v in variables} | {
        (length,) for by_length in lengths.values() for length in by_length}
    crossed = [c for c in device_traffic.crossings(graph) if c.shape and c.shape in shapes]
    assert not crossed, crossed


def test_a_sliced_split_model_saves_whole_and_restores_under_other_splits(tmp_path):
    """``model.save`` loads in plain Keras (weights and optimizer state
    whole) and trains on as the sliced model does; its checkpoint restores
    into the model axis alone (1 x 2), and a checkpoint of the model axis
    alone restores into the sliced model."""
    x, y = flat._data()  # pylint: disable=protected-access
    build = lambda: flat._compiled(stacked._mlp(), "adam")  # noqa: E731  pylint: disable=protected-access
    model, strategy = _sharded(build)
    with collectives_bounded(strategy, seconds=120):
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        path = str(tmp_path / "sliced.keras")
        with flat._no_skipped_optimizer():  # pylint: disable=protected-access
            model.save(path)
            loaded = keras.models.load_model(path)
        ref.assert_weights_close(model, loaded, atol=0)
        saved = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(
            str(tmp_path / "sliced"))
        devices = tfdist.strategies.configure_logical_cpus(4)
        alone = tfdist.attach(build(), parallel=flat._layout(1, 2, devices[:2], PAIRS))  # pylint: disable=protected-access
        alone.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)  # (built)
        ref.restore_into(alone, saved)
        ref.assert_weights_close(model, alone, atol=0)
        ref.assert_train_on_alike([loaded, model, alone], x, y, BATCH)
        back = tf.train.Checkpoint(model=alone, optimizer=alone.optimizer).write(
            str(tmp_path / "alone"))
        ref.restore_into(model, back)
        ref.assert_weights_close(alone, model, atol=0)


def test_what_does_not_compose_yet_is_refused_by_name():
    """(Data x pipeline x model x fully sharded composes: 2 workers x 4 CPUs,
    `tests/parallel/test_tensor_parallel_on_workers.py`.)"""
    strategy, layout = _mesh(PAIRS)
    with strategy.scope():
        model = flat._compiled(stacked._mlp(), "adam")  # pylint: disable=protected-access
    with pytest.raises(ConfigurationError, match="FullySharded.. composes with the model axis"):
        tfdist.attach(model, strategy, parallel=layout, communication=(
            FullySharded(), tfdist.communication.Compression("bf16"))).fit(
                *flat._data(), batch_size=BATCH, verbose=0)  # pylint: disable=protected-access
