"""How a fully sharded weight is read inside a replica of a step
(`tfdist.communication.FullySharded`): gathered whole, an all-gather of
its slices whose gradient is the reduce-scatter of the whole weight's
gradient (`whole_reader`), or, for an embedding table kept in slices of
whole rows, by the rows a lookup asks for, where they live (`rows_reader`,
`tfdist.communication.table_lookups`).

Each function takes the ``FullySharded`` object it reads for, as
`tfdist.communication.step_gathers` does.
"""

# pylint: disable=protected-access
import tensorflow as tf

from tfdist._internal import collectives, step_graph
from tfdist._internal.keras import layer_units
from tfdist._internal.tensorflow import placed_gradients
from tfdist.communication import compression, gather_units, table_lookups


def whole_reader(sharding, layout, index: int, storage):
    """A function reading weight ``index`` (of ``layout``, the sharding's
    `tfdist.communication.shard_layout.ShardLayout`) whole inside a replica of a
    step (None elsewhere): an all-gather of its slices, whose gradient
    is the reduce-scatter of the whole weight's gradient. A pass gathers
    each weight once however often it reads it (a unit's pass: its own
    gathers, after what its scope says)."""
    strategy = sharding._strategy

    def read_in_replica():
        replica = sharding._replica_index(strategy)
        if replica is None:
            return None
        context = tf.distribute.get_replica_context()
        if tf.executing_eagerly():
            return gather(sharding, layout, index, storage, context, replica)
        # (Read in a loop the step builds, an RNN's: gathered once, before it.)
        graph = step_graph.of_this_replica()
        unit = gather_units.current_scope()  # (a layer's pass: its own gathers, in order)
        if unit is not None:
            gathered, after = unit.gathered, unit.after
        else:
            gathered, after = sharding._gathered.setdefault(graph, {}), []
        step = sharding._step_weights.get(graph, {}).get(replica)
        if step is not None:  # (a pipelined training step: gathered for it)
            step.check_read(index)
        if layer_units.weight_reads_separate():  # (a part with its own gradient)
            with graph.as_default(), tf.control_dependencies(after):
                return gather(sharding, layout, index, storage, context, replica)
        if (replica, index) not in gathered:
            with graph.as_default(), tf.control_dependencies(after):
                gathered[(replica, index)] = gather(sharding, layout, index, storage, context,
                                                    replica)
        if step is not None:  # (read inside a split layer's form: an input of it)
            return placed_gradients.capture(gathered[(replica, index)])
        return gathered[(replica, index)]

    return read_in_replica


def gather(sharding, layout, index: int, storage, context, replica: int):
    """Weight ``index`` whole, in replica ``replica``'s step: an
    all-gather of its slices, whose gradient is the reduce-scatter of the
    whole weight's gradient."""
    launcher = sharding._launcher(index, replica)
    local = tf.convert_to_tensor(storage)  # this replica's slice (read on the tape)

    @tf.custom_gradient
    def gathered(local_slice):
        slices = (context.all_gather(local_slice, axis=0) if launcher is None
                  else collectives.all_gather_rows(launcher, local_slice))

        def reduce_scatter(upstream):
            return sharding._reduce_scatter(index, upstream, context, replica, launcher)

        return layout.whole(index, slices), reduce_scatter

    return gathered(local)


def rows_reader(sharding, layout, index: int, storage):
    """The lookup of table ``index``'s rows where they live
    (`tfdist.communication.table_lookups`), or None for a weight whose
    slices are not whole rows."""
    if index not in layout.by_rows:
        return None
    rows, width = layout.shapes[index]
    return table_lookups.rows_reader(
        storage, rows=rows, slice_rows=layout.slice_rows(index), width=width,
        site=lambda: (sharding._replica_step_being_traced() or (None, None))[1],
        launcher=lambda replica: sharding._launcher(index, replica),
        compression=lambda: sharding._optimizer is not None and compression.attached_to(
            sharding._optimizer) or None)
