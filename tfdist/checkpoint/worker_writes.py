"""Where and how each worker writes a checkpoint: the chief to the
checkpoint directory, the other workers to a scratch directory of their
own (every worker takes part in each save), in the caller's thread or in
the background (`tfdist.checkpoint.background_writes`), and, when values
are stored in slices across workers, each worker its own slices, merged by
the chief (`tfdist.checkpoint.slice_writes`). `TrainingCheckpoint` hands
every save to one `WorkerWrites`.
"""

import fnmatch
import os
import shutil
import tempfile
from typing import Optional

import tensorflow as tf

from tfdist._internal import checkpoint_keys, host_copies
from tfdist.checkpoint import slice_writes
from tfdist.checkpoint.background_writes import BackgroundWrites


def _forget_glob_patterns() -> None:
    """Drops the glob patterns Python compiled for the last save.

    After each write TensorFlow sizes the checkpoint with
    ``glob.glob(prefix + "*")``, and ``fnmatch`` keeps every compiled
    pattern, up to 32,768 of them. The prefix is new at every save
    (``ckpt-<step>``, and a new scratch directory on the other workers), so
    each save kept its pattern (figures: docs/reliability.md#memory). Only
    compiled patterns are lost; they are rebuilt when next needed.
    """
    cache_clear = getattr(getattr(fnmatch, "_compile_pattern", None), "cache_clear", None)
    if cache_clear is not None:
        cache_clear()


class WorkerWrites:
    """This worker's writes of ``checkpoint`` (module doc).

    Attributes:
      background: TensorFlow's background writer (`BackgroundWrites`),
        with ``async_write``; else None.
      parts: a non-chief worker's background writes of its slices
        (`tfdist.checkpoint.slice_writes.PartWrites`), with ``async_write``.
    """

    def __init__(self, checkpoint: tf.train.Checkpoint,
                 manager: Optional[tf.train.CheckpointManager], directory: Optional[str], *,
                 is_chief: bool, task_name: str, async_write: bool):
        self._checkpoint, self._manager, self._directory = checkpoint, manager, directory
        self._is_chief, self._task_name = is_chief, task_name
        self.background = BackgroundWrites(checkpoint) if async_write else None
        self.parts = (slice_writes.PartWrites(checkpoint, task_name)
                      if async_write and not is_chief else None)
        self._spread_saves = 0  # background saves every worker wrote its slices of
        self.remove_stale_parts()

    def remove_stale_parts(self) -> None:
        """The chief removes slices a stopped run left (before any save)."""
        if self._is_chief:
            slice_writes.remove_stale_parts(self._directory)

    def write(self, step: int, *, synchronous: bool) -> str:
        """Writes checkpoint ``step`` as this worker does; returns its path."""
        background = self.background is not None and not synchronous
        if self.background is not None and synchronous:
            self.finish()
        spread = self._slices_spread_over_workers() if background else None
        save_number = self._spread_saves
        self._spread_saves += spread is not None
        try:
            if self._is_chief:
                if spread is not None:
                    with host_copies.worker_pieces_only():  # (this worker's slices only)
                        return self.background.save(
                            self._manager, step,
                            before_latest=lambda path: slice_writes.merge_parts(
                                path, own_replicas=spread.replicas,
                                all_replicas=spread.all_replicas, save=save_number))
                if background:
                    return self.background.save(self._manager, step)
                return self._manager.save(checkpoint_number=step)
            if spread is not None:
                return self.parts.save(os.path.join(self._directory, f"ckpt-{step}"),
                                       save_number)
            scratch = tempfile.mkdtemp(prefix=f"tfdist-{self._task_name}-ckpt-")
            if background:  # the scratch copy goes once written
                return self.background.write(os.path.join(scratch, f"ckpt-{step}"),
                                             lambda _: shutil.rmtree(scratch, ignore_errors=True))
            try:
                return self._checkpoint.write(os.path.join(scratch, f"ckpt-{step}"))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        finally:
            _forget_glob_patterns()

    def _slices_spread_over_workers(self):
        """This worker's share of the values stored in slices
        (`tfdist.communication.sharded_checkpoints.WorkerPieces` of one),
        when other workers hold the other slices; else None."""
        sliced = checkpoint_keys.value_keys(self._checkpoint, slice_writes.holds_slices)
        if not sliced:
            return None
        held = next(iter(sliced.values())).worker_pieces()
        return held if len(held.replicas) < held.all_replicas else None

    def host_bytes(self) -> int:
        """What `TrainingCheckpoint.background_host_bytes` reports."""
        if self.parts is not None and self.parts.last_host_bytes:
            return self.parts.last_host_bytes
        return self.background.host_copy_bytes() if self.background is not None else 0

    def raise_error(self) -> None:
        for writes in (self.background, self.parts):
            if writes is not None:
                writes.raise_error()

    def finish(self) -> None:
        for writes in (self.background, self.parts):
            if writes is not None:
                writes.close()
