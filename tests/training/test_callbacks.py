"""Keras callbacks run inside Trainer.fit with Keras semantics."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref


def test_early_stopping_stops_training(make_strategy):
    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    stop = keras.callbacks.EarlyStopping(monitor="loss", min_delta=10.0, patience=1)
    history = tfdist.Trainer(model, strategy).fit(
        ref.global_batches(40, 16), epochs=10, verbose=0, callbacks=[stop]
    )
    assert len(history.history["loss"]) == 2  # no 10.0 improvement: stop after patience


def test_callbacks_see_epoch_logs_and_batches(make_strategy):
    events = []

    class Recorder(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            events.append("begin")

        def on_train_batch_end(self, batch, logs=None):
            events.append(("batch", batch))

        def on_epoch_end(self, epoch, logs=None):
            events.append(("epoch", epoch, sorted(logs)))

    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam", steps_per_execution=2)
    tfdist.Trainer(model, strategy).fit(
        ref.global_batches(40, 16), epochs=1, verbose=0, callbacks=[Recorder()],
        validation_data=ref.global_batches(20, 16),
    )
    # 3 batches in executions of 2: batch-end after steps 2 and 3.
    assert events[:3] == ["begin", ("batch", 1), ("batch", 2)]
    assert events[3] == (
        "epoch", 0,
        ["accuracy", "loss", "top2", "val_accuracy", "val_loss", "val_top2",
         "val_weighted_acc", "weighted_acc"],
    )


# -- Keras' callbacks through tfdist.attach, against one-device Keras ----------

ROWS, BATCH = 66, 16  # last batch 2: empty replicas on 4 replicas


def _fit_both(make_strategy, make_callbacks, x=None, y=None, optimizer="adam", **kwargs):
    """(Keras model, Keras history, tfdist model, tfdist history): the same
    fit, with fresh callbacks from ``make_callbacks(side)``, on one device
    and on 4 replicas."""
    if x is None:
        x, y, _ = ref.classification_arrays(ROWS)
    kwargs = dict(dict(batch_size=BATCH, epochs=2, shuffle=False, verbose=0), **kwargs)
    expected = ref.compile_model(ref.build_mlp(), optimizer)
    expected_history = expected.fit(x, y, callbacks=make_callbacks("keras"), **kwargs)
    strategy = make_strategy(4)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), optimizer)
    tfdist.attach(model, strategy)
    history = model.fit(x, y, callbacks=make_callbacks("tfdist"), **kwargs)
    return expected, expected_history, model, history


class BatchLogRecorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches = []

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append((batch, dict(logs)))


def test_batch_logs_are_real_values_at_every_batch(make_strategy):
    recorders = {}

    def callbacks(side):
        recorders[side] = BatchLogRecorder()
        return [recorders[side]]

    _fit_both(make_strategy, callbacks, epochs=2)
    expected, actual = recorders["keras"].batches, recorders["tfdist"].batches
    assert [b for b, _ in actual] == [b for b, _ in expected] == [0, 1, 2, 3, 4] * 2
    for (_, expected_logs), (_, logs) in zip(expected, actual):
        ref.assert_logs_close(expected_logs, logs)


def test_batch_logs_are_not_read_when_no_callback_asks(make_strategy):
    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    trainer = tfdist.Trainer(model, strategy,
        reporting=tfdist.ReportingOptions(log_every_steps=1000))
    reads = []
    original = trainer._metrics.results
    trainer._metrics.results = lambda: reads.append(1) or original()
    trainer.fit(ref.global_batches(66, 16), epochs=2, verbose=0,
                callbacks=[keras.callbacks.History(), keras.callbacks.ProgbarLogger()])
    assert len(reads) == 2  # once per epoch end, never per batch


def test_terminate_on_nan_stops_at_the_same_step_as_keras(make_strategy):
    x, y, _ = ref.classification_arrays(ROWS)
    x = x.copy()
    x[37, 1] = np.nan  # batch 2 of epoch 0
    expected, expected_history, model, history = _fit_both(
        make_strategy, lambda side: [keras.callbacks.TerminateOnNaN()], x, y)
    # Keras stops at the first batch whose loss is NaN: batch 2 (3 steps) on
    # most CPUs; where the matmul kernel keeps batch 2's loss finite (seen on
    # an AVX-512 machine: only the weights turn NaN) at batch 3. tfdist must
    # stop where Keras does, before the epoch's 5 batches are done.
    stopped_at = int(expected.optimizer.iterations)
    assert stopped_at in (3, 4)
    assert int(model.optimizer.iterations.numpy()) == stopped_at
    assert history.epoch == expected_history.epoch == [0]


def test_model_checkpoint_names_and_best_only_equal_keras(make_strategy, tmp_path):
    def callbacks(side):
        directory = tmp_path / side
        return [
            keras.callbacks.ModelCheckpoint(
                str(directory / "b-{epoch:02d}-{batch:02d}.weights.h5"),
                save_weights_only=True, save_freq=2),
            keras.callbacks.ModelCheckpoint(
                str(directory / "e-{epoch:02d}-{loss:.3f}.weights.h5"),
                save_weights_only=True),
            keras.callbacks.ModelCheckpoint(
                str(directory / "best.keras"), monitor="val_loss", save_best_only=True),
        ]

    expected, _, model, _ = _fit_both(make_strategy, callbacks, validation_split=0.25)
    names = sorted(p.name for p in (tmp_path / "keras").iterdir())
    assert sorted(p.name for p in (tmp_path / "tfdist").iterdir()) == names
    assert "b-01-02.weights.h5" in names and "best.keras" in names
    best_expected = keras.models.load_model(tmp_path / "keras" / "best.keras")
    best = keras.models.load_model(tmp_path / "tfdist" / "best.keras")
    ref.assert_weights_close(best_expected, best)


def test_schedules_early_stopping_and_csv_logger_equal_keras(make_strategy, tmp_path):
    def callbacks(side):
        return [
            keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5 if epoch else lr),
            keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=0,
                                              min_delta=1.0),
            keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, min_delta=1e-3,
                                          restore_best_weights=True),
            keras.callbacks.CSVLogger(str(tmp_path / f"{side}.csv")),
        ]

    expected, expected_history, model, history = _fit_both(
        make_strategy, callbacks, epochs=5, validation_split=0.25)
    assert history.epoch == expected_history.epoch
    ref.assert_logs_close(expected_history.history, history.history)
    ref.assert_weights_close(expected, model)
    expected_csv = np.genfromtxt(tmp_path / "keras.csv", delimiter=",", names=True)
    csv = np.genfromtxt(tmp_path / "tfdist.csv", delimiter=",", names=True)
    assert csv.dtype.names == expected_csv.dtype.names
    for name in csv.dtype.names:
        np.testing.assert_allclose(csv[name], expected_csv[name], rtol=1e-5)


class _StopAtEpoch(keras.callbacks.Callback):
    """Interrupts fit as a preemption would, at the start of ``epoch``."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise KeyboardInterrupt(f"stopped at epoch {epoch}")


def test_backup_and_restore_resumes_like_keras(make_strategy, tmp_path):
    x, y, _ = ref.classification_arrays(ROWS)
    kwargs = dict(batch_size=BATCH, epochs=4, shuffle=False, verbose=0)
    results = {}
    for side in ("keras", "tfdist"):
        backup = str(tmp_path / side)
        if side == "keras":
            model = ref.compile_model(ref.build_mlp(), "adam")
        else:
            strategy = make_strategy(4)
            with strategy.scope():
                model = ref.compile_model(ref.build_mlp(), "adam")
            tfdist.attach(model, strategy)
        with pytest.raises(KeyboardInterrupt):
            model.fit(x, y, callbacks=[keras.callbacks.BackupAndRestore(backup),
                                       _StopAtEpoch(2)], **kwargs)
        history = model.fit(x, y, callbacks=[keras.callbacks.BackupAndRestore(backup)],
                            **kwargs)
        results[side] = model, history
    (expected, expected_history), (model, history) = results["keras"], results["tfdist"]
    assert history.epoch == expected_history.epoch == [2, 3]
    ref.assert_logs_close(expected_history.history, history.history)
    ref.assert_weights_close(expected, model)


def test_tensorboard_batch_summaries_equal_keras(make_strategy, tmp_path):
    def callbacks(side):
        return [keras.callbacks.TensorBoard(str(tmp_path / side), update_freq=2)]

    _fit_both(make_strategy, callbacks, epochs=2)

    def scalars(side):
        values = {}
        for path in sorted((tmp_path / side / "train").glob("events.*")):
            for event in tf.compat.v1.train.summary_iterator(str(path)):
                for value in event.summary.value:
                    if value.metadata.plugin_data.plugin_name == "scalars":
                        values[(value.tag, event.step)] = float(tf.make_ndarray(value.tensor))
        return values

    expected, actual = scalars("keras"), scalars("tfdist")
    batch_keys = sorted(key for key in expected if key[0].startswith("batch_"))
    assert batch_keys == sorted(key for key in actual if key[0].startswith("batch_"))
    assert ("batch_loss", 6) in batch_keys  # every 2nd of 10 global batches
    # (Keras 3.15's own file lacks epoch 0's epoch_* values; the rest match.)
    assert set(expected) <= set(actual)
    for key, value in expected.items():
        np.testing.assert_allclose(actual[key], value, rtol=1e-5, err_msg=str(key))


def test_validation_calls_on_test_begin_and_end_like_keras(make_strategy):
    recorders = {}

    class Events(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.events = []

        def on_epoch_begin(self, epoch, logs=None):
            self.events.append(("epoch", epoch))

        def on_test_begin(self, logs=None):
            self.events.append(("test_begin",))

        def on_test_end(self, logs=None):
            self.events.append(("test_end", dict(logs)))

    def callbacks(side):
        recorders[side] = Events()
        return [recorders[side]]

    _fit_both(make_strategy, callbacks, epochs=2, validation_split=0.25)
    expected, actual = recorders["keras"].events, recorders["tfdist"].events
    assert [e[0] for e in actual] == [e[0] for e in expected] == \
        ["epoch", "test_begin", "test_end"] * 2
    for want, got in zip(expected, actual):
        if want[0] == "test_end":
            ref.assert_logs_close(want[1], got[1])


@pytest.mark.parametrize("hook", ["on_train_batch_begin", "on_batch_begin",
                                  "on_train_batch_end", "on_batch_end"])
def test_every_training_batch_hook_is_called_as_keras_calls_it(make_strategy, hook):
    """The per-execution hooks are skipped only when no callback has one
    (`tfdist._internal.keras.callbacks`): a callback overriding any of the four still gets
    every call, with Keras' batch indices."""
    def record(self, batch, logs=None):
        self.batches.append(batch)

    recorder_class = type("Recorder", (keras.callbacks.Callback,), {hook: record})
    ours, theirs = recorder_class(), recorder_class()
    ours.batches, theirs.batches = [], []
    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    tfdist.Trainer(model, strategy).fit(ref.global_batches(40, 16), epochs=2, verbose=0,
                                        callbacks=[ours])
    keras_model = ref.compile_model(ref.build_mlp(), "adam")
    keras_model.fit(ref.global_batches(40, 16), epochs=2, verbose=0, callbacks=[theirs])
    assert ours.batches == theirs.batches == [0, 1, 2, 0, 1, 2]


def test_a_fit_without_batch_hooks_skips_them():
    from tfdist._internal.keras import callbacks as keras_callbacks  # pylint: disable=import-outside-toplevel

    quiet = keras_callbacks.callback_list([keras.callbacks.EarlyStopping()], None, add_progbar=False)
    with_bar = keras_callbacks.callback_list([], None, add_progbar=True)
    assert not quiet._train_batch_hooks  # History and EarlyStopping have none
    assert with_bar._train_batch_hooks  # Keras' progress bar has one
