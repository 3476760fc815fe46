"""The replica math, usable in hand-written loops: a replica's share of the
global loss by true example counts (`tfdist.replica.losses`), cross-replica
metrics (`tfdist.replica.metrics`), exact clipping
(`tfdist.replica.gradients`), gradient accumulation
(`tfdist.replica.accumulation`), the replica step the Trainer runs
(`tfdist.replica.step`), static shapes for XLA and TPUs
(`tfdist.replica.static_shapes`), embedding lookups and Adagrad updates
that read only a table's touched rows (`tfdist.replica.table_rows`); a
model's own ``train_step`` run exactly (`tfdist.replica.keras_steps`, with
`global_mean` for a loss averaged in the user's own code)."""

from tfdist._internal import lazy

_NAMES = {"global_mean": "tfdist.replica.losses"}
# Public: its modules for hand-written loops, and `global_mean` (their ``__all__``s
# name what each offers; `global_mean` is `tfdist.replica.global_mean` only).
__all__ = sorted(["accumulation", "global_mean", "gradients", "losses", "metrics", "static_shapes"])
__getattr__ = lazy.attributes(__name__, _NAMES)
