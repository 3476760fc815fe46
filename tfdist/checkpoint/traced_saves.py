"""One traced save function for checkpoints whose variables span tasks.

Under ParameterServerStrategy the model and optimizer variables live on the
ps tasks and the checkpoint's counters on the chief. For such a checkpoint
TensorFlow's eager save (``MultiDeviceSaver.save``) traces a new
``tf.function`` at every save, and the traced function's parts stay
registered on the chief and on every ps, without bound. A long
parameter-server run that checkpoints every few hundred steps grew
without end.

`TracedSaves` traces the save once and calls it with the file prefix as a
tensor, which keeps almost nothing per save (figures:
docs/reliability.md#memory). It traces again
only when the objects the checkpoint reaches change (a variable created
after the first save) and keeps one function. A checkpoint whose variables
all live on one task (one device, mirrored, multi-worker mirrored) is saved
by TensorFlow's own eager path, unchanged.

It takes the place of the ``tf.train.Checkpoint``'s saver object (a private
attribute, ``_saver``) and hands everything but ``save`` to it, so
``CheckpointManager`` numbering, sweeping and the ``checkpoint`` file work
as before.
"""

import os
from typing import Optional

import tensorflow as tf

from tfdist._internal.tensorflow import checkpoint_internals
from tfdist.strategies import sharded


def _task(device: str) -> str:
    """``/job:ps/replica:0/task:0`` of a full device name."""
    return device.split("/device:")[0]


def spans_tasks(variables) -> bool:
    """True when ``variables`` (Keras or TensorFlow) live on more than one
    task, as under ParameterServerStrategy."""
    tasks = {_task(shard.device) for variable in variables
             for shard in sharded.shards(variable) if shard.device}
    return len(tasks) > 1


class TracedSaves:
    """A checkpoint's saver whose ``save`` runs one traced function."""

    def __init__(self, checkpoint: tf.train.Checkpoint, variables):
        self._checkpoint = checkpoint
        self._saver = checkpoint_internals.saver(checkpoint)
        self._variables = variables  # returns the variables to check
        self._traced_for = None  # the object graph the function was traced for
        self._function = None

    @classmethod
    def install(cls, checkpoint: tf.train.Checkpoint, variables) -> "TracedSaves":
        """Makes ``checkpoint`` save through a `TracedSaves`.

        ``variables``: a callable returning the variables whose devices decide
        whether the traced path is needed (checked at each save).
        """
        saves = cls(checkpoint, variables)
        checkpoint_internals.replace_saver(checkpoint, saves)
        return saves

    def __getattr__(self, name):
        return getattr(self._saver, name)

    def _object_graph(self) -> tuple:
        """What the checkpoint reaches, by object identity: a traced save
        captures the variables it was traced with, so a variable tracked
        later needs a new trace."""
        return tuple(id(obj) for obj in tf.train.TrackableView(self._checkpoint).descendants())

    def save(self, file_prefix, checkpoint_number: Optional[int] = None,
             session=None, options: Optional[tf.train.CheckpointOptions] = None):
        """Writes the checkpoint at ``file_prefix`` (as TensorFlow's saver)."""
        if session is not None or not tf.executing_eagerly() \
                or not spans_tasks(self._variables()):
            return self._saver.save(file_prefix, checkpoint_number=checkpoint_number,
                                    session=session, options=options)
        if checkpoint_number:
            file_prefix = f"{file_prefix}-{checkpoint_number}"
        io_device = options.experimental_io_device if options else None
        key = (self._object_graph(), io_device)
        if key != self._traced_for:
            # Write callbacks run in Checkpoint._write, after this returns;
            # only the placement option reaches the traced save.
            traced_options = tf.train.CheckpointOptions(experimental_io_device=io_device)
            saver = self._saver

            @tf.function(autograph=False)
            def write(prefix):
                return saver.save(prefix, options=traced_options)

            self._function, self._traced_for = write, key
        tf.io.gfile.makedirs(os.path.dirname(file_prefix) or ".")
        return self._function(tf.constant(file_prefix, tf.string))
