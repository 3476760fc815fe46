"""Checkpoints of `tfdist.communication.ShardedOptimizerState` (and of
`FullySharded`) in the ordinary Keras form: what is saved is what one
device's Keras optimizer saves (names, shapes, values), so a checkpoint
restores under any replica count and any sharding stage (none, the
optimizer's state, the weights too), each way round, mid-epoch and with
background saves. Every run is compared with single-device Keras fit on the
same global batches (100 examples, batch 16: 7 steps, a partial last one).
(2 workers: tests/scenarios/test_multi_worker.py.)"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tfdist.communication import FullySharded, ShardedOptimizerState
from tfdist.errors import ConfigurationError

BATCH, EXAMPLES = 16, 100


STAGES = {"plain": lambda: None, "sharded": ShardedOptimizerState, "fully sharded": FullySharded}


def _trainer(strategy, checkpoint_dir, stage: str, **checkpoint_options):
    """A Trainer of the test MLP with Adam, sharded as `STAGES` names."""
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    communication = STAGES[stage]()
    return model, tfdist.Trainer(model, strategy, communication=communication,
        checkpointing=tfdist.CheckpointOptions(checkpoint_dir, **checkpoint_options))


def _saved(path) -> dict:
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(path)
            if name != "_CHECKPOINTABLE_OBJECT_GRAPH"}


# (first run, resumed run): replicas and the sharding stage.
CASES = {
    "sharded 3 to sharded 2, async": ((3, "sharded"), (2, "sharded"), True),
    "sharded 3 to plain 1": ((3, "sharded"), (1, "plain"), False),
    "plain 2 to sharded 4": ((2, "plain"), (4, "sharded"), False),
    "fully sharded 2 to sharded 3, async": ((2, "fully sharded"), (3, "sharded"), True),
    "sharded 4 to fully sharded 2": ((4, "sharded"), (2, "fully sharded"), False),
    "fully sharded 3 to plain 1": ((3, "fully sharded"), (1, "plain"), False),
    "plain 2 to fully sharded 4, async": ((2, "plain"), (4, "fully sharded"), True),
}
IN_SHORT_FORM = ("sharded 3 to sharded 2, async", "plain 2 to sharded 4",
                 "fully sharded 2 to sharded 3, async", "sharded 4 to fully sharded 2")


@pytest.mark.parametrize("case", [
    # (Sharded to plain also follows from the saved form being one device's,
    # tested below; the full matrix resumes it too.)
    case if case in IN_SHORT_FORM else pytest.param(case, marks=pytest.mark.conformance_full)
    for case in sorted(CASES)])
def test_a_run_stopped_mid_epoch_resumes_anywhere_like_one_device(make_strategy, tmp_path, case):
    """Saves every 3 steps; stopped at step 11 (mid-epoch 2), resumed from
    step 9 on a fresh model and Trainer: the weights of one device's two
    uninterrupted epochs."""
    (first_replicas, first_stage), (replicas, stage), async_checkpoint = CASES[case]
    dataset = ref.global_batches(EXAMPLES, BATCH)
    expected, _ = ref.keras_fit(dataset, 2, "adam")
    _, first = _trainer(make_strategy(first_replicas), str(tmp_path), first_stage,
                        every_steps=3, async_write=async_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        first.fit(dataset, epochs=2, verbose=0, callbacks=[ref.CrashAtStep(11)])
    model, second = _trainer(make_strategy(replicas), str(tmp_path), stage,
                             async_write=async_checkpoint)
    second.fit(dataset, epochs=2, verbose=0)
    ref.assert_weights_close(expected, model, atol=1e-5)
    assert second.step == 14


def test_the_saved_state_is_one_device_keras_state(make_strategy, tmp_path):
    """The Trainer's checkpoint after one epoch on 3 replicas with sharded
    state: the names, shapes and values one device's Keras checkpoint has."""
    dataset = ref.global_batches(EXAMPLES, BATCH)
    expected, _ = ref.keras_fit(dataset, 1, "adam")
    one_device = tf.train.Checkpoint(model=expected, optimizer=expected.optimizer).write(
        str(tmp_path / "one_device" / "ckpt"))
    _, trainer = _trainer(make_strategy(3), str(tmp_path / "sharded"), "sharded")
    trainer.fit(dataset, epochs=1, verbose=0)
    latest = trainer._checkpoint.latest  # pylint: disable=protected-access
    saved, wanted = _saved(latest), _saved(one_device)
    optimizer_names = sorted(name for name in wanted if name.startswith("optimizer/"))
    assert len(optimizer_names) > 10
    for name in optimizer_names:
        assert saved[name].shape == wanted[name].shape, name
        np.testing.assert_allclose(saved[name], wanted[name], atol=1e-5, rtol=0, err_msg=name)


def test_model_save_writes_the_ordinary_state_and_weights_load_into_shards(make_strategy,
                                                                          tmp_path):
    """``model.save`` (a .keras file) from sharded state on 3 replicas loads
    with plain ``keras.models.load_model``: one device's optimizer state.
    ``save_weights`` (optimizer state included) loads into a sharded model
    on 2 replicas, which then trains on like one device."""
    x, y, _ = ref.classification_arrays(48)
    expected = ref.compile_model(ref.build_mlp(), "adam")
    initial = expected.get_weights()
    expected.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    strategy = make_strategy(3)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    model.set_weights(initial)
    tfdist.attach(model, strategy, communication=ShardedOptimizerState())
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    model.save(str(tmp_path / "model.keras"))
    model.save_weights(str(tmp_path / "model.weights.h5"))

    loaded = keras.models.load_model(str(tmp_path / "model.keras"))
    assert len(loaded.optimizer.variables) == len(expected.optimizer.variables)
    assert ref.largest_difference([v.numpy() for v in loaded.optimizer.variables],
                                  [v.numpy() for v in expected.optimizer.variables]) < 1e-5

    strategy = make_strategy(2)
    with strategy.scope():
        resumed = ref.compile_model(ref.build_mlp(), "adam")
    tfdist.attach(resumed, strategy, communication=ShardedOptimizerState())
    resumed.fit(x[:BATCH], y[:BATCH], verbose=0)  # builds the shards (then all overwritten)
    resumed.load_weights(str(tmp_path / "model.weights.h5"))
    expected.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    resumed.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    ref.assert_weights_close(expected, resumed, atol=1e-5)


def test_one_replicas_raw_slice_saved_alone_is_an_error(make_strategy, tmp_path):
    """The optimizer saves whole; a state variable on its own is one
    replica's slice, which a checkpoint would pass off as the whole."""
    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    tfdist.attach(model, strategy, communication=ShardedOptimizerState())
    x, y, _ = ref.classification_arrays(32)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    momentum = next(v for v in model.optimizer.variables if v.shape != ())
    with pytest.raises(ConfigurationError, match="one replica's slice"):
        tf.train.Checkpoint(state=momentum.value).write(str(tmp_path / "raw"))
