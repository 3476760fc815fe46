"""Errors tfdist raises for bad input.

Each error names the argument, the value received and what to do instead,
so a user can fix the call without reading tfdist's source. They subclass the
built-in exception a caller would expect (`ValueError`, `RuntimeError`), so
existing ``except ValueError`` code keeps working. Every error class tfdist
raises is defined here (``tfdist.errors.X`` after ``import tfdist``);
`tfdist.Preempted` (a ``SystemExit``: training stopped on a signal) is not
an error and lives with the preemption watcher.

>>> import tfdist
>>> issubclass(tfdist.errors.TFConfigError, ValueError)
True
"""


class ConfigurationError(ValueError):
    """An argument, model or dataset is not in a form tfdist can use."""


class TFConfigError(ConfigurationError):
    """TF_CONFIG is malformed; the message names the field and the value."""


class PlatformEnvironmentError(ConfigurationError):
    """A platform's cluster variables (Slurm, TFJob, Vertex, SageMaker) are malformed."""


class RuntimeAlreadyStartedError(RuntimeError):
    """Devices were configured after the TensorFlow runtime had started."""


class CheckpointMismatchError(ValueError):
    """A checkpoint does not match the model and optimizer being restored."""


class ParameterServerLostError(RuntimeError):
    """A parameter server stopped answering: its variables are gone."""


class PeerLostError(RuntimeError):
    """Another task of a multi-worker job stopped answering (killed or hung)."""


class TPUNotFoundError(RuntimeError):
    """No TPU could be found or connected to (``make_strategy("tpu")``)."""


class SparkTrainingError(RuntimeError):
    """A training task on Spark failed, or the run exceeded its time bound."""
