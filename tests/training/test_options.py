"""The Trainer's option records: each checks its values when made, names
the record, the field and the value; the Trainer takes only these records
and says where a former keyword went (through `tfdist.attach`)."""

import keras
import numpy as np
import pytest

import tfdist
from tfdist.errors import ConfigurationError


@pytest.mark.parametrize("make, message", [
    (lambda: tfdist.CheckpointOptions("/tmp/run", every_steps=0),
     r"tfdist\.CheckpointOptions: `every_steps` \(0\) must be a positive integer"),
    (lambda: tfdist.CheckpointOptions(max_to_keep=-1),
     r"tfdist\.CheckpointOptions: `max_to_keep` \(-1\) must be a positive integer"),
    (lambda: tfdist.DataOptions(partial_batch="trim"),
     r"tfdist\.DataOptions: `partial_batch` \('trim'\) must be one of "
     r"\(None, 'exact', 'drop', 'pad'\)"),
    (lambda: tfdist.DataOptions(global_batch_size=2.5),
     r"tfdist\.DataOptions: `global_batch_size` \(2\.5\) must be a positive integer"),
    (lambda: tfdist.DataOptions(shard_policy="rows"),
     r"tfdist\.DataOptions: `shard_policy` \('rows'\) must be one of \('auto', 'data'"),
    (lambda: tfdist.DataOptions(seed="7"),
     r"tfdist\.DataOptions: `seed` \('7'\) must be an integer"),
    (lambda: tfdist.ReportingOptions(log_every_steps=True),
     r"tfdist\.ReportingOptions: `log_every_steps` \(True\) must be a positive integer"),
])
def test_a_record_checks_its_values_when_made(make, message):
    with pytest.raises(ConfigurationError, match=message):
        make()


def test_records_are_frozen_and_take_numpy_integers():
    options = tfdist.DataOptions(seed=np.int64(3), partial_batch="pad")
    assert options.seed == 3
    with pytest.raises(AttributeError):
        options.seed = 4  # frozen: a Trainer's options cannot change under it


def _compiled(strategy):
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
    return model


def test_the_trainer_keeps_the_records_it_was_given(make_strategy, tmp_path):
    """The records reach the loop: where it saves, how often it logs, how it
    pads; the summary directory defaults to the checkpoint directory's;
    ``max_to_keep=None`` keeps every checkpoint, as TensorFlow's manager does."""
    strategy = make_strategy(2)
    trainer = tfdist.Trainer(
        _compiled(strategy), strategy,
        checkpointing=tfdist.CheckpointOptions(str(tmp_path), every_steps=2, max_to_keep=None),
        input_pipeline=tfdist.DataOptions(partial_batch="drop", seed=11),
        reporting=tfdist.ReportingOptions(log_every_steps=4))
    trainer.fit(np.ones((12, 3), "float32"), np.zeros((12, 2), "float32"), batch_size=4,
                epochs=2, verbose=0)
    assert trainer._checkpointing == tfdist.CheckpointOptions(str(tmp_path), 2, max_to_keep=None)
    assert trainer._data.partial_batch == "drop" and trainer._data.seed == 11
    assert trainer._reporting.log_every_steps == 4
    assert trainer._reporting.log_dir == f"{tmp_path}/logs"
    saved = sorted(int(path.stem.split("-")[-1])
                   for path in tmp_path.glob("ckpt-*.index"))
    # Every 2 steps and at each epoch's end (3 steps an epoch); all kept.
    assert saved == [2, 3, 4, 6], saved


@pytest.mark.parametrize("argument, value", [
    ("checkpointing", "/tmp/run"), ("input_pipeline", tfdist.ReportingOptions()),
    ("reporting", {}),
])
def test_the_trainer_refuses_anything_but_its_record(make_strategy, argument, value):
    strategy = make_strategy(1)
    record = {"checkpointing": "CheckpointOptions", "input_pipeline": "DataOptions",
              "reporting": "ReportingOptions"}[argument]
    with pytest.raises(ConfigurationError,
                       match=rf"`{argument}` must be a tfdist\.{record} \(or None\); got "
                             rf".*Pass e\.g\. `{argument}=tfdist\.{record}\(\.\.\.\)`"):
        tfdist.Trainer(_compiled(strategy), strategy, **{argument: value})


@pytest.mark.parametrize("entry", ["attach", "Trainer"])
def test_attach_and_the_trainer_say_where_each_former_keyword_went(make_strategy, entry):
    strategy = make_strategy(1)
    with pytest.raises(ConfigurationError) as raised:
        getattr(tfdist, entry)(_compiled(strategy), strategy, checkpoint_dir="/tmp/run", seed=3,
                               log_every_steps=10, async_checkpoint=True)
    assert str(raised.value) == (
        f"tfdist.{entry}'s options moved: "
        "`async_checkpoint=` is now `checkpointing=tfdist.CheckpointOptions(async_write=...)`; "
        "`checkpoint_dir=` is now `checkpointing=tfdist.CheckpointOptions(directory=...)`; "
        "`log_every_steps=` is now `reporting=tfdist.ReportingOptions(log_every_steps=...)`; "
        "`seed=` is now `input_pipeline=tfdist.DataOptions(seed=...)`.")


def test_attach_seeds_shuffle_through_data_options(make_strategy):
    """``DataOptions(seed=...)`` seeds attach's ``shuffle=True`` orders: the
    same seed gives the same run, another seed another."""
    strategy = make_strategy(2)
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    y = np.random.default_rng(1).normal(size=(16, 2)).astype("float32")

    def trained_with(seed):
        model = _compiled(strategy)
        model.set_weights([np.full_like(w, 0.1) for w in model.get_weights()])
        tfdist.attach(model, strategy, input_pipeline=tfdist.DataOptions(seed=seed))
        model.fit(x, y, batch_size=4, epochs=1, shuffle=True, verbose=0)
        return model.get_weights()[0]

    first, again, other = trained_with(5), trained_with(5), trained_with(6)
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, other)
