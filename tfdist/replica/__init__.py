"""The replica math, usable in hand-written loops: a replica's share of the
global loss by true example counts (`tfdist.replica.losses`), cross-replica
metrics (`tfdist.replica.metrics`), exact clipping
(`tfdist.replica.gradients`), gradient accumulation
(`tfdist.replica.accumulation`), the replica step the Trainer runs
(`tfdist.replica.step`), static shapes for XLA and TPUs
(`tfdist.replica.static_shapes`) and collectives with fixed keys
(`tfdist.replica.collectives`)."""

from tfdist._internal import lazy

__getattr__ = lazy.attributes(__name__, {})
