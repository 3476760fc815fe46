"""Errors tfdist raises for bad input.

Each error names the argument, the value received and what to do instead,
so a user can fix the call without reading tfdist's source. They subclass the
built-in exception a caller would expect (`ValueError`, `RuntimeError`), so
existing ``except ValueError`` code keeps working.
"""


class ConfigurationError(ValueError):
    """An argument, model or dataset is not in a form tfdist can use."""


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
