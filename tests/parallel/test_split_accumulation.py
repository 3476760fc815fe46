"""Gradient accumulation (``gradient_accumulation_steps``) on a model split
over the model axis (`tfdist.replica.accumulation` with
`tfdist.parallel.tensor_parallel`): each shard's gradient is summed beside
it, on its model device, and applied every k-th micro-batch; training with
batches of B and k = 2 equals one device with batches of 2B (1e-5), on
meshes 1x2 and 2x2 and with each shard sliced over the replicas
(``FullySharded``). A run stopped mid-accumulation resumes from its
checkpoint under another layout (the sums are saved whole per weight)."""

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.parallel import test_tensor_parallel as flat
from tests.support import reference as ref, step_progress
from tfdist.communication import FullySharded

BATCH, STEPS = flat.BATCH, 2  # (36 examples: unions of 16, 16 and 4)


def _one_device_on_unions(optimizer, epochs=2):
    x, y = flat._data()  # pylint: disable=protected-access
    model = flat._compiled(flat._mlp(), optimizer)  # pylint: disable=protected-access
    history = model.fit(x, y, batch_size=STEPS * BATCH, epochs=epochs, shuffle=False, verbose=0)
    return model, history.history


def _accumulating(data, optimizer, sliced=False):
    devices = tfdist.strategies.configure_logical_cpus(4)
    strategy = (tfdist.make_strategy("mirrored", devices=devices[:2 * data:2]) if data > 1
                else None)
    with strategy.scope() if strategy else tf.init_scope():
        model = flat._compiled(flat._mlp(), optimizer)  # pylint: disable=protected-access
        model.optimizer.gradient_accumulation_steps = STEPS
    layout = flat._layout(data, 2, devices[:2 * data], flat.MEGATRON)  # pylint: disable=protected-access
    return model, strategy, layout, FullySharded() if sliced else None


@pytest.mark.parametrize("data,optimizer,sliced", [
    (1, "adam", False), (2, "sgd", False), (2, "adam", True)],
    ids=["1x2-adam", "2x2-sgd", "2x2-fully_sharded-adam"])
def test_accumulated_shards_equal_one_device_on_the_union_batches(data, optimizer, sliced):
    expected, expected_history = _one_device_on_unions(optimizer)
    model, strategy, layout, communication = _accumulating(data, optimizer, sliced)
    tfdist.attach(model, strategy, parallel=layout, communication=communication)
    x, y = flat._data()  # pylint: disable=protected-access
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    ref.assert_weights_close(expected, model)
    from tfdist.training import keras_fit  # pylint: disable=import-outside-toplevel

    trainer = keras_fit.attachment_of(model).trainer()
    sums = trainer._steps.accumulator._sums  # pylint: disable=protected-access
    kernel_shards = flat.tensor_parallel.shards_of(model.get_layer("d1").kernel)
    devices = [[copy.device[-5:] for copy in (getattr(s, "values", None) or [s])] for s in sums]
    shard_devices = [[copy.device[-5:] for copy in (getattr(s.value, "values", None)
                                                   or [s.value])] for s in kernel_shards]
    assert devices[:2] == shard_devices, (devices, shard_devices)  # (beside each shard)


def test_a_run_stopped_mid_accumulation_resumes_under_another_layout(tmp_path):
    """Stopped in epoch 2 after its first micro-batch (saved mid-union, its
    sums in the checkpoint) on 2x2 with sliced shards; resumed on 1x2: ends
    where one device ends on the union batches."""
    expected, expected_history = _one_device_on_unions("adam")
    x, y = flat._data()  # pylint: disable=protected-access
    first, strategy, layout, communication = _accumulating(2, "adam", sliced=True)
    tfdist.attach(first, strategy, parallel=layout, communication=communication,
                  checkpointing=tfdist.CheckpointOptions(str(tmp_path), every_steps=6))
    with pytest.raises(KeyboardInterrupt):  # (step 6: epoch 2's first micro-batch)
        first.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                  callbacks=[step_progress.interrupt_at(1, 1)])
    model, _, layout, _ = _accumulating(1, "adam")
    tfdist.attach(model, parallel=layout, checkpointing=tfdist.CheckpointOptions(str(tmp_path)))
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert history.epoch == [1]
    ref.assert_weights_close(expected, model)
    np.testing.assert_allclose(history.history["loss"], expected_history["loss"][1:], rtol=1e-5)
