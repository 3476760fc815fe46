"""Background saves across workers that never put a whole model on one
host: each worker writes its own slices, the chief merges the files.

Under `tfdist.communication.FullySharded` (and `ShardedOptimizerState`)
each worker holds only its replicas' slices of the weights, the optimizer
state and the accumulated gradients. Reading one of them whole takes an
all-gather, so a background save that copied values whole would hold the
whole model on every worker's host for as long as it writes. Across
workers, tfdist's background saves (``CheckpointOptions(async_write=True)``)
do this instead:

1. each worker copies only its own slices to its host, as the rectangles
   of each value that TensorFlow's checkpoint format stores slices of a
   variable in (`tfdist._internal.flat_pieces`); no collective runs;
2. the chief writes the checkpoint ``ckpt-<n>`` through TensorFlow's
   background writer (`tfdist.checkpoint.background_writes`), holding its
   own slices of those values and every other value whole; each other
   worker writes its slices alone to ``ckpt-<n>.part-s<save>-r<first
   replica>`` (`PartWrites`; ``save`` counts the background saves, which
   every worker takes part in), then a small marker naming its task and
   replicas;
3. before the checkpoint becomes the latest, the chief's writer waits for
   every replica's slices (at most `PART_WAIT_SECONDS`, then a
   `tfdist.errors.CheckpointWriteError` naming the replicas missing) and
   merges the files with TensorFlow's own ``MergeV2Checkpoints`` (which its
   saver merges per-device files with): `merge_parts`.

The merged checkpoint is the ordinary one: each value under its usual key
and shape, read whole by any reader (TensorFlow assembles the slices), so
it restores under any replica count, with or without sharding, and in
plain Keras. A worker's host holds its own slices only (figures: the
Large models guide). The checkpoint directory must be shared by the
workers, as restoring already requires. Parts a stopped run left behind
are removed when the chief's checkpoint starts (`remove_stale_parts`).

>>> import tempfile, tensorflow as tf
>>> from tfdist._internal import flat_pieces
>>> directory = tempfile.mkdtemp()
>>> chief, other = directory + "/ckpt-1", part_prefix(directory + "/ckpt-1", 1, save=0)
>>> first, second = flat_pieces.pieces((2, 3), 0, 3), flat_pieces.pieces((2, 3), 3, 6)
>>> _ = tf.raw_ops.SaveV2(prefix=chief, tensor_names=["w"], shape_and_slices=[first[0].spec],
...                       tensors=[tf.constant([[1., 2., 3.]])])
>>> _ = tf.raw_ops.SaveV2(prefix=other, tensor_names=["w"], shape_and_slices=[second[0].spec],
...                       tensors=[tf.constant([[4., 5., 6.]])])
>>> write_marker(other, task="worker-1", replicas=[1])
>>> merge_parts(chief, own_replicas=[0], all_replicas=2, save=0)
>>> tf.train.load_checkpoint(chief).get_tensor("w").tolist()
[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
"""

import glob
import json
import os
import threading
import time
from typing import List, Optional, Sequence

import tensorflow as tf

from tfdist._internal import checkpoint_keys, host_copies
from tfdist.checkpoint.background_writes import yield_to_training
from tfdist.errors import CheckpointWriteError

PART_WAIT_SECONDS = 300  # the chief's wait for the other workers' slices
_PART = ".part-"
_MARKER = ".written"
_MERGING = ".merging"


def holds_slices(trackable) -> bool:
    """True for a saved object whose value is stored in slices across
    replicas (it has ``worker_pieces``)."""
    return callable(getattr(type(trackable), "worker_pieces", None))


def part_prefix(prefix: str, first_replica: int, save: int) -> str:
    """Where the worker whose first replica is ``first_replica`` writes its
    slices of checkpoint ``prefix`` at its ``save``-th background save.
    (Every worker takes part in every save, so the workers count the same
    saves; a prefix may be saved twice, at a step's save and at the end of
    the epoch at that step, and each merge must take its own save's parts.)"""
    return f"{prefix}{_PART}s{save}-r{first_replica}"


def write_marker(part: str, *, task: str, replicas: Sequence[int]) -> None:
    """Marks part ``part`` complete (written after its files, atomically)."""
    temporary = part + _MARKER + ".tmp"
    with open(temporary, "w", encoding="utf-8") as marker:
        json.dump({"task": task, "replicas": [int(r) for r in replicas]}, marker)
    os.replace(temporary, part + _MARKER)


def _markers(prefix: str, save: int) -> dict:
    """``{part prefix: marker}`` of the complete parts of ``prefix``'s
    ``save``-th save."""
    found = {}
    for path in glob.glob(glob.escape(f"{prefix}{_PART}s{save}-r") + "*" + _MARKER):
        with open(path, encoding="utf-8") as marker:
            found[path[:-len(_MARKER)]] = json.load(marker)
    return found


def merge_parts(prefix: str, *, own_replicas: Sequence[int], all_replicas: int, save: int,
                timeout: float = PART_WAIT_SECONDS) -> None:
    """Waits for the parts of checkpoint ``prefix`` (the ``save``-th
    background save) that hold the replicas other than ``own_replicas``
    and merges them into it.

    Raises:
      CheckpointWriteError: a part did not arrive within ``timeout``
        seconds (the checkpoint is left unlisted; the ones before it stay).
    """
    wanted = set(range(all_replicas)) - {int(r) for r in own_replicas}
    deadline = time.monotonic() + timeout
    while True:
        markers = _markers(prefix, save)
        covered = {r for marker in markers.values() for r in marker["replicas"]}
        if wanted <= covered:
            break
        if time.monotonic() > deadline:
            arrived = sorted(marker["task"] for marker in markers.values())
            raise CheckpointWriteError(
                f"Checkpoint {prefix}: the slices of replicas {sorted(wanted - covered)} "
                f"were not written within {timeout:.0f} s (arrived: {arrived or 'none'}); "
                "the worker holding them stopped or cannot write to the checkpoint "
                "directory, which every worker must share. The checkpoints before it "
                "are complete.")
        time.sleep(0.1)
    parts = sorted(markers)
    merged = prefix + _MERGING
    tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=[prefix] + parts,
                                  destination_prefix=merged, delete_old_dirs=False)
    # (the data files first, the index last: a checkpoint is complete when
    # its index names files that exist)
    for path in glob.glob(glob.escape(merged) + ".data-*"):
        os.replace(path, prefix + path[len(merged):])
    os.replace(merged + ".index", prefix + ".index")
    for part in parts:
        os.remove(part + _MARKER)


def remove_stale_parts(directory: Optional[str]) -> None:
    """Removes parts and merges a stopped run left in ``directory`` (the
    chief, before any save)."""
    if not directory or not tf.io.gfile.isdir(directory):
        return
    for path in glob.glob(os.path.join(glob.escape(directory), "*" + _PART + "*")) + glob.glob(
            os.path.join(glob.escape(directory), "*" + _MERGING + "*")):
        try:
            os.remove(path)
        except OSError:
            pass  # (gone already)


class PartWrites:
    """A worker's (not the chief's) background writes of its own slices of
    ``checkpoint``'s values stored in slices (module doc)."""

    def __init__(self, checkpoint: tf.train.Checkpoint, task_name: str):
        self._checkpoint = checkpoint
        self._task_name = task_name
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self.in_flight: Optional[str] = None
        self.last_host_bytes = 0  # the host copies of the last write (freed once written)

    def save(self, prefix: str, save: int) -> str:
        """Copies this worker's slices to the host and starts writing them
        as checkpoint ``prefix``'s part at the ``save``-th background save;
        returns the part's prefix."""
        self.wait_for_write()
        names, specs, tensors, replicas = [], [], [], None
        for key, trackable in checkpoint_keys.value_keys(self._checkpoint, holds_slices).items():
            held = trackable.worker_pieces()
            replicas = held.replicas
            written = ([("", held.whole)] if held.whole is not None else
                       [(piece.spec, values) for piece, values in held.pieces])
            for spec, values in written:
                names.append(key)
                specs.append(spec)
                tensors.append(host_copies.host_copy(values))
        if replicas is None:
            raise ValueError("PartWrites: the checkpoint holds no value stored in slices")
        part = part_prefix(prefix, min(replicas), save)
        self.last_host_bytes = sum(int(t.shape.num_elements()) * t.dtype.size for t in tensors)
        self.in_flight = part
        self._thread = threading.Thread(
            target=self._write, args=(part, names, specs, tensors, replicas),
            name=f"tfdist-slice-writes-{self._task_name}", daemon=True)
        self._thread.start()
        return part

    def _write(self, part: str, names: List[str], specs: List[str], tensors, replicas) -> None:
        yield_to_training(threading.get_native_id())
        try:
            with tf.device("/cpu:0"):
                tf.raw_ops.SaveV2(prefix=part, tensor_names=names, shape_and_slices=specs,
                                  tensors=tensors)
            write_marker(part, task=self._task_name, replicas=replicas)
        except Exception as error:  # pylint: disable=broad-except
            self._error = error

    def wait_for_write(self) -> None:
        """Returns when no write runs; raises the last one's error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.raise_error()

    def raise_error(self) -> None:
        """Raises a failed write's error (once), naming its path."""
        error, self._error = self._error, None
        if error is not None:
            raise CheckpointWriteError(
                f"{self._task_name}: writing its slices of the checkpoint to {self.in_flight} "
                f"failed: {type(error).__name__}: {str(error).strip()[:500]}. The "
                "checkpoints before it are complete; fix the storage and restart to "
                "resume from the newest one.") from error

    def close(self) -> None:
        self.wait_for_write()
