"""Errors tfdist raises for bad input.

Each error names the argument, the value received and what to do instead,
so a user can fix the call without reading tfdist's source. They subclass the
built-in exception a caller would expect (`ValueError`, `RuntimeError`), so
existing ``except ValueError`` code keeps working. Every error class tfdist
raises is defined here (``tfdist.errors.X`` after ``import tfdist``);
`tfdist.Preempted` (a ``SystemExit``: training stopped on a signal) is not
an error and lives with the stop signals (`tfdist.cluster.stop_signals`).

>>> import tfdist
>>> issubclass(tfdist.errors.TFConfigError, ValueError)
True
"""


class ConfigurationError(ValueError):
    """An argument, model or dataset is not in a form tfdist can use.

    The base of tfdist's input errors (`TFConfigError`,
    `PlatformEnvironmentError`); the message names the argument, the value
    and the fix:

    >>> import tfdist
    >>> try:
    ...     tfdist.cluster.build_tf_config({"worker": ["host1:2222"]}, "worker", 3)
    ... except tfdist.errors.ConfigurationError as error:
    ...     print(type(error).__name__, "|", error)
    TFConfigError | TF_CONFIG: task.index (3) is out of range for job 'worker' with 1 task(s).
    """


class TFConfigError(ConfigurationError):
    """TF_CONFIG is malformed; the message names the field and the value.

    >>> import tfdist
    >>> try:
    ...     tfdist.cluster.parse_tf_config(
    ...         '{"cluster": {"worker": ["host1"]}, "task": {"type": "worker", "index": 0}}')
    ... except tfdist.errors.TFConfigError as error:
    ...     print(error)
    TF_CONFIG: cluster.worker[0] ('host1') is not a 'host:port' address.
    """


class PlatformEnvironmentError(ConfigurationError):
    """A platform's cluster variables (Slurm, TFJob, Vertex, SageMaker) are malformed."""


class RuntimeAlreadyStartedError(RuntimeError):
    """Devices were configured after the TensorFlow runtime had started.

    Logical CPUs (``make_strategy("mirrored", num_replicas=N)`` without GPUs)
    can only be made before TensorFlow's first op; make the strategy first:

    >>> import tensorflow as tf, tfdist
    >>> _ = tf.constant(1.0)                  # the runtime starts here, with 1 CPU device
    >>> try:
    ...     tfdist.make_strategy("mirrored", num_replicas=16)
    ... except tfdist.errors.RuntimeAlreadyStartedError as error:
    ...     print(type(error).__name__)
    RuntimeAlreadyStartedError
    """


class CheckpointMismatchError(ValueError):
    """A checkpoint does not match the model and optimizer being restored.

    Raised by `Trainer.fit` (and ``TrainingCheckpoint.restore_latest``)
    before anything is written; the fix is a new checkpoint directory or the
    model that wrote it. A ``ValueError``, so existing handlers catch it:

    >>> import tfdist
    >>> issubclass(tfdist.errors.CheckpointMismatchError, ValueError)
    True
    """


class CheckpointWriteError(RuntimeError):
    """A checkpoint written in the background (``CheckpointOptions(async_write=True)``)
    failed; the message names its path and TensorFlow's error. Raised in the
    training loop at the next step; the checkpoints before it are intact."""


class ParameterServerLostError(RuntimeError):
    """A parameter server stopped answering: its variables are gone."""


class PeerLostError(RuntimeError):
    """Another task of a multi-worker job stopped answering (killed or hung)."""


class TPUNotFoundError(RuntimeError):
    """No TPU could be found or connected to (``make_strategy("tpu")``)."""


class SparkTrainingError(RuntimeError):
    """A training task on Spark failed, or the run exceeded its time bound."""


class UnsupportedKerasError(ImportError):
    """The installed Keras moved or removed internals tfdist reads.

    Raised when tfdist first loads its Keras layer (``tfdist.attach``,
    ``tfdist.Trainer``, ...), before any model is touched; the message names
    the Keras version, every internal that moved or vanished and the Keras
    versions tfdist supports (`tfdist.versions`). An ``ImportError``: the
    fix is another Keras, or a tfdist that supports this one.
    """


__all__ = [
    "CheckpointMismatchError", "CheckpointWriteError", "ConfigurationError",
    "ParameterServerLostError", "PeerLostError", "PlatformEnvironmentError",
    "RuntimeAlreadyStartedError", "SparkTrainingError", "TFConfigError", "TPUNotFoundError",
    "UnsupportedKerasError",
]
