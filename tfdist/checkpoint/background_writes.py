"""Checkpoints written in the background, on what TensorFlow ships.

``tf.train.CheckpointOptions(enable_async=True)`` makes a save copy the
state to host memory (in the caller's thread) and write the files on a
thread of TensorFlow's own (``AsyncCheckpointHelper``). Training goes on
after the copy. What TensorFlow leaves to its caller, `BackgroundWrites`
does:

- **Latest only when complete.** ``CheckpointManager`` records a checkpoint
  in its ``checkpoint`` file from a write-completion callback, so a
  checkpoint becomes the latest only after its files are written (and the
  ``checkpoint`` file is replaced atomically). A process killed mid-write
  leaves the previous latest, which restores.
- **Errors reach the loop.** TensorFlow keeps a failed write's error until
  the next save; `raise_error` raises it at once (the Trainer asks after
  every step) as `tfdist.errors.CheckpointWriteError`, naming the path.
- **The writer yields to training.** TensorFlow's writer thread runs at
  idle priority (`_yield_to_training`), so it serializes in the CPU time
  training leaves.
- **One write in flight.** A save while the previous write runs waits for
  it (TensorFlow's queue holds one); `wait_for_write` counts those waits and
  their seconds (``waits``, ``wait_seconds``), the cost async saves still
  have.
- **Keras variables.** Keras 3.15 makes a new host variable on every copy,
  which TensorFlow's traced copy refuses from the third save on; within a
  save, the wrapped variable's host copy is reused
  (`tfdist._internal.keras.checkpoint_copies.host_copies_reused`).
- **A graph that grew.** TensorFlow lists the variables to copy at the
  first save; if the checkpoint reaches other objects later, the helper is
  finished and made anew.

>>> import tempfile, tensorflow as tf
>>> from tfdist.checkpoint.background_writes import BackgroundWrites
>>> weights = tf.Variable(tf.ones([256, 256]))
>>> checkpoint = tf.train.Checkpoint(weights=weights)
>>> manager = tf.train.CheckpointManager(checkpoint, tempfile.mkdtemp(), max_to_keep=2)
>>> writes = BackgroundWrites(checkpoint)
>>> path = writes.save(manager, 1)      # returns after the copy to host memory
>>> _ = weights.assign(tf.zeros([256, 256]))  # training goes on; the copy is written
>>> writes.wait_for_write()             # (before reading the files)
>>> manager.latest_checkpoint == path, float(tf.train.load_checkpoint(path).get_tensor(
...     "weights/.ATTRIBUTES/VARIABLE_VALUE").mean())
(True, 1.0)
"""

import os
import time
from typing import Callable, Optional

import tensorflow as tf

from tfdist._internal import host_copies
from tfdist._internal.keras.checkpoint_copies import host_copies_reused
from tfdist._internal.tensorflow import checkpoint_internals
from tfdist.errors import CheckpointWriteError


def yield_to_training(native_thread_id: int) -> None:
    """Runs a writer thread only when training leaves the CPU idle (Linux
    ``SCHED_IDLE``; elsewhere the lowest nice value)."""
    try:
        os.sched_setscheduler(native_thread_id, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError):
        try:
            os.setpriority(os.PRIO_PROCESS, native_thread_id, 19)
        except (OSError, AttributeError):
            pass  # a platform without either: the writer keeps its priority


class BackgroundWrites:
    """The background writes of one ``tf.train.Checkpoint`` (module doc)."""

    def __init__(self, checkpoint: tf.train.Checkpoint):
        self._checkpoint = checkpoint
        self._graph = None  # the objects the helper copies, at its first save
        self.in_flight: Optional[str] = None  # the path of the last write started
        self.waits, self.wait_seconds = 0, 0.0
        self._lowered = None  # the writer thread whose priority was lowered

    def _writer(self) -> Optional[checkpoint_internals.AsyncWriter]:
        return checkpoint_internals.AsyncWriter.of(self._checkpoint)

    def writing(self) -> bool:
        """True while a background write runs."""
        writer = self._writer()
        return writer is not None and writer.writing()

    def save(self, manager: tf.train.CheckpointManager, number: int,
             before_latest: Optional[Callable[[str], None]] = None) -> str:
        """Starts ``manager``'s checkpoint ``number``; returns its path.
        ``before_latest(path)`` runs on the writer thread once the files are
        written and before the manager lists the checkpoint as the latest
        (an error there keeps it unlisted and is raised as a failed write)."""
        self._prepare()
        with host_copies_reused():  # the copy runs in this thread
            self.in_flight = manager.save(
                checkpoint_number=number,
                options=self._options([before_latest] if before_latest else None))
        self._yield_to_training()
        return self.in_flight

    def write(self, prefix: str, written: Callable[[str], None]) -> str:
        """Starts a write to ``prefix`` outside any manager (a non-chief
        worker's scratch copy); ``written(path)`` runs once it is complete."""
        self._prepare()
        with host_copies_reused():
            self.in_flight = self._checkpoint.write(prefix, options=self._options([written]))
        self._yield_to_training()
        return self.in_flight

    def _yield_to_training(self) -> None:
        """Gives TensorFlow's writer thread the CPU only when training leaves
        it idle (Linux ``SCHED_IDLE``; elsewhere the lowest nice value), once
        per thread. Training threads no longer wait behind the writer, so
        background saves cost training less (figures:
        docs/performance.md#measurements-behind-design-choices)."""
        writer = self._writer()
        thread = None if writer is None else writer.thread()
        if thread is None or thread.native_id is None or thread.native_id == self._lowered:
            return
        self._lowered = thread.native_id
        yield_to_training(thread.native_id)

    def host_copy_bytes(self) -> int:
        """The bytes of the host copies kept for background writes (made at
        the first save, kept until `close`): a whole copy of every saved
        value, or of this worker's slices of values stored in slices across
        workers (`tfdist.checkpoint.slice_writes`)."""
        writer = self._writer()
        object_map = {} if writer is None else writer.copies()
        copies = {id(copy): copy for copy in object_map.values()
                  if isinstance(copy, (tf.Variable, host_copies.PiecesCopy))}
        return sum(host_copies.nbytes(copy) for copy in copies.values())

    def wait_for_write(self) -> None:
        """Returns when no write runs; raises the last one's error if it failed."""
        if self.writing():
            start = time.monotonic()
            self._writer().sync()
            self.waits += 1
            self.wait_seconds += time.monotonic() - start
        self.raise_error()

    def raise_error(self) -> None:
        """Raises a failed background write's error (once), naming its path."""
        writer = self._writer()
        error = None if writer is None else writer.take_error()
        if error is not None:
            raise CheckpointWriteError(
                f"Writing checkpoint {self.in_flight} in the background failed: "
                f"{type(error).__name__}: {str(error).strip()[:500]}. The checkpoints "
                "before it are complete; fix the storage and restart to resume from "
                "the newest one.") from error

    def close(self) -> None:
        """Waits for the last write and ends TensorFlow's writer thread.

        TensorFlow's helper registers itself with ``atexit``, which keeps it,
        its thread and every variable it copies alive until the process
        ends; closing unregisters it, so a finished Trainer's model can go.
        The next save makes a new helper."""
        self.wait_for_write()
        writer = self._writer()
        if writer is not None:
            writer.end(self._checkpoint)
        self._graph = None

    def _prepare(self) -> None:
        self.wait_for_write()
        graph = tuple(id(obj) for obj in tf.train.TrackableView(self._checkpoint).descendants())
        if self._graph is not None and graph != self._graph:
            self.close()  # variables added since: a new helper lists them
        self._graph = graph

    @staticmethod
    def _options(callbacks=None) -> tf.train.CheckpointOptions:
        return tf.train.CheckpointOptions(enable_async=True,
                                          experimental_write_callbacks=callbacks)
