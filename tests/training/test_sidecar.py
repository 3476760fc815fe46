"""An evaluator task's ``fit`` (`tfdist.training.sidecar`), in-process: a
Trainer on one device writes checkpoints with validation each epoch; then,
with a TF_CONFIG naming this task ``evaluator``, the same ``fit`` call
evaluates each checkpoint instead of training, and its numbers are the ones
training reported for that epoch. Damaged and half-written checkpoints,
the bounded wait and missing arguments are checked too. The evaluator
beside 2 real workers: tests/scenarios/test_evaluator.py."""

import json
import os

import numpy as np
import pytest

import tfdist
from tests.support import reference as ref
from tfdist.errors import ConfigurationError
from tfdist.training import sidecar

EPOCHS = 3
EVALUATOR = json.dumps({"cluster": {"worker": ["127.0.0.1:1"]},
                        "task": {"type": "evaluator", "index": 0}})


def _trainer(make_strategy, checkpoint_dir):
    strategy = make_strategy(1)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    return tfdist.Trainer(model, strategy, checkpointing=tfdist.CheckpointOptions(checkpoint_dir))


def _fit(trainer, epochs=EPOCHS, validation=True):
    return trainer.fit(ref.global_batches(70, 16), epochs=epochs, verbose=0,
                       validation_data=ref.global_batches(40, 16) if validation else None)


@pytest.fixture
def trained(tmp_path, make_strategy, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    history = _fit(_trainer(make_strategy, str(tmp_path / "ckpt")))
    monkeypatch.setenv("TF_CONFIG", EVALUATOR)
    return tmp_path / "ckpt", history.history


def test_the_evaluator_reports_what_training_validated_at_each_checkpoint(
        trained, make_strategy, capsys):
    directory, training = trained
    history = _fit(_trainer(make_strategy, str(directory)))
    assert history.epoch == [5, 10, 15]  # the checkpoints' steps
    for name in ("val_loss", "val_accuracy"):
        np.testing.assert_allclose(history.history[name], training[name], rtol=1e-6)
    output = capsys.readouterr().out
    assert "[evaluator] ckpt-15 (epoch 3, step 15): loss " in output
    assert list((directory / "logs" / "evaluator").glob("events.out.tfevents.*"))


def test_damaged_and_half_written_checkpoints_are_skipped(trained, make_strategy, capsys):
    directory, training = trained
    (directory / "ckpt-99.index").write_bytes(b"half written")  # not listed yet: ignored
    data = next(directory.glob("ckpt-10.data-*"))
    data.write_bytes(data.read_bytes()[:20])  # listed, damaged
    history = _fit(_trainer(make_strategy, str(directory)))
    assert history.epoch == [5, 15]
    np.testing.assert_allclose(history.history["val_loss"],
                               [training["val_loss"][0], training["val_loss"][2]], rtol=1e-6)
    assert "[evaluator] skipping ckpt-10:" in capsys.readouterr().out


def test_waiting_for_a_checkpoint_that_never_comes_is_bounded(trained, make_strategy,
                                                              monkeypatch):
    directory, _ = trained
    monkeypatch.setenv(sidecar.TIMEOUT_ENV, "1")
    with pytest.raises(TimeoutError, match=rf"waited 1 s for a new checkpoint in {directory}"
                                           r" \(last evaluated: step 15\)"):
        _fit(_trainer(make_strategy, str(directory)), epochs=EPOCHS + 1)


@pytest.mark.parametrize("value", ["0", "soon"])
def test_a_bad_timeout_is_named(trained, make_strategy, monkeypatch, value):
    directory, _ = trained
    monkeypatch.setenv(sidecar.TIMEOUT_ENV, value)
    with pytest.raises(ConfigurationError, match=f"{sidecar.TIMEOUT_ENV} \\('{value}'\\)"):
        _fit(_trainer(make_strategy, str(directory)))


def test_an_evaluator_needs_checkpoints_and_validation_data(trained, make_strategy):
    directory, _ = trained
    with pytest.raises(ConfigurationError, match=r"needs `checkpointing=tfdist\.CheckpointOptions\(directory\)`"):
        _fit(_trainer(make_strategy, None))
    with pytest.raises(ConfigurationError, match="Pass `validation_data=`"):
        _fit(_trainer(make_strategy, str(directory)), validation=False)


def test_make_strategy_on_an_evaluator_joins_no_cluster(monkeypatch):
    """Its cluster's worker address is a closed port: joining would hang."""
    monkeypatch.setenv("TF_CONFIG", EVALUATOR)
    monkeypatch.delenv("TFDIST_READY_FILE", raising=False)
    strategy = tfdist.make_strategy("multi_worker_mirrored")
    assert strategy.num_replicas_in_sync == 1
    assert os.environ["TF_CONFIG"] == EVALUATOR
