"""The storage of fully sharded weights (`tfdist.communication.FullySharded`):
each weight's whole copy per replica replaced by one slice per replica,
and gradient accumulation's sums kept in slices too.

A weight's slices are one distributed ``tf.Variable`` of the slice's
length (`tfdist.communication.shard_layout.ShardLayout`), made on the
devices the weight's copies were on (a replica's device; a pipeline
stage's; a tensor-parallel shard's model device), and the Keras variable
reads and writes them whole (`tfdist._internal.keras.sliced_weights`):
inside a replica of a step through the sharding's gather, anywhere else
from every replica's slice (`tfdist.communication.sharded_checkpoints.Shards`).
"""

import types
from typing import Callable, List

import tensorflow as tf

from tfdist._internal.keras import sliced_weights
from tfdist._internal.tensorflow import distributed_variables
from tfdist.communication import sharded_checkpoints
from tfdist.communication.shard_layout import ShardLayout
from tfdist.errors import ConfigurationError
from tfdist.replica import accumulation


def check_one_dtype(what, variables) -> None:
    """Slices of one flat layout hold one dtype: refused otherwise, naming ``what``."""
    if len({v.dtype for v in variables}) > 1:
        raise ConfigurationError(
            f"{what!r} shards weights of one dtype; this model's trainable weights are "
            f"{sorted({str(v.dtype) for v in variables})}. Drop it for this model.")


def store_in_slices(strategy, layout: ShardLayout, variables, gatherer: Callable,
                    replica_index: Callable,
                    rows_reader: Callable = lambda index, storage: None) -> List[List[str]]:
    """Keeps each of ``variables`` (Keras variables, in ``layout``'s order)
    as one slice per replica of ``strategy``, its value kept.
    ``gatherer(index, storage)``: the read of weight ``index`` whole inside
    a replica of a step (None elsewhere); ``replica_index()``: the replica
    running here, or None (a write inside a step keeps only its own slice);
    ``rows_reader(index, storage)``: a table's lookup of its rows where
    they live (`SlicedReads.rows_in_replica`), or None.
    Returns each weight's slices' local devices, in replica order."""
    slices = sharded_checkpoints.Shards(strategy, layout)
    devices = []
    for index, variable in enumerate(variables):
        whole = variable.numpy()
        old = sliced_weights.storage(variable)
        with strategy.scope(), distributed_variables.on_devices_of(strategy, old):
            storage = tf.Variable(tf.zeros([layout.slice_sizes[index]], variable.dtype),
                                  trainable=True, name=old.name.split(":")[0])
        # (`Shards` reads a state variable's storage from its ``value``)
        held = types.SimpleNamespace(value=storage, dtype=storage.dtype)
        reads = sliced_weights.SlicedReads(
            read_in_replica=gatherer(index, storage),
            whole=lambda held=held, index=index: slices.whole(held, index),
            assign_whole=lambda value, held=held, index=index: slices.assign_whole(
                held, index, value, replica=replica_index()),
            worker_pieces=lambda held=held, index=index: slices.worker_pieces(held, index),
            rows_in_replica=rows_reader(index, storage))
        reads.assign_whole(whole)
        sliced_weights.store_in_slices(variable, storage, reads)
        devices.append([copy.device for copy in distributed_variables.local_copies(storage)])
    return devices


def accumulation_sums(what, strategy, layout: ShardLayout, variables) -> accumulation.SumStorage:
    """Gradient accumulation's sums (`tfdist.replica.accumulation`): one
    variable of each weight's slice length per replica, beside the weight's
    slices, saved whole (the slices put together, as the optimizer's state
    is saved)."""
    variables = list(variables)
    if [tuple(v.shape) for v in variables] != list(layout.shapes):
        raise ConfigurationError(
            f"{what!r}: gradient accumulation was asked for other weights than the "
            "model's trainable weights it sharded. Accumulate the model's own weights.")
    shards = sharded_checkpoints.Shards(strategy, layout)
    sums = []
    for variable, length in zip(variables, layout.slice_sizes):
        # (beside the weight's slices: a stage's, a tensor-parallel shard's devices)
        with strategy.scope(), distributed_variables.on_devices_of(
                strategy, sliced_weights.storage(variable)):
            sums.append(tf.Variable(tf.zeros([length], variable.dtype), trainable=False,
                                    synchronization=tf.VariableSynchronization.ON_READ,
                                    aggregation=tf.VariableAggregation.NONE,
                                    name="gradient_sum_slice"))
    # (`Shards` reads a state variable's storage from its ``value``)
    held = [types.SimpleNamespace(value=total, dtype=total.dtype) for total in sums]
    return accumulation.SumStorage(
        sums=sums, saved=[sharded_checkpoints.WholeSlot(shards, total, index)
                          for index, total in enumerate(held)])
