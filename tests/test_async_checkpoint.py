"""Checkpoints written in the background (``async_checkpoint=True``):
complete before they become the latest, one write at a time, failures
raised in the loop. Exact resumes with async saves: tests/test_checkpoint.py."""

import os
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests import reference as ref
from tfdist.errors import CheckpointWriteError


def _wide_model(strategy):
    with strategy.scope():
        model = keras.Sequential([keras.Input((2048,)), keras.layers.Dense(4096),
                                  keras.layers.Dense(3)])  # 8.4M weights, ~34 MB
        model.compile(optimizer="sgd", loss="mse")
        model.optimizer.build(model.trainable_variables)
    return model


def test_a_save_returns_after_the_copy_and_the_file_holds_the_saved_step(make_strategy, tmp_path):
    strategy = make_strategy(2)
    model = _wide_model(strategy)
    checkpoint = tfdist.checkpoint.TrainingCheckpoint.for_strategy(
        model, strategy, str(tmp_path), async_write=True)
    saved = [w.numpy().copy() for w in model.weights]
    path = checkpoint.save(step=1, epoch=0, step_in_epoch=1)
    busy = checkpoint.writes.writing()
    for weight in model.weights:  # training goes on while the copy is written
        weight.assign(weight + 1.0)
    assert busy and checkpoint.latest is None  # not the latest until complete
    checkpoint.save(step=2, epoch=0, step_in_epoch=2)  # waits for the first write
    assert checkpoint.writes.waits == 1 and checkpoint.writes.wait_seconds > 0
    checkpoint.finish_writes()
    assert checkpoint.latest.endswith("ckpt-2")
    for weight in model.weights:
        weight.assign(tf.zeros_like(weight))
    with strategy.scope():
        reader = _wide_model(strategy)
    tf.train.Checkpoint(model=reader).read(path).expect_partial()
    for want, got in zip(saved, reader.weights):
        np.testing.assert_array_equal(want, got.numpy())


def test_every_background_save_of_a_keras_model_holds_the_weights_of_its_step(
        make_strategy, tmp_path):
    # Keras 3.15 makes a new host variable per copy, which TensorFlow's traced
    # copy refuses from the third save on (keras_internals.host_copies_reused).
    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "sgd")
        model.optimizer.build(model.trainable_variables)
    checkpoint = tfdist.checkpoint.TrainingCheckpoint.for_strategy(
        model, strategy, str(tmp_path), max_to_keep=5, async_write=True)
    saved = {}
    for step in range(1, 6):
        for weight in model.weights:
            weight.assign(tf.fill(weight.shape, float(step)))
        saved[step] = checkpoint.save(step=step, epoch=0, step_in_epoch=step)
    checkpoint.finish_writes()
    assert checkpoint.latest == saved[5]
    with strategy.scope():
        reader = ref.build_mlp()
    for step, path in saved.items():
        tf.train.Checkpoint(model=reader).read(path).expect_partial()
        for weight in reader.weights:
            np.testing.assert_array_equal(weight.numpy(), float(step))


def test_a_failed_background_write_is_raised_in_fit_naming_the_checkpoint(make_strategy, tmp_path):
    directory = tmp_path / "ckpt"
    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "sgd")
    trainer = tfdist.Trainer(model, strategy, checkpoint_dir=str(directory),
                             checkpoint_every_steps=2, async_checkpoint=True)

    class BreakTheDirectory(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:  # after the save at step 2: the directory becomes a file
                trainer._checkpoint.finish_writes()
                shutil.rmtree(directory)
                directory.write_text("not a directory")

    with pytest.raises(CheckpointWriteError, match=r"Writing checkpoint .*ckpt-4 in the "
                                                   r"background failed"):
        trainer.fit(ref.global_batches(160, 16), epochs=1, verbose=0,
                    callbacks=[BreakTheDirectory()])
    assert trainer.step < 10  # stopped before the end of the epoch
