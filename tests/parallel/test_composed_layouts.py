"""Ways of splitting a model composed on one plan
(`tfdist.parallel.plan.ModelPlan`), against one-device Keras: data x
pipeline x fully sharded (2 MirroredStrategy replicas x 2 stages on 4
logical CPUs, each stage's weights, gradients and optimizer state sharded
over the 2 replicas on the stage's devices)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.parallel.test_pipeline import (ONE_STAGE_PER_DEVICE, REPLICATED, _assert_equal_to,
                                          _fit, _model, _replicated, _traced_replica_step)
from tests.support import short_form
from tfdist.communication import Compression, FullySharded
from tfdist.errors import ConfigurationError
from tfdist.parallel import device_traffic


def _device_index(device: str) -> int:
    return tf.DeviceSpec.from_string(device).device_index


@pytest.mark.parametrize("schedule", short_form.only(ONE_STAGE_PER_DEVICE, in_ci=("1f1b",)))
@pytest.mark.parametrize("cuts,micro_batches,batch_size", REPLICATED,
                         ids=[f"2x{len(c) + 1}-m{m}-b{b}" for c, m, b in REPLICATED])
def test_pipeline_stages_fully_sharded_over_replicas_equal_one_device(
        schedule, cuts, micro_batches, batch_size):
    """Partial batches, empty micro-batches and a replica without rows
    (REPLICATED's cases), an L2 regularizer and a max-norm constraint:
    one device's weights, History, evaluation and predictions."""
    expected = _fit(_model(), batch_size)
    model, strategy = _replicated()
    pipeline = tfdist.parallel.Pipeline(cuts=cuts, micro_batches=micro_batches,
                                        schedule=schedule)
    model = tfdist.attach(model, strategy, parallel=pipeline, communication=FullySharded())
    _assert_equal_to(expected, _fit(model, batch_size))


def test_each_stage_keeps_its_slices_on_its_devices_and_a_step_gathers_and_scatters_once():
    """Where a 2 x 2 layout keeps what, and what one traced step sends.

    Kept: each weight as 2 slices of half its elements (rounded up), replica
    r's on its stage's device for r; Adam's moments likewise. Sent, per
    replica and weight: one all-gather before the micro-batches and one
    all-to-all (the reduce-scatter) of its gradient summed over them, on the
    weight's stage device, whatever m is; no all-reduce but the batch's
    example count; between a replica's stages no weight's value."""
    micro_batches, rows = 4, 8
    model, strategy = _replicated(optimizer=lambda: keras.optimizers.Adam(0.01))
    model = tfdist.attach(model, strategy, communication=FullySharded(),
                          parallel=tfdist.parallel.Pipeline(cuts=["h2"],
                                                            micro_batches=micro_batches))
    _fit(model, batch_size=rows, epochs=1)
    stage_of = {"h1": 0, "h2": 0, "h3": 1, "out": 1}
    for layer, stage in stage_of.items():
        for weight in model.get_layer(layer).trainable_weights:
            copies = weight.value.values
            assert [_device_index(c.device) for c in copies] == [2 * stage, 2 * stage + 1]
            half = -(-int(np.prod(weight.shape)) // 2)
            assert [tuple(c.shape) for c in copies] == [(half,)] * 2, weight.path
    # Adam's two moments of each weight, in the weights' order after the
    # iteration count and the learning rate: the weight's slices' devices and shapes.
    moments = model.optimizer.variables[2:]
    assert len(moments) == 2 * len(model.trainable_weights)
    for index, weight in enumerate(model.trainable_weights):
        for moment in moments[2 * index:2 * index + 2]:
            assert [(c.device, tuple(c.shape)) for c in moment.value.values] == [
                (c.device, tuple(c.shape)) for c in weight.value.values], moment.path

    graph = _traced_replica_step(model, strategy, rows)
    collectives = [op for op in graph.get_operations() if op.type.startswith("Collective")]
    weights = len(model.trainable_weights)
    for replica in (0, 1):
        # (on the replica's device, in its group, as the strategy's all-reduce runs)
        kinds = sorted(op.type for op in collectives if _device_index(op.device) == replica)
        # one gather per weight, whatever m is, and one more of h2's kernel
        # after its update, for its max-norm constraint (of the whole kernel)
        assert kinds.count("CollectiveGatherV2") == weights + 1, kinds
        assert kinds.count("CollectiveAllToAllV2") == weights, kinds
        reduced = [op for op in collectives if op.type == "CollectiveReduceV2"
                   and _device_index(op.device) == replica]
        assert [int(np.prod(op.inputs[0].shape)) for op in reduced] == [1], reduced
    assert {_device_index(op.device) for op in collectives} == {0, 1}
    gathered = [op for op in graph.get_operations() if "gathered_for_step" in op.name
                and op.type == "Reshape"]
    assert sorted(_device_index(op.device) for op in gathered) == [0] * 4 + [1] * 4 + [
        2] * 4 + [3] * 4  # (each weight whole on its stage's device for the replica)
    # What is read of a variable elsewhere: a later stage's slices, to the
    # replica's device for its collective (1/2 of a weight); never a whole weight.
    slices = {(tuple(c.shape), c.device) for w in model.trainable_weights
              for c in w.value.values}
    crossings = device_traffic.crossings(graph)
    reads = [c for c in crossings if "ReadVariableOp" in c.tensor and c.shape]
    assert reads and all((c.shape, c.source) in slices and _device_index(c.source) >= 2
                         and _device_index(c.destination) == _device_index(c.source) - 2
                         for c in reads), reads


def test_what_does_not_compose_yet_is_refused_and_what_does_not_apply_is_named():
    """Compression with fully sharded stages: refused, naming it; per layer
    resharding asked for explicitly within a pipeline: a warning."""
    for communication, refused in (((FullySharded(), Compression("bf16")), True),
                                   (FullySharded(reshard_after_forward=True), False)):
        model, strategy = _replicated()
        pipeline = tfdist.parallel.Pipeline(cuts=["h2"], micro_batches=2)
        if refused:
            with pytest.raises(ConfigurationError, match=r"with communication=Compression.*"
                                                         r"combines with FullySharded"):
                tfdist.Trainer(model, strategy, parallel=pipeline, communication=communication)
        else:
            with pytest.warns(UserWarning, match=r"gathered once per step.*"
                                                 r"reshard_after_forward and units do not apply"):
                tfdist.Trainer(model, strategy, parallel=pipeline, communication=communication)
