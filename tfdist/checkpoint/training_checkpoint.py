"""What survives: model, optimizer and the data position, in a checkpoint.

`TrainingCheckpoint` wraps ``tf.train.CheckpointManager`` over the model, its
optimizer, the metric state of the epoch in progress (`track_metrics`) and
three counters: the global ``step``, the ``epoch`` and the ``step_in_epoch``
(global batches of that epoch already trained on). The counters let
`Trainer.fit` resume where it stopped, mid-epoch included, by skipping the
consumed batches of a deterministic data order; the metric state makes the
resumed epoch report what an uninterrupted one would.

Saves are atomic: TensorFlow writes a checkpoint's files under temporary
names, renames them when complete, and only then rewrites the ``checkpoint``
file that names the newest one (itself written to a temporary file and
renamed). A task killed during a save leaves the previous checkpoint as the
newest. `restore_latest` also skips, with a message, a newest checkpoint
whose files are missing or unreadable and restores the newest complete one.

``tf.train.Checkpoint`` stores one copy of each mirrored variable, so a
checkpoint written under 4 replicas restores under 1 or 2, or another
strategy.

A checkpoint from an incompatible model raises `CheckpointMismatchError`
before anything is written; the checkpoint directory is left as it was.

Variables on several tasks (parameter servers) are saved by one traced
function (`tfdist.checkpoint.traced_saves`): TensorFlow's eager save traces a new one
at every save and keeps it.

Under a multi-worker strategy every worker takes part in each save, but only
the chief writes to ``directory``; the others write to a temporary directory
of their own that is removed right after. Every worker restores from
``directory`` (a file system all workers share).

With ``async_write=True`` periodic and epoch saves are written in the
background (`tfdist.checkpoint.background_writes`): a save returns after
the state is copied to host memory, a checkpoint becomes the latest only
once its files are complete, and a failed write raises
`tfdist.errors.CheckpointWriteError` at the next `raise_write_error` (the
Trainer asks after every step). Saves with ``synchronous=True`` (the
preemption save) wait for the write in flight and write in the caller's
thread. Variables on several tasks (parameter servers) are refused: their
saves go through tfdist's one traced function, which TensorFlow's
background writer does not use. Values stored in slices across workers
(`tfdist.communication.FullySharded`, `ShardedOptimizerState`) are written
in the background by each worker, its own slices only, and merged by the
chief into the ordinary checkpoint (`tfdist.checkpoint.slice_writes`): no
host holds the whole model for a background save.
"""

import contextlib
import dataclasses
import os
from typing import Optional

import keras
import tensorflow as tf

from tfdist import cluster
from tfdist._internal import host_values
from tfdist._internal.keras import model_state as keras_model_state
from tfdist._internal.tensorflow import checkpoint_internals
from tfdist.checkpoint.state_snapshot import TotalsSnapshot
from tfdist.checkpoint.traced_saves import TracedSaves, spans_tasks
from tfdist.checkpoint.worker_writes import WorkerWrites
from tfdist.errors import CheckpointMismatchError, CheckpointWriteError, ConfigurationError
from tfdist.replica.metrics import state_variables
from tfdist.strategies import sharded


@dataclasses.dataclass
class Position:
    """Where training stands: the data position a checkpoint records.

    >>> import tfdist
    >>> position = tfdist.checkpoint.Position()
    >>> position.advance(3)                  # 3 global batches trained
    >>> position.next_epoch()
    >>> position.advance(2)
    >>> position
    Position(step=5, epoch=1, step_in_epoch=2)
    """

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0

    def advance(self, steps: int) -> None:
        """``steps`` more global batches of this epoch were trained on."""
        self.step += steps
        self.step_in_epoch += steps

    def next_epoch(self) -> None:
        """The epoch ended; the next starts at its first batch."""
        self.epoch += 1
        self.step_in_epoch = 0


class TrainingCheckpoint:
    """Saves and restores training state under ``directory`` (None: keeps
    the position only; nothing is written or restored).

    A hand-written loop makes it with `for_strategy`, restores, resumes at
    `position` and saves with `save_position` (docs/guides/custom-loops.md):

    >>> import tempfile, keras, tfdist
    >>> strategy = tfdist.make_strategy("one_device")
    >>> with strategy.scope():
    ...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    ...     model.compile(optimizer="sgd", loss="mse")
    ...     model.optimizer.build(model.trainable_variables)
    ...     loss_mean = keras.metrics.Mean(name="loss")
    ...     checkpoint = tfdist.checkpoint.TrainingCheckpoint.for_strategy(
    ...         model, strategy, tempfile.mkdtemp(), metrics=[loss_mean])
    >>> checkpoint.restore_latest() is None   # a new directory: start at the beginning
    True
    >>> position = tfdist.checkpoint.Position(step=5, epoch=1, step_in_epoch=2)
    >>> path = checkpoint.save_position(position)
    >>> checkpoint.restore_latest() == path, checkpoint.position()
    (True, Position(step=5, epoch=1, step_in_epoch=2))

    The metrics' state of the epoch in progress is saved with it:

    >>> loss_mean.update_state(2.0)
    >>> path = checkpoint.save(step=6, epoch=1, step_in_epoch=3)  # save_position's arguments
    >>> loss_mean.reset_state()
    >>> checkpoint.restore_latest() == checkpoint.latest == path, float(loss_mean.result())
    (True, 2.0)
    """

    def __init__(
        self,
        model: keras.Model,
        directory: Optional[str],
        *,
        max_to_keep: int = 3,
        is_chief: bool = True,
        task_name: str = "worker-0",
        async_write: bool = False,
    ):
        if max_to_keep is not None and max_to_keep < 1:
            raise ConfigurationError(
                f"`max_to_keep` ({max_to_keep}) must be a positive integer."
            )
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.step_in_epoch = tf.Variable(
            0, dtype=tf.int64, trainable=False, name="step_in_epoch"
        )
        self.directory = directory
        self._task_name = task_name
        # Random layers' generator states: a resumed run draws on where the
        # uninterrupted one would (`tfdist._internal.replica_random`).
        seed_states = keras_model_state.seed_generator_states(model)
        self._checkpoint = tf.train.Checkpoint(
            model=model,
            optimizer=model.optimizer,
            step=self.step,
            epoch=self.epoch,
            step_in_epoch=self.step_in_epoch,
            **({"random_layers": tf.train.Checkpoint(**seed_states)} if seed_states else {}),
        )
        self._manager = None if directory is None else tf.train.CheckpointManager(
            self._checkpoint, directory, max_to_keep=max_to_keep
        )
        self._model = model
        self._snapshots = []  # `track_state`
        TracedSaves.install(self._checkpoint, self._saved_variables)
        self._writes = WorkerWrites(self._checkpoint, self._manager, directory,
                                    is_chief=is_chief, task_name=task_name,
                                    async_write=async_write)
        self.writes = self._writes.background  # (None without async_write)

    @classmethod
    def for_strategy(cls, model: keras.Model, strategy: tf.distribute.Strategy,
                     directory: Optional[str], *, metrics=(), accumulator=None,
                     max_to_keep: int = 3, async_write: bool = False) -> "TrainingCheckpoint":
        """The checkpoint of a hand-written loop: the model, its optimizer,
        the state of Keras ``metrics`` (the epoch in progress) and of an
        ``accumulator`` (`tfdist.replica.accumulation.GradientAccumulator`), and the
        data `Position`. Only the chief of a multi-worker strategy writes to
        ``directory``. Create it under ``strategy.scope()`` once the
        optimizer is built; call `save_position` on every worker."""
        checkpoint = cls(
            model, directory, max_to_keep=max_to_keep,
            is_chief=getattr(strategy.extended, "should_checkpoint", True),
            task_name=cluster.task_name(), async_write=async_write)
        checkpoint.track_state(state_variables(list(metrics)), accumulator)
        return checkpoint

    def track_state(self, metric_variables, accumulator=None, extra=None) -> None:
        """Adds metric state variables (``{name: variable}``), a
        `tfdist.replica.accumulation.GradientAccumulator`'s sums (through
        `tfdist.checkpoint.state_snapshot` under multi-worker strategies) and
        ``extra`` trackables (``{name: trackable}``, e.g.
        `tfdist.communication.LocalSGD`'s outer optimizer) to what is saved.
        `for_strategy` calls it with its ``metrics``' state; a second call
        replaces what the first added.

        >>> import tempfile, keras, tensorflow as tf, tfdist
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> model.compile(optimizer="sgd", loss="mse")
        >>> model.optimizer.build(model.trainable_variables)
        >>> checkpoint = tfdist.checkpoint.TrainingCheckpoint(model, tempfile.mkdtemp())
        >>> seen = tf.Variable(0.0)              # e.g. a running total of a hand-written loop
        >>> checkpoint.track_state({"seen": seen})
        >>> _ = seen.assign(40.0); path = checkpoint.save(step=4, epoch=0, step_in_epoch=4)
        >>> _ = seen.assign(0.0); checkpoint.restore_latest() == path, float(seen)
        (True, 40.0)
        """
        self._snapshots = [TotalsSnapshot(dict(metric_variables))]
        added = {"metrics": self._snapshots[0].tracked}
        if accumulator is not None:
            self._snapshots.append(TotalsSnapshot(accumulator.variables()))
            added["gradient_accumulation"] = self._snapshots[1].tracked
        for name, trackable in (extra or {}).items():
            added[name] = (tf.train.Checkpoint(**trackable) if isinstance(trackable, dict)
                           else trackable)
        for name, tracked in added.items():
            setattr(self._checkpoint, name, tracked)
        # TensorFlow's background writer saves a Checkpoint made of the
        # constructor's arguments: it must list these too.
        checkpoint_internals.add_written_children(self._checkpoint, added)

    def _saved_variables(self) -> list:
        """The model's, its optimizer's and the position counters' variables."""
        optimizer = self._model.optimizer
        return (list(self._model.variables)
                + (list(optimizer.variables) if optimizer else [])
                + [self.step, self.epoch, self.step_in_epoch])

    def _prepare_sharded(self) -> None:
        """Sharded variables (parameter servers) save as full tensors."""
        if self.writes is not None and spans_tasks(self._saved_variables()):
            raise ConfigurationError(
                "async_write=True (background writes) is not supported under "
                "ParameterServerStrategy: its saves run as one traced function "
                "(tfdist.checkpoint.traced_saves), which TensorFlow's background writer "
                "bypasses. Use async_write=False.")
        sharded.save_as_full_tensors(self._saved_variables())

    def background_host_bytes(self) -> int:
        """The bytes this worker's background saves copy to its host: the
        copies kept by TensorFlow's writer (the chief's, or every worker's
        without values stored in slices across workers), or this worker's
        slices at its last save (`tfdist.checkpoint.slice_writes`); 0
        without ``async_write``."""
        return self._writes.host_bytes()

    def raise_write_error(self) -> None:
        """Raises `tfdist.errors.CheckpointWriteError` if a background write
        failed (once); nothing without ``async_write``."""
        self._writes.raise_error()

    def finish_writes(self) -> None:
        """Waits for the background write in flight (raising its error) and
        ends the writer thread (a later save starts a new one)."""
        self._writes.finish()

    @contextlib.contextmanager
    def writes_finished(self):
        """A block (a ``fit``) after which no background write runs. If the
        block ends normally a failed write is raised; if it raises, the write
        is still waited for (a restart in this process then sees it) and a
        failure is printed, so the block's own error is the one raised."""
        try:
            yield
        except BaseException:
            try:
                self.finish_writes()
            except CheckpointWriteError as error:
                print(f"{self._task_name}: {error}", flush=True)
            raise
        self.finish_writes()

    @property
    def latest(self) -> Optional[str]:
        """Path prefix of the newest checkpoint, or None."""
        return None if self._manager is None else self._manager.latest_checkpoint

    def restore_latest(self) -> Optional[str]:
        """Restores the newest complete checkpoint, if any; returns its path.

        A newer checkpoint whose files are missing or unreadable is skipped
        with a message naming it.

        Raises:
          CheckpointMismatchError: its variables do not match the model.
        """
        self.finish_writes()
        self._writes.remove_stale_parts()
        for path in reversed(self._manager.checkpoints if self._manager else []):
            if not tf.io.gfile.exists(path + ".index"):
                print(f"skipping checkpoint {path}: its index file is missing", flush=True)
                continue
            self._prepare_sharded()
            try:
                status = self._checkpoint.restore(path)
                status.assert_existing_objects_matched()
            except (tf.errors.NotFoundError, tf.errors.DataLossError, IndexError) as error:
                # (IndexError: the reader found a data file shorter than its index says.)
                print(f"skipping checkpoint {path}: unreadable "
                      f"({str(error).splitlines()[0][:200]})", flush=True)
                continue
            except (AssertionError, ValueError, tf.errors.OpError) as error:
                raise CheckpointMismatchError(
                    f"The checkpoint {path} does not match this model and "
                    f"optimizer: {str(error)[:500]}\nUse a new checkpoint directory "
                    "for this model, or rebuild the model that wrote the "
                    f"checkpoint. Nothing in {os.path.dirname(path)} was changed."
                ) from error
            for snapshot in self._snapshots:
                snapshot.after_restore()
            return path
        return None

    def listed(self) -> list:
        """Paths of the complete checkpoints in the directory, oldest first,
        read afresh from its state file (which the writer updates after a
        checkpoint's files are written: one being written is not listed)."""
        state = None if self.directory is None else tf.train.get_checkpoint_state(self.directory)
        return list(state.all_model_checkpoint_paths) if state else []

    def read_model(self, path: str) -> Position:
        """Reads the model's weights and the position from the checkpoint at
        ``path`` (not the optimizer's or metrics' state: for evaluating it),
        and returns the position.

        Raises:
          tf.errors.NotFoundError, tf.errors.DataLossError, IndexError: it is gone or
            damaged (IndexError: a data file shorter than its index says).
        """
        reader = tf.train.Checkpoint(model=self._model, step=self.step, epoch=self.epoch,
                                     step_in_epoch=self.step_in_epoch)
        reader.read(path).expect_partial()
        return self.position()

    def position(self) -> Position:
        """The position recorded by the checkpoint last restored or saved."""
        return Position(int(self.step.numpy()), int(self.epoch.numpy()),
                        int(self.step_in_epoch.numpy()))

    def save_position(self, position: Position, *, synchronous: bool = False) -> Optional[str]:
        """`save` at ``position`` (on every worker: all take part)."""
        return self.save(position.step, position.epoch, position.step_in_epoch,
                         synchronous=synchronous)

    def save(self, step: int, epoch: int, step_in_epoch: int, *,
             synchronous: bool = False) -> Optional[str]:
        """Records the position and writes a checkpoint numbered ``step``
        (returns its path; None without a directory). With ``async_write``
        the write runs in the background unless ``synchronous``."""
        self.step.assign(host_values.int64(step))
        self.epoch.assign(host_values.int64(epoch))
        self.step_in_epoch.assign(host_values.int64(step_in_epoch))
        if self._manager is None:
            return None
        self._prepare_sharded()
        for snapshot in self._snapshots:
            snapshot.before_save()
        return self._writes.write(step, synchronous=synchronous)
