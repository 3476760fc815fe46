"""What survives: model, optimizer, data position and metric state, saved
atomically (`tfdist.checkpoint.training_checkpoint`); the metric totals'
snapshot (`tfdist.checkpoint.state_snapshot`); one traced save function for
variables on several tasks (`tfdist.checkpoint.traced_saves`); background
writes (`tfdist.checkpoint.background_writes`), each worker writing its own
slices of sharded values (`tfdist.checkpoint.slice_writes`)."""

from tfdist._internal import lazy

_NAMES = {name: "tfdist.checkpoint.training_checkpoint" for name in (
    "Position", "TrainingCheckpoint")}
__all__ = sorted(_NAMES)
__getattr__ = lazy.attributes(__name__, _NAMES)
