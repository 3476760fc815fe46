"""What tfdist reads and sets of a ``tf.train.Checkpoint`` beyond its
public API: its saver (replaced by one whose save runs a traced function
across ps tasks, `tfdist.checkpoint.traced_saves`), the objects its
background writer copies (the constructor's arguments, which tfdist
extends with what it adds later, `tfdist.checkpoint.training_checkpoint`),
and its background writer (`AsyncWriter`: whether a write runs, its
thread, its copies, its error, ending it; `tfdist.checkpoint.background_writes`).

TensorFlow keeps these as instance attributes; they are pinned by the
checkpoint tests that save in the background, fail a write and close
(`tests/checkpoint/test_background_writes.py`) and by the parameter-server
checkpoint tests (`tests/checkpoint/test_checkpoint.py`).
"""

import atexit
from typing import Optional

import tensorflow as tf


def saver(checkpoint: tf.train.Checkpoint):
    """The object ``checkpoint.save`` / ``write`` save through."""
    return checkpoint._saver  # pylint: disable=protected-access


def replace_saver(checkpoint: tf.train.Checkpoint, replacement) -> None:
    checkpoint._saver = replacement  # pylint: disable=protected-access


def add_written_children(checkpoint: tf.train.Checkpoint, children: dict) -> None:
    """Makes the background writer, which saves a Checkpoint made of the
    constructor's arguments, save ``children`` (set as attributes) too."""
    checkpoint._kwargs.update(children)  # pylint: disable=protected-access


class AsyncWriter:
    """A checkpoint's background writer (``CheckpointOptions(enable_async=True)``)."""

    def __init__(self, helper):
        self._helper = helper

    @classmethod
    def of(cls, checkpoint: tf.train.Checkpoint) -> Optional["AsyncWriter"]:
        """``checkpoint``'s writer, or None before its first background save."""
        helper = getattr(checkpoint, "_async_checkpointer_impl", None)
        return None if helper is None else cls(helper)

    def writing(self) -> bool:
        """Whether a write is queued or running."""
        queue = getattr(self._helper, "_queue", None)  # TensorFlow's queue of one write
        return queue is not None and queue.unfinished_tasks > 0

    def sync(self) -> None:
        """Returns once the write in flight is complete."""
        self._helper.sync()

    def thread(self):
        """The writer's thread (a ``threading.Thread``), or None."""
        return getattr(self._helper, "_async_save_thread", None)

    def copies(self) -> dict:
        """The host copies the writer keeps: original object -> copy."""
        return getattr(self._helper, "_object_map", None) or {}

    def take_error(self) -> Optional[BaseException]:
        """The last failed write's error, once (it is cleared)."""
        error = getattr(self._helper, "_async_error", None)
        if error is not None:
            self._helper._async_error = None  # pylint: disable=protected-access
        return error

    def end(self, checkpoint: tf.train.Checkpoint) -> None:
        """Ends the writer's thread and lets it go: TensorFlow registers it
        with ``atexit``, which keeps it and every variable it copies alive
        until the process ends. ``checkpoint``'s next save makes a new one."""
        self._helper._join_async_save_thread()  # pylint: disable=protected-access
        atexit.unregister(self._helper._join_async_save_thread)  # pylint: disable=protected-access
        checkpoint._async_checkpointer_impl = None  # pylint: disable=protected-access
