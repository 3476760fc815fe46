"""Checkpoints written in the background (``async_checkpoint=True``):
complete before they become the latest, one write at a time, failures
raised in the loop. Exact resumes with async saves: tests/checkpoint/test_checkpoint.py."""

import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tfdist.errors import CheckpointWriteError

REPO = pathlib.Path(__file__).resolve().parents[2]


def _wide_model(strategy):
    with strategy.scope():
        model = keras.Sequential([keras.Input((2048,)), keras.layers.Dense(4096),
                                  keras.layers.Dense(3)])  # 8.4M weights, ~34 MB
        model.compile(optimizer="sgd", loss="mse")
        model.optimizer.build(model.trainable_variables)
    return model


def _writes_held_until_waited_for(monkeypatch):
    """Holds each background write on TensorFlow's writer thread (in a write
    callback, before the manager lists it) until the loop waits for it, so a
    test sees a write in flight however fast this machine writes the files."""
    from tfdist.checkpoint.background_writes import BackgroundWrites
    from tfdist._internal.tensorflow import checkpoint_internals
    gate = threading.Event()
    options = BackgroundWrites._options  # pylint: disable=protected-access

    def held(callbacks=None):
        return options([lambda path: gate.wait(60)] + list(callbacks or []))

    sync = checkpoint_internals.AsyncWriter.sync

    def release_then_sync(writer):
        gate.set()
        sync(writer)

    monkeypatch.setattr(BackgroundWrites, "_options", staticmethod(held))
    monkeypatch.setattr(checkpoint_internals.AsyncWriter, "sync", release_then_sync)


def test_a_save_returns_after_the_copy_and_the_file_holds_the_saved_step(
        make_strategy, tmp_path, monkeypatch):
    strategy = make_strategy(2)
    model = _wide_model(strategy)
    checkpoint = tfdist.checkpoint.TrainingCheckpoint.for_strategy(
        model, strategy, str(tmp_path), async_write=True)
    saved = [w.numpy().copy() for w in model.weights]
    _writes_held_until_waited_for(monkeypatch)
    path = checkpoint.save(step=1, epoch=0, step_in_epoch=1)
    # The write is held before its completion is recorded: it runs, and is
    # not the latest until complete.
    latest, busy = checkpoint.latest, checkpoint.writes.writing()
    for weight in model.weights:  # training goes on while the copy is written
        weight.assign(weight + 1.0)
    assert busy and latest is None  # not the latest until complete
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


def test_the_host_copies_of_background_saves_are_counted(make_strategy, tmp_path):
    """`TrainingCheckpoint.background_host_bytes`: in one process every
    replica's values are on this host, so a background save copies the
    whole model (with FullySharded too); a synchronous checkpoint copies
    nothing to keep. (Across workers, each worker's slices only:
    tests/scenarios/test_multi_worker.py.)"""
    strategy = make_strategy(2)
    for communication in (None, tfdist.communication.FullySharded()):
        with strategy.scope():
            model = ref.compile_model(ref.build_mlp(), "adam")
        trainer = tfdist.Trainer(model, strategy, communication=communication,
            checkpointing=tfdist.CheckpointOptions(str(tmp_path / repr(communication)),
                                                   async_write=True, every_steps=2))
        trainer.fit(ref.global_batches(64, 16), epochs=1, verbose=0)
        checkpoint = trainer._checkpoint  # pylint: disable=protected-access
        checkpoint.save(step=4, epoch=1, step_in_epoch=0)
        weights_and_state = 3 * 4 * model.count_params()  # float32 weights, Adam's two moments
        assert weights_and_state <= checkpoint.background_host_bytes() <= (
            weights_and_state + 1024), communication
        checkpoint.finish_writes()
    synchronous = tfdist.checkpoint.TrainingCheckpoint(model, str(tmp_path / "sync"))
    synchronous.save(step=1, epoch=0, step_in_epoch=1)
    assert synchronous.background_host_bytes() == 0


def test_finished_fits_leave_no_writer_thread_behind(make_strategy, tmp_path):
    """TensorFlow's writer thread (and the atexit entry that would keep it
    and the model's host copies until exit) ends with each fit."""
    def writer_threads():  # (other tests in this process may have left theirs)
        return {t for t in threading.enumerate() if "_async_save" in t.name} - before

    before = set()
    before = writer_threads()
    strategy = make_strategy(2)
    for run in range(3):
        with strategy.scope():
            model = ref.compile_model(ref.build_mlp(), "sgd")
        trainer = tfdist.Trainer(model, strategy,
            checkpointing=tfdist.CheckpointOptions(str(tmp_path / f"run{run}"), async_write=True,
                                                   every_steps=2))
        trainer.fit(ref.global_batches(70, 16), epochs=2, verbose=0)
        assert trainer._checkpoint.latest.endswith("ckpt-10")  # pylint: disable=protected-access
        assert writer_threads() == set(), writer_threads()


def test_every_background_save_of_a_keras_model_holds_the_weights_of_its_step(
        make_strategy, tmp_path):
    # Keras 3.15 makes a new host variable per copy, which TensorFlow's traced
    # copy refuses from the third save on (keras.checkpoint_copies.host_copies_reused).
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
    trainer = tfdist.Trainer(model, strategy,
        checkpointing=tfdist.CheckpointOptions(str(directory), every_steps=2, async_write=True))

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



def test_attached_keras_fit_with_async_saves_resumes_like_one_device(make_strategy, tmp_path):
    """``tfdist.attach(..., async_checkpoint=True)``: model.fit interrupted
    mid-epoch, then fit again on other replicas, ends where single-device
    Keras ends. Every save is complete when fit returns or raises."""
    dataset = ref.global_batches(100, 16)  # 7 batches per epoch
    expected, _ = ref.keras_fit(dataset, 2, "adam")

    def attached(replicas):
        strategy = make_strategy(replicas)
        with strategy.scope():
            model = ref.compile_model(ref.build_mlp(), "adam")
        return tfdist.attach(model, strategy,
            checkpointing=tfdist.CheckpointOptions(str(tmp_path), every_steps=3, async_write=True))

    first = attached(4)
    with pytest.raises(KeyboardInterrupt):
        first.fit(dataset, epochs=2, verbose=0, callbacks=[ref.CrashAtStep(11)])
    model = attached(3)
    model.fit(dataset, epochs=2, verbose=0)
    ref.assert_weights_close(expected, model)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-14")

def _killed_mid_write(directory: pathlib.Path, lines: list, timeout: float = 120):
    """Runs tests/programs/async_checkpoint_saves.py on ``directory`` and
    SIGKILLs it as soon as a background write after the first has begun
    (TensorFlow writes ``ckpt-<n>_temp/`` and renames at the end). Returns
    ``n`` if the kill landed mid-write (the temporary directory is left),
    else None. The process is ended by pid whatever happens."""
    process = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "programs" / "async_checkpoint_saves.py"),
         f"--checkpoint_dir={directory}"], cwd=REPO, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1"))
    threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True).start()
    first = None
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and process.poll() is None:
            writing = [int(m.group(1)) for m in map(re.compile(r"ckpt-(\d+)_temp$").match,
                                                    os.listdir(directory)) if m] \
                if directory.exists() else []
            if first is None and writing:
                first = writing[0]
            if writing and writing[0] > first:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
                left = [n for n in writing if (directory / f"ckpt-{n}_temp").exists()]
                return left[0] if left else None
            time.sleep(0.002)
        raise AssertionError(f"no second background write within {timeout} s: {lines[-20:]}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def test_a_sigkill_during_a_background_write_leaves_the_previous_checkpoint_latest(
        make_strategy, tmp_path):
    """A real process saving 67 MB checkpoints in the background is killed
    (SIGKILL) while TensorFlow writes one. The latest checkpoint must be a
    complete earlier one that restores every weight to its own step; the
    half-written one is never the latest; a restarted process resumes from
    it and saves again."""
    directory = tmp_path / "ckpt"
    landed, lines = None, []
    for _ in range(3):  # a kill can miss the write (it ended first): kill again
        landed = _killed_mid_write(directory, lines)
        if landed is not None:
            break
    assert landed is not None, lines[-20:]
    latest = tf.train.latest_checkpoint(str(directory))
    assert latest is not None and int(latest.rsplit("-", 1)[1]) < landed, (latest, landed)
    step = int(latest.rsplit("-", 1)[1])

    strategy = make_strategy(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4096,)), keras.layers.Dense(4096),
                                  keras.layers.Dense(3)])
        model.compile(optimizer="sgd", loss="mse")
        model.optimizer.build(model.trainable_variables)
    checkpoint = tfdist.checkpoint.TrainingCheckpoint.for_strategy(model, strategy,
                                                                   str(directory))
    assert checkpoint.restore_latest() == latest
    assert checkpoint.position().step == step
    for weight in model.weights:
        assert float(tf.reduce_min(weight)) == float(tf.reduce_max(weight)) == step, weight.name

    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "programs" / "async_checkpoint_saves.py"),
         f"--checkpoint_dir={directory}", "--saves=2"], cwd=REPO, timeout=300,
        capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"restored {step}" in done.stdout
    assert tf.train.latest_checkpoint(str(directory)).endswith(f"ckpt-{step + 2}")


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux only")
def test_the_writer_thread_runs_at_idle_priority(tmp_path):
    """TensorFlow's writer thread yields the CPU to training (the
    checkpoint benchmark: 17% -> 13% cost), and the files are still right."""
    from tfdist.checkpoint.background_writes import BackgroundWrites

    weights = tf.Variable(tf.ones([256, 256]))
    checkpoint = tf.train.Checkpoint(weights=weights)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=2)
    writes = BackgroundWrites(checkpoint)
    try:
        path = writes.save(manager, 1)
        thread = checkpoint._async_checkpointer_impl._async_save_thread  # pylint: disable=protected-access
        assert os.sched_getscheduler(thread.native_id) == os.SCHED_IDLE
        writes.wait_for_write()
        assert manager.latest_checkpoint == path
        assert float(tf.train.load_checkpoint(path).get_tensor(
            "weights/.ATTRIBUTES/VARIABLE_VALUE").mean()) == 1.0
    finally:
        writes.close()
