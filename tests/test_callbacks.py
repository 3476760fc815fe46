"""Keras callbacks run inside Trainer.fit with Keras semantics."""

import keras

import tfdist
from tests import reference as ref


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
        model = ref.compile_model(ref.build_mlp(), "adam")
    tfdist.Trainer(model, strategy, steps_per_execution=2).fit(
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
