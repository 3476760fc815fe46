"""Run a tfdist program in Ray Train (optional extra: ``[ray]``).

Ray Train's ``TensorflowTrainer`` starts one Ray actor per worker and sets
each one's ``TF_CONFIG`` (``worker`` i = world rank i), so a tfdist program's
``tfdist.make_strategy("multi_worker_mirrored")`` runs there unchanged. This
module adds what connects tfdist's training state to Ray's:

- `checkpoint_dir()`: a local checkpoint directory for this worker, holding
  Ray's latest checkpoint (``ray.train.get_checkpoint()``) when Ray restarted
  the run, so a Trainer with ``tfdist.CheckpointOptions(directory)`` resumes
  from it exactly;
- `ReportToRay`: a Keras callback that reports each epoch's logs with
  ``ray.train.report`` (on every worker: it is a barrier) and hands the
  chief's newest tfdist checkpoint to Ray as a ``ray.train.Checkpoint``;
- `tensorflow_trainer(...)`: a ``TensorflowTrainer`` with CPU or GPU
  workers, a storage path and ``FailureConfig(max_failures=...)``, so a
  worker that dies is restarted by Ray with the whole group, and the run
  resumes from the last reported epoch.

Checkpoints are reported at epoch ends, after tfdist saved the epoch; a
restart resumes from the newest epoch Ray holds (an epoch boundary), so the
result equals an uninterrupted run. Each report uploads only the newest
checkpoint, not the ones ``CheckpointOptions(max_to_keep=...)`` keeps
locally.
"""

import os
import shutil
import tempfile
from typing import Any, Callable, Dict, Optional

import keras
import tensorflow as tf

from tfdist._internal import validation
from tfdist.errors import ConfigurationError

try:
    import ray.train
    from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
except ImportError as error:  # pragma: no cover - depends on the extra
    raise ConfigurationError(
        "tfdist.integrations.ray needs Ray Train: pip install -e \".[ray]\" (or pip install \"ray[train]\")."
    ) from error


def world_rank() -> int:
    """This worker's rank in the Ray Train worker group (0: the chief)."""
    return ray.train.get_context().get_world_rank()


def checkpoint_dir(base: Optional[str] = None) -> str:
    """A new local directory for this worker's tfdist checkpoints, holding
    the checkpoint Ray restored (``ray.train.get_checkpoint()``) if any.

    Pass it as ``tfdist.CheckpointOptions(directory)`` (or
    ``TrainingCheckpoint.for_strategy``): every worker restores from its own
    copy, so the workers need no shared file system.
    """
    rank = world_rank()
    directory = tempfile.mkdtemp(prefix=f"tfdist-ray-worker-{rank}-", dir=base)
    restored = ray.train.get_checkpoint()
    if restored is not None:
        restored.to_directory(directory)
        print(f"worker-{rank}: resuming from Ray checkpoint {restored.path}", flush=True)
    return directory


def _newest_only(directory: str) -> Optional[str]:
    """A temporary directory with only the newest checkpoint of
    ``directory`` (its files and a ``checkpoint`` index naming it)."""
    latest = tf.train.latest_checkpoint(directory)
    if latest is None:
        return None
    staging = tempfile.mkdtemp(prefix="tfdist-ray-report-")
    prefix = os.path.basename(latest)
    for name in os.listdir(directory):
        if name.startswith(prefix + "."):
            shutil.copy2(os.path.join(directory, name), staging)
    written = os.path.getmtime(latest + ".index")
    with open(os.path.join(staging, "checkpoint"), "w", encoding="utf-8") as index:
        # The text proto tf.train.CheckpointManager reads (paths relative to
        # the directory). Without the timestamps it lists no checkpoints.
        index.write(f'model_checkpoint_path: "{prefix}"\n'
                    f'all_model_checkpoint_paths: "{prefix}"\n'
                    f'all_model_checkpoint_timestamps: {written}\n'
                    f'last_preserved_timestamp: {written - 1}\n')
    return staging


class ReportToRay(keras.callbacks.Callback):
    """Reports each epoch's logs to Ray; the chief also hands Ray the newest
    tfdist checkpoint in ``checkpoint_dir`` (None: metrics only).

    Every worker must get this callback: ``ray.train.report`` is a barrier.
    Put it after any callback that changes ``logs``.
    """

    def __init__(self, checkpoint_dir: Optional[str] = None):
        super().__init__()
        self.checkpoint_dir = checkpoint_dir

    def on_epoch_end(self, epoch, logs=None):
        metrics = {"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()}}
        staging = None
        if self.checkpoint_dir is not None and world_rank() == 0:
            staging = _newest_only(self.checkpoint_dir)
        try:
            ray.train.report(
                metrics, checkpoint=Checkpoint.from_directory(staging) if staging else None)
        finally:
            if staging:
                shutil.rmtree(staging, ignore_errors=True)


def tensorflow_trainer(train_fn: Callable[..., Any], num_workers: int, *,
                       storage_path: str, name: str = "tfdist",
                       max_failures: int = 0, config: Optional[Dict] = None,
                       use_gpu: bool = False, cpus_per_worker: float = 1,
                       num_to_keep: int = 2):
    """A ``ray.train.tensorflow.TensorflowTrainer`` for a tfdist program.

    Args:
      train_fn: the per-worker function (``train_fn()`` or
        ``train_fn(config)``); it builds its strategy with
        ``tfdist.make_strategy("multi_worker_mirrored")``.
      num_workers: Ray Train workers (TensorFlow workers).
      storage_path: where Ray keeps reported checkpoints and results (a
        local path on a one-node cluster; shared storage or a bucket on more).
      name: the run's name under ``storage_path``. A run with the same name
        and path continues that run (Ray restores its record of reported
        checkpoints); use a new name for a new run.
      max_failures: restarts of the worker group Ray makes after a worker
        fails (``FailureConfig``); -1: unlimited.
      config: ``train_loop_config`` passed to ``train_fn``.
      use_gpu, cpus_per_worker: resources per worker.
      num_to_keep: reported checkpoints Ray keeps.

    Call ``.fit()`` on it: Ray returns a ``ray.train.Result`` (its
    ``metrics`` are those reported with the newest checkpoint: with
    `ReportToRay` and a checkpoint directory, the last epoch's logs) or raises
    ``ray.train.TrainingFailedError`` when the failures exceed ``max_failures``.
    """
    from ray.train.tensorflow import TensorflowTrainer

    validation.positive_int("num_workers", num_workers)
    if not isinstance(max_failures, int) or max_failures < -1:
        raise ConfigurationError(
            f"`max_failures` must be an integer >= 0 (or -1: unlimited); got {max_failures!r}.")
    if not storage_path:
        raise ConfigurationError(
            "`storage_path` is required: Ray keeps the reported checkpoints there "
            "(a local directory on one node, shared storage on several).")
    return TensorflowTrainer(
        train_fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                     resources_per_worker={"CPU": cpus_per_worker}),
        run_config=RunConfig(
            name=name, storage_path=os.path.abspath(storage_path),
            failure_config=FailureConfig(max_failures=max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=num_to_keep),
        ),
    )


__all__ = ["ReportToRay", "checkpoint_dir", "tensorflow_trainer", "world_rank"]
