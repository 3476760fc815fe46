"""Keeps TensorFlow's iterator-teardown stall out of the benchmark's windows.

Deleting a distributed dataset's iterator joins tf.data's autotuning
threads (one for the host pipeline, one per device dataset on CPU), and a
thread can sleep through its cancellation until its next optimization run;
runs come at 10 * (2^k - 1) ms of the iterator's life, so the join takes
0 to several seconds and grows with the iterator's age
(docs/performance.md, "The iterator teardown stall"). Every contender
ends every window with such a deletion, so this stall, not the training
loop, decided most of a window's rate.

With autotuning off on the benchmark's dataset and on the per-device
datasets (a private TensorFlow function, wrapped here), 22 of 22 deletions
took ~1 ms in a probe (with the host's off only: 9 of 22 took 8 ms to 2.5 s).
The data is one in-memory batch repeated, so there is nothing to tune.
The benchmark does this by default (``--keep_teardown_stall`` keeps it:
closer to what an epoch's end costs a user, much noisier).
"""

_patched = False


def without_autotune(dataset):
    """``dataset`` with tf.data autotuning off (no model thread to join)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def remove_iterator_teardown_stall() -> None:
    """Per-device datasets of multi-device iterators built from now on in
    this process run without autotuning (idempotent)."""
    global _patched  # pylint: disable=global-statement
    if _patched:
        return
    # pylint: disable-next=import-outside-toplevel
    from tensorflow.python.data.ops import multi_device_iterator_ops as _multi_device

    create = _multi_device._create_device_dataset  # pylint: disable=protected-access

    def create_without_autotune(*args, **kwargs):
        return without_autotune(create(*args, **kwargs))

    _multi_device._create_device_dataset = create_without_autotune  # pylint: disable=protected-access
    _patched = True


def stall_removed() -> bool:
    """Whether `remove_iterator_teardown_stall` ran in this process (then
    `bench.workloads` builds its data without autotuning too)."""
    return _patched
