"""The replica math, usable in hand-written loops: a replica's share of the
global loss by true example counts (`tfdist.replica.losses`), cross-replica
metrics (`tfdist.replica.metrics`), exact clipping
(`tfdist.replica.gradients`), gradient accumulation
(`tfdist.replica.accumulation`), the replica step the Trainer runs
(`tfdist.replica.step`), static shapes for XLA and TPUs
(`tfdist.replica.static_shapes`) and collectives with fixed keys
(`tfdist.replica.collectives`); a model's own ``train_step`` run exactly
(`tfdist.replica.keras_steps`, with `global_mean` for a loss averaged in
the user's own code)."""

from tfdist._internal import lazy

_NAMES = {"global_mean": "tfdist._internal.replica_share"}
__all__ = sorted(_NAMES)
__getattr__ = lazy.attributes(__name__, _NAMES)
