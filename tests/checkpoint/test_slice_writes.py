"""`tfdist.checkpoint.slice_writes`: the chief merges the workers' slices
into one ordinary checkpoint, waits a bounded time for a missing one, and
removes what a stopped run left. (End to end across 2 real workers:
tests/scenarios/test_multi_worker.py's sharded-state test.)"""

import numpy as np
import pytest
import tensorflow as tf

from tfdist._internal import flat_pieces
from tfdist.checkpoint import slice_writes
from tfdist.errors import CheckpointWriteError

WEIGHT = np.arange(30, dtype=np.float32).reshape(2, 3, 5)
COUNTER = np.int64(7)


def _write_workers(prefix, workers=3, replicas_each=2):
    """Worker w writes the flat slices of replicas 2w, 2w+1 of WEIGHT (6
    replicas, slices of 5); the chief (w = 0) also writes COUNTER whole."""
    length = -(-WEIGHT.size // (workers * replicas_each))
    flat = WEIGHT.reshape(-1)
    for worker in range(workers):
        start = min(worker * replicas_each * length, WEIGHT.size)
        stop = min(start + replicas_each * length, WEIGHT.size)
        found = flat_pieces.pieces(WEIGHT.shape, start, stop)
        names = ["w"] * len(found)
        specs = [piece.spec for piece in found]
        tensors = [flat[p.start:p.stop].reshape(p.lengths) for p in found]
        target = (prefix if worker == 0 else
                  slice_writes.part_prefix(prefix, worker * replicas_each, save=3))
        if worker == 0:
            names, specs, tensors = names + ["counter"], specs + [""], tensors + [COUNTER]
        tf.raw_ops.SaveV2(prefix=target, tensor_names=names, shape_and_slices=specs,
                          tensors=tensors)
        if worker:
            slice_writes.write_marker(target, task=f"worker-{worker}",
                                      replicas=[worker * replicas_each + i
                                                for i in range(replicas_each)])


def test_the_slices_of_three_workers_merge_into_whole_values(tmp_path):
    prefix = str(tmp_path / "ckpt-4")
    _write_workers(prefix)
    slice_writes.merge_parts(prefix, own_replicas=[0, 1], all_replicas=6, save=3)
    reader = tf.train.load_checkpoint(prefix)
    np.testing.assert_array_equal(reader.get_tensor("w"), WEIGHT)
    assert reader.get_tensor("counter") == COUNTER
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-4.data-00000-of-00003", "ckpt-4.data-00001-of-00003",
        "ckpt-4.data-00002-of-00003", "ckpt-4.index"]


def test_a_missing_worker_is_waited_for_a_bounded_time_and_named(tmp_path):
    prefix = str(tmp_path / "ckpt-4")
    _write_workers(prefix)
    (tmp_path / "ckpt-4.part-s3-r4.written").unlink()  # the last worker never finished
    with pytest.raises(CheckpointWriteError, match=r"replicas \[4, 5\] were not written within "
                                                   r"1 s \(arrived: \['worker-1'\]\)"):
        slice_writes.merge_parts(prefix, own_replicas=[0, 1], all_replicas=6, save=3,
                                 timeout=1)
    assert (tmp_path / "ckpt-4.index").exists()  # (the chief's own files: kept, unlisted)


def test_a_merge_takes_only_its_own_saves_parts(tmp_path):
    """The same checkpoint saved twice (a step's save, then the epoch's end
    at that step): the second merge does not take the first save's parts,
    whose files the first merge consumed."""
    prefix = str(tmp_path / "ckpt-4")
    _write_workers(prefix)  # (parts of save 3)
    with pytest.raises(CheckpointWriteError, match=r"replicas \[2, 3, 4, 5\]"):
        slice_writes.merge_parts(prefix, own_replicas=[0, 1], all_replicas=6, save=4,
                                 timeout=0.5)


def test_parts_a_stopped_run_left_are_removed(tmp_path):
    _write_workers(str(tmp_path / "ckpt-4"))
    (tmp_path / "ckpt-2.merging.index").write_text("")
    (tmp_path / "checkpoint").write_text("")
    slice_writes.remove_stale_parts(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint", "ckpt-4.data-00000-of-00001", "ckpt-4.index"]
