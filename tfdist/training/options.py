"""The Trainer's options, grouped by what they are about.

`tfdist.Trainer` takes Keras-style keywords (and `tfdist.attach` passes
them on); the Trainer keeps them as these three records, so each part of
the loop reads the group it needs.
"""

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class DataOptions:
    """What each step reads.

    Attributes:
      partial_batch: "exact", "drop" or "pad" (resolved: static shapes pad).
      global_batch_size: for "drop"/"pad" when the dataset does not show it.
      shard_policy: how workers split global-batch datasets (`tfdist.data`).
      data_service: a tf.data service address, "auto", or None.
      seed: seeds ``shuffle=True`` array orders (per epoch, the same on every worker).
    """

    partial_batch: str = "exact"
    global_batch_size: Optional[int] = None
    shard_policy: str = "auto"
    data_service: Optional[str] = None
    seed: int = 0

    def evaluation_policy(self, static_shapes: bool) -> str:
        """Evaluation pads when training does (or on static shapes); else it
        is exact: it never drops an example."""
        return "pad" if static_shapes or self.partial_batch == "pad" else "exact"


@dataclasses.dataclass(frozen=True)
class ReportingOptions:
    """What a run shows while it trains.

    Attributes:
      log_dir: TensorBoard directory (None on a task that writes no summaries).
      log_every_steps: steps between progress lines and batch summaries.
      keras_progress_bar: ``verbose`` shows Keras' progress bar instead of
        tfdist's log lines (`tfdist.attach`).
    """

    log_dir: Optional[str] = None
    log_every_steps: int = 100
    keras_progress_bar: bool = False


@dataclasses.dataclass(frozen=True)
class CheckpointOptions:
    """When and how a run saves.

    Attributes:
      directory: where checkpoints go (None: no checkpoints).
      every_steps: also save every this many steps (None: at epoch ends only).
      every_epoch: save at each epoch's end.
      max_to_keep: checkpoints kept.
      async_write: periodic and epoch saves written in the background.
    """

    directory: Optional[str] = None
    every_steps: Optional[int] = None
    every_epoch: bool = True
    max_to_keep: int = 3
    async_write: bool = False


def summary_dir(strategy, log_dir: Optional[str], checkpoint_dir: Optional[str]) -> Optional[str]:
    """Where summaries go: ``log_dir``, else ``<checkpoint_dir>/logs``; None
    on a task that writes none (multi-worker: the chief writes them)."""
    if not getattr(strategy.extended, "should_save_summary", True):
        return None
    if log_dir:
        return log_dir
    return f"{checkpoint_dir}/logs" if checkpoint_dir else None

