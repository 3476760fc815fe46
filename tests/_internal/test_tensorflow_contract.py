"""What tfdist relies on in TensorFlow's internals, each pinned here
(`tfdist._internal.tensorflow`): a TensorFlow upgrade that moves one fails
here first, naming the function to update."""

import pytest
import tensorflow as tf

from tfdist._internal.tensorflow import (checkpoint_internals, coordinator_workers,
                                       distributed_variables, privates)


@pytest.mark.parametrize("private", privates.PRIVATES, ids=lambda p: p.name)
def test_internal_is_where_tfdist_reads_it(private):
    """Each TensorFlow internal tfdist imports
    (`tfdist._internal.tensorflow.privates`), one test each: a TensorFlow
    that moved it fails here, naming it and the tfdist module to update."""
    try:
        private.find()
    except (ImportError, AttributeError) as error:
        pytest.fail(f"TensorFlow {tf.__version__} has no {private.name} (read by "
                    f"tfdist.{private.user}): {type(error).__name__}: {error}")


def test_a_moved_internal_is_reported_with_its_reader():
    moved = privates.Private("tensorflow.python.ops.collective_ops", "all_to_all_v9",
                             "_internal.collectives")
    [(private, why)] = privates.missing((moved,))
    assert private is moved and "all_to_all_v9" in why


def test_mirrored_on_puts_each_replicas_copy_on_the_device_given():
    """``distributed_variables.mirrored_on``: MirroredStrategy reads the
    devices of the variable to colocate with from its ``_devices``; a
    variable made in the block is the strategy's mirrored variable, copy r
    on device r, read by replica r and updated on its own device."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope(), distributed_variables.mirrored_on(strategy, ["/cpu:2", "/cpu:3"]):
        variable = tf.Variable([1.0, 2.0])
    assert distributed_variables.is_distributed(variable)
    copies = distributed_variables.local_copies(variable)
    assert [tf.DeviceSpec.from_string(c.device).device_index for c in copies] == [2, 3]

    @tf.function
    def step():
        def replica():
            index = distributed_variables.local_replica()
            variable.assign_add(tf.fill([2], float(index + 1)))  # (replica r: its copy)
            return tf.identity(variable.read_value()) * 0 + float(index)
        return strategy.run(replica)

    seen = strategy.experimental_local_results(step())
    assert [float(v[0]) for v in seen] == [0.0, 1.0]  # (each replica knew its index)
    assert [c.numpy().tolist() for c in copies] == [[2.0, 3.0], [3.0, 4.0]]


def test_outside_a_replica_the_local_replica_is_the_first():
    assert distributed_variables.local_replica() == 0


def test_a_checkpoints_background_writer_is_read_through_its_view(tmp_path):
    """``checkpoint_internals.AsyncWriter``: the background writer TensorFlow
    makes at the first ``enable_async`` save, its thread, its host copies,
    and ending it (a new one at the next save)."""
    variable = tf.Variable([1.0, 2.0])
    checkpoint = tf.train.Checkpoint(v=variable)
    assert checkpoint_internals.AsyncWriter.of(checkpoint) is None
    checkpoint.write(str(tmp_path / "a"), options=tf.train.CheckpointOptions(enable_async=True))
    writer = checkpoint_internals.AsyncWriter.of(checkpoint)
    assert writer is not None
    writer.sync()
    assert not writer.writing() and writer.thread() is not None and writer.thread().is_alive()
    assert len(writer.copies()) >= 1 and writer.take_error() is None
    writer.end(checkpoint)
    assert checkpoint_internals.AsyncWriter.of(checkpoint) is None
    assert tf.train.load_variable(str(tmp_path / "a"), "v/.ATTRIBUTES/VARIABLE_VALUE").tolist() \
        == [1.0, 2.0]


def test_a_checkpoint_saves_children_added_for_its_background_writer(tmp_path):
    """``checkpoint_internals.saver`` / ``add_written_children``: the saver a
    checkpoint saves through, and the constructor arguments a background
    write saves (an attribute set later is saved once added there)."""
    checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
    assert hasattr(checkpoint_internals.saver(checkpoint), "save")
    checkpoint.extra = tf.Variable(7.0)
    checkpoint_internals.add_written_children(checkpoint, {"extra": checkpoint.extra})
    path = checkpoint.write(str(tmp_path / "b"), options=tf.train.CheckpointOptions(
        enable_async=True))
    checkpoint_internals.AsyncWriter.of(checkpoint).end(checkpoint)
    assert tf.train.load_variable(path, "extra/.ATTRIBUTES/VARIABLE_VALUE") == 7.0


def test_a_datasets_variant_tensor_rebuilds_it():
    """``coordinator_workers.variant_tensor``: the tensor a dataset is
    serialised from (a parameter-server worker rebuilds it)."""
    dataset = tf.data.Dataset.range(3)
    graph = tf.raw_ops.DatasetToGraphV2(input_dataset=coordinator_workers.variant_tensor(dataset))
    rebuilt = tf.data.experimental.from_variant(tf.raw_ops.DatasetFromGraph(graph_def=graph),
                                                dataset.element_spec)
    assert [int(x) for x in rebuilt] == [0, 1, 2]
