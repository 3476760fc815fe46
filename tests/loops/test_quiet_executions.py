"""Executions between log points, save points and epoch ends run back to
back when no callback has a training-batch hook (`Cadence.quiet_executions`,
`tfdist.loops.runners.base`): same results as single-device Keras, stops
and the end of the data still land on their step."""

import os
import signal
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref

BATCH = 16


def _record_dispatch(trainer):
    """Wraps the runner's ``train``; returns the record of its plans:
    ``("one", step before, steps)`` for a reported execution,
    ``("many", step before, executions)`` for a stretch of quiet ones."""
    runner, calls = trainer._runner, []
    train = runner.train

    def recorded_train(iterator, plan, *args, **kwargs):
        if plan.reported:
            calls.append(("one", trainer.step, plan.num_steps))
        else:
            calls.append(("many", trainer.step, plan.executions))
        return train(iterator, plan, *args, **kwargs)

    runner.train = recorded_train
    return calls


class _BatchEndCounter(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_only_executions_at_a_point_run_one_by_one_and_results_equal_keras(
        make_strategy, tmp_path, steps_per_execution):
    """13 batches a pass (the last of 4 examples: empty replicas on 4), 2
    epochs, log points every 5 steps of an epoch, saves every 4 of the run.
    Every execution run alone (``train``) reaches a log point, a save point
    or the epoch's end; all others ran in stretches; the weights and the
    history are Keras'."""
    dataset = ref.global_batches(12 * BATCH + 4, BATCH)
    expected, expected_history = ref.keras_fit(dataset, epochs=2)
    strategy = make_strategy(4)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam",
                                  steps_per_execution=steps_per_execution)
    trainer = tfdist.Trainer(model, strategy,
        checkpointing=tfdist.CheckpointOptions(every_steps=4, directory=str(tmp_path)),
        reporting=tfdist.ReportingOptions(log_every_steps=5))
    calls = _record_dispatch(trainer)
    history = trainer.fit(dataset, epochs=2, verbose=0)

    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history, history.history)
    assert trainer.step == 26
    alone = [(before, size) for kind, before, size in calls if kind == "one"]
    for before, size in alone:
        in_epoch = before % 13
        after = in_epoch + size
        assert (after // 5 > in_epoch // 5 or (before + size) // 4 > before // 4
                or after == 13), (before, size)
    # ... and every point is reached by one of those: log points (run
    # steps 5, 10; 18, 23), save points (4, 8, ... 24), epoch ends (13, 26).
    points = {5, 10, 18, 23, 13, 26} | set(range(4, 27, 4))
    for point in points:
        assert any(before < point <= before + size for before, size in alone), point
    assert any(kind == "many" for kind, _, _ in calls)
    assert sum(size for kind, _, size in calls if kind == "one") < 26


def test_a_batch_hook_runs_every_execution_alone(make_strategy):
    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    trainer = tfdist.Trainer(model, strategy, reporting=tfdist.ReportingOptions(log_every_steps=5))
    calls = _record_dispatch(trainer)
    counter = _BatchEndCounter()
    trainer.fit(ref.global_batches(13 * BATCH, BATCH), epochs=1, verbose=0, callbacks=[counter])
    assert [kind for kind, _, _ in calls] == ["one"] * 13
    assert counter.batches == 13


def _signal_at(dataset, index):
    """``dataset``, sending this process SIGTERM when element ``index`` is made."""

    def maybe_signal(position):
        if int(position) == index:
            os.kill(os.getpid(), signal.SIGTERM)
        return position

    def with_signal(position, batch):
        made = tf.py_function(maybe_signal, [position], tf.int64)
        with tf.control_dependencies([made]):
            return tf.nest.map_structure(tf.identity, batch)

    return dataset.enumerate().map(with_signal)


def test_a_stop_inside_a_stretch_saves_that_step_and_the_resumed_run_equals_keras(
        make_strategy, tmp_path):
    """SIGTERM arrives while the steps between two log points (1,000 apart)
    run back to back: training stops after the execution under way, the
    checkpoint holds exactly the steps taken, and a resumed run ends where
    an uninterrupted single-device Keras run does."""
    dataset = ref.global_batches(60 * BATCH, BATCH, weighted=False)
    expected, _ = ref.keras_fit(dataset, epochs=1)
    strategy = make_strategy(2)

    def trainer():
        with strategy.scope():
            model = ref.compile_model(ref.build_mlp(), "adam")
        return model, tfdist.Trainer(model, strategy,
            checkpointing=tfdist.CheckpointOptions(str(tmp_path)),
            reporting=tfdist.ReportingOptions(log_every_steps=1000))

    model, stopped = trainer()
    calls = _record_dispatch(stopped)
    with pytest.raises(tfdist.Preempted) as raised:
        stopped.fit(_signal_at(dataset, 25), epochs=1, verbose=0)
    step = raised.value.step
    assert 0 < step < 60 and raised.value.saved
    assert int(model.optimizer.iterations.numpy()) == step == stopped.step
    assert calls[0][0] == "many"  # the stop came inside the stretch

    resumed_model, resumed = trainer()
    resumed.fit(dataset, epochs=1, verbose=0)
    assert resumed.step == 60
    ref.assert_weights_close(expected, resumed_model)


def test_data_that_ends_inside_a_stretch_stops_training_like_keras(make_strategy):
    """7 batches, 2 epochs of 5 steps: the second epoch's stretch runs out
    after 2 steps; Keras warns and stops there too."""
    dataset = ref.global_batches(7 * BATCH, BATCH)
    expected = ref.compile_model(ref.build_mlp(), "adam")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected_history = expected.fit(dataset, epochs=2, steps_per_epoch=5, verbose=0)
    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    trainer = tfdist.Trainer(model, strategy)
    calls = _record_dispatch(trainer)
    with pytest.warns(UserWarning, match="ran out of data"):
        history = trainer.fit(dataset, epochs=2, steps_per_epoch=5, verbose=0)
    assert trainer.step == 7 == int(expected.optimizer.iterations.numpy())
    assert ("many", 5, 4) in calls  # the second epoch's stretch, cut short
    ref.assert_weights_close(expected, model)
    assert len(history.history["loss"]) == len(expected_history.history["loss"])
    np.testing.assert_allclose(history.history["loss"], expected_history.history["loss"],
                               rtol=1e-5)
