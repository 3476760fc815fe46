"""Finished data iterators are freed off the training thread
(`tfdist.data.iterator_release`), at most `MAX_PENDING` at a time, and every
owner of iterators hands them over: epochs, evaluation, a stopped job."""

import contextlib
import gc
import subprocess
import sys
import textwrap
import threading
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.data import epochs as epochs_lib, iterator_release
from tfdist.data.epochs import as_source


class BlockingIterator:
    """Stands for an iterator whose deletion blocks (as TensorFlow's can)
    until ``unblock`` is set; records the thread that deleted it."""

    def __init__(self, unblock: threading.Event, deleted_on: list):
        self._unblock = unblock
        self._deleted_on = deleted_on

    def __del__(self):
        self._unblock.wait(30)
        self._deleted_on.append(threading.current_thread().name)


class Holder:
    def __init__(self, iterator):
        self.iterator = iterator


@pytest.fixture(autouse=True)
def nothing_pending_after():
    # Releases started by tests of other files in this process finish first.
    assert iterator_release.wait(60), "an earlier release was never freed"
    yield
    assert iterator_release.wait(60), "a released iterator was never freed"


def test_release_returns_while_the_deletion_blocks_on_its_own_thread():
    unblock, deleted_on = threading.Event(), []
    iterator_release.release(Holder(BlockingIterator(unblock, deleted_on)))
    # The caller is back while the deletion still waits.
    assert iterator_release.pending() == 1 and deleted_on == []
    assert not iterator_release.wait(0.2)
    unblock.set()
    assert iterator_release.wait(30)
    assert deleted_on == ["tfdist-iterator-release"]


def test_release_blocks_once_max_pending_deletions_are_under_way():
    unblock, deleted_on = threading.Event(), []
    for _ in range(iterator_release.MAX_PENDING):
        iterator_release.release(Holder(BlockingIterator(unblock, deleted_on)))
    assert iterator_release.pending() == iterator_release.MAX_PENDING
    one_more = threading.Thread(
        target=iterator_release.release, args=(Holder(BlockingIterator(unblock, deleted_on)),))
    one_more.start()
    one_more.join(0.5)
    assert one_more.is_alive(), "release did not wait for a free slot"
    unblock.set()
    one_more.join(30)
    assert not one_more.is_alive()
    assert iterator_release.wait(30)
    assert len(deleted_on) == iterator_release.MAX_PENDING + 1


class Recorded:
    def __init__(self, name, log):
        self.name, self._log = name, log

    def release(self):
        self._log.append(self.name)


class Position:
    def __init__(self):
        self.epoch, self.step_in_epoch = 0, 0


def _run_epochs(persistent, stop_after=None):
    log, made = [], []
    dataset = tf.data.Dataset.from_tensors((np.zeros((2, 1), "float32"), np.zeros(2))).repeat(4)
    position = Position()

    def make_iterator(epoch, skip):
        made.append(epoch)
        return Recorded(f"iterator of epoch {epoch}", log)

    generator = epochs_lib.epoch_iterators(
        as_source(dataset), make_iterator, position, epochs=3,
        steps_per_epoch=4 if persistent else None)
    for epoch_data in generator:
        epoch = epoch_data.epoch
        log.append(f"trained epoch {epoch}")
        if epoch == stop_after:
            generator.close()  # what dropping fit's frames does
            break
        position.epoch += 1
    return log


def test_each_epoch_releases_its_iterator_when_the_next_is_made_and_at_the_end():
    assert _run_epochs(persistent=False) == [
        "trained epoch 0", "iterator of epoch 0", "trained epoch 1", "iterator of epoch 1",
        "trained epoch 2", "iterator of epoch 2"]


def test_an_iterator_running_across_epochs_is_released_once_at_the_end():
    assert _run_epochs(persistent=True) == [
        "trained epoch 0", "trained epoch 1", "trained epoch 2", "iterator of epoch 0"]


def test_an_interrupted_fit_releases_its_iterator_when_the_epochs_close():
    assert _run_epochs(persistent=False, stop_after=1) == [
        "trained epoch 0", "iterator of epoch 0", "trained epoch 1", "iterator of epoch 1"]


def _record_trainer_iterators(monkeypatch):
    """``(made, freed_on)``: a finalizer per distributed iterator the
    Trainer's synchronous runner makes, and the names of the threads that
    freed them."""
    freed_on, made = [], []
    from tfdist.loops.runners import synchronous  # pylint: disable=import-outside-toplevel

    original = synchronous.SynchronousRunner.iterator

    def recording_iterator(self, *args, **kwargs):
        counted = original(self, *args, **kwargs)
        made.append(weakref.finalize(counted.iterator, lambda: freed_on.append(
            threading.current_thread().name)))
        return counted

    monkeypatch.setattr(synchronous.SynchronousRunner, "iterator", recording_iterator)
    return made, freed_on


def test_trainer_frees_each_epochs_and_evaluations_distributed_iterator_on_the_release_thread(
        make_strategy, monkeypatch):
    """Real distributed iterators: every one the Trainer makes (3 training
    epochs, 3 validations, 1 evaluation) is freed, on the release thread."""
    strategy = make_strategy(2)
    made, freed_on = _record_trainer_iterators(monkeypatch)
    x = np.random.RandomState(0).rand(64, 4).astype("float32")
    y = (x[:, 0] > 0.5).astype("int64")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer = tfdist.Trainer(model, strategy)
    trainer.fit(data, epochs=3, validation_data=data, verbose=0)
    trainer.evaluate(data)
    assert iterator_release.wait(60)
    assert len(made) == 7
    assert freed_on == ["tfdist-iterator-release"] * 7


def test_predict_frees_its_distributed_iterator_on_the_release_thread(make_strategy,
                                                                   monkeypatch):
    """`predict`'s pass frees its iterator on the release thread too (it
    freed it on the caller's thread, which then stood idle: a conformance
    test's predict in CI; docs/performance.md#the-iterator-teardown-stall)."""
    from tfdist.training import predict as predict_lib  # pylint: disable=import-outside-toplevel

    freed_on, made = [], []
    distribute = predict_lib.data_lib.distribute

    class Recorded:
        def __init__(self, distributed):
            self._distributed = distributed

        def __iter__(self):
            iterator = iter(self._distributed)
            made.append(weakref.finalize(iterator, lambda: freed_on.append(
                threading.current_thread().name)))
            return iterator

    monkeypatch.setattr(predict_lib.data_lib, "distribute",
                        lambda *args, **kwargs: Recorded(distribute(*args, **kwargs)))
    strategy = make_strategy(2)
    x = np.random.RandomState(0).rand(40, 4).astype("float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile("sgd", "mse")
    predictions = tfdist.Trainer(model, strategy).predict(
        tf.data.Dataset.from_tensor_slices(x).batch(16))
    assert predictions.shape == (40, 2)
    assert iterator_release.wait(60)
    assert len(made) == 1 and freed_on == ["tfdist-iterator-release"]


class _FailsInTraining(keras.layers.Layer):
    """A layer whose training call raises (a user's bug), as the step is traced."""

    def call(self, inputs, training=None):
        if training:
            raise ValueError("the user's layer fails")
        return inputs


def test_a_failed_fit_frees_its_iterator_on_the_release_thread_not_at_a_later_collection(
        make_strategy, monkeypatch):
    """A failure inside the step (here the user's layer, as the step is
    traced) leaves the iterator in its traceback, a reference cycle:
    without `releases_on_error` the garbage collector freed it in some later step or test, on that thread,
    which stood still for TensorFlow's teardown (docs/performance.md)."""
    strategy = make_strategy(2)
    made, freed_on = _record_trainer_iterators(monkeypatch)
    x = np.random.RandomState(0).rand(64, 4).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, (x[:, 0] > 0.5).astype("int64"))).batch(16)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2), _FailsInTraining()])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer = tfdist.Trainer(model, strategy)
    collecting = gc.isenabled()
    gc.disable()  # the collector must not be what frees it
    try:
        with pytest.raises(ValueError, match="the user's layer fails") as raised:
            trainer.fit(data, epochs=2, verbose=0)
        assert iterator_release.wait(60)
        assert len(made) == 1 and freed_on == ["tfdist-iterator-release"]
        # The user's own frames keep their locals for a post-mortem.
        user_frame = [entry for entry in raised.traceback if entry.name == "call"][-1]
        assert "inputs" in user_frame.locals
    finally:
        if collecting:
            gc.enable()


class _RecordedPasses:
    """A distributed dataset whose iterators record the thread that frees them."""

    def __init__(self, batches, freed_on: list):
        self._batches, self._freed_on = batches, freed_on

    def __iter__(self):
        iterator = iter(self._batches)
        weakref.finalize(iterator, lambda: self._freed_on.append(
            threading.current_thread().name))
        return iterator


@pytest.mark.parametrize("leave, steps", [
    ("at the data's end", [2, 2, 1]), ("by break", [2]), ("by an exception", [2])])
def test_a_host_loop_pass_frees_its_iterator_on_the_release_thread(make_strategy, leave, steps):
    """A hand-written loop's pass (`HostLoop.executions`) owns its iterator
    and frees it on the release thread however the caller leaves it (left
    to the caller, it was freed on the training thread, which stood still)."""
    strategy = make_strategy(2)
    loop = tfdist.loops.host_loop.HostLoop(strategy, lambda batch: None, steps_per_execution=2)
    data = tf.data.Dataset.range(10).map(lambda i: (tf.cast([i], tf.float32), i)).batch(2)
    freed_on, seen = [], []
    collecting = gc.isenabled()
    gc.disable()  # the collector must not be what frees it
    try:
        with contextlib.suppress(KeyError):
            for execution in loop.executions(
                    _RecordedPasses(tfdist.data.distribute(strategy, data), freed_on)):
                seen.append(execution.steps)
                if leave == "by break":
                    break
                if leave == "by an exception":
                    raise KeyError("the caller's own error")
        assert iterator_release.wait(60)
        assert freed_on == ["tfdist-iterator-release"]
        assert seen == steps
    finally:
        if collecting:
            gc.enable()


def _exit_after_a_release(tmp_path, deletion_seconds: float, wait_seconds: float):
    """A process that releases an iterator whose deletion takes
    ``deletion_seconds`` and exits at once, its exit bounded by
    ``wait_seconds`` (a notice after 0.5 s)."""
    program = tmp_path / "exiting.py"
    program.write_text(textwrap.dedent(f"""
        import time
        from tfdist.data import iterator_release
        iterator_release.EXIT_WAIT_SECONDS = {wait_seconds}
        iterator_release.EXIT_NOTICE_SECONDS = 0.5

        class SlowToFree:
            def __del__(self):
                time.sleep({deletion_seconds})
                print("freed", flush=True)

        class Holder:
            def __init__(self):
                self.iterator = SlowToFree()

        iterator_release.release(Holder())
        print("released", flush=True)
    """))
    return subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                          timeout=120)


def test_exit_lets_a_slow_deletion_end_before_the_interpreter_does_and_says_so(tmp_path):
    """A deletion that ended while the interpreter was finalizing aborted
    the process (exit code 134); exit waits it out, past the notice."""
    done = _exit_after_a_release(tmp_path, deletion_seconds=2, wait_seconds=30)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["released", "freed"]
    assert "waiting for TensorFlow to free 1 data iterator(s)" in done.stderr
    assert "exiting anyway" not in done.stderr


def test_exit_waits_a_bounded_time_for_a_stuck_deletion_and_says_so(tmp_path):
    done = _exit_after_a_release(tmp_path, deletion_seconds=600, wait_seconds=1.5)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["released"]
    assert "1 data iterator(s) still being freed by TensorFlow after 1.5 s" in done.stderr
