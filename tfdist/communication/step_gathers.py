"""Fully sharded weights within a pipeline's stages: one gather per weight
and step, one reduce-scatter of its summed gradient
(`tfdist.communication.FullySharded` with `tfdist.parallel.Pipeline`).

Per layer resharding (`tfdist.communication.gather_units`) gathers a
weight in each pass that reads it; a pipeline runs every layer once per
micro-batch, so it would gather each weight m times and reduce-scatter m
gradients. Inside a pipeline the step instead gathers each weight once,
whole on its stage's device (``FullySharded._gathered_for_step``, which
returns a `StepWeights`); each layer's stage pass reads the gathered
tensors of its own weights, takes them as inputs of its custom gradient
(`tfdist._internal.keras.layer_units.run_as_unit`'s ``extra``) and gives
them their gradients; the micro-batches' gradients are summed on the
stage's device and `StepWeights.scattered` reduce-scatters each sum once
into the replica's slice, as PyTorch's FSDP does inside a pipeline's
schedule (gradients reduced on the last micro-batch).
"""

import contextlib

import tensorflow as tf

from tfdist._internal import collectives, step_graph
from tfdist._internal.keras import sliced_weights
from tfdist._internal.tensorflow import distributed_variables
from tfdist._internal.thread_values import ThreadValue
from tfdist.errors import ConfigurationError

_READER = ThreadValue()  # (layer, its weights' indices) within `StepWeights.read_by`


class StepWeights:
    """A pipelined step's gathered weights (`FullySharded._gathered_for_step`):
    ``tensors`` in the model's order; `of_layer` the ones a layer owns,
    `read_by` the block where only those may be read (a layer's stage pass:
    its gradient reaches what it was given), `scattered` the step's whole
    gradients turned into this replica's slices."""

    def __init__(self, tensors, variables, sharding, context, replica: int, launcher):
        self.tensors = list(tensors)
        self._index = {id(v): index for index, v in enumerate(variables)}
        self._names = [v.path for v in variables]
        self._sharding = sharding
        self._context, self._replica, self._launcher = context, replica, launcher

    def _owned_by(self, layer) -> list:
        """The indices of ``layer``'s trainable weights among the gathered
        (a weight split over the model axis: its shards)."""
        return [self._index[id(w)] for w in self._sharding._weights_of(layer)  # pylint: disable=protected-access
                if id(w) in self._index]

    def of_layer(self, layer) -> list:
        """The gathered tensors of ``layer``'s trainable weights."""
        return [self.tensors[index] for index in self._owned_by(layer)]

    def by_weight_id(self) -> dict:
        """The gathered tensors by ``id`` of their Keras weight."""
        return {key: self.tensors[index] for key, index in self._index.items()}

    @contextlib.contextmanager
    def read_by(self, layer):
        """Within the block (``layer``'s pass), reading a sharded weight
        ``layer`` does not own is an error naming both: its gradient would
        not reach it."""
        with _READER.set_to((layer, set(self._owned_by(layer)))):
            yield

    def check_read(self, index: int) -> None:
        reader = _READER.get()
        if reader is not None and index not in reader[1]:
            raise ConfigurationError(
                f"FullySharded with a pipeline: layer {reader[0].name!r} reads weight "
                f"{self._names[index]!r}, which another layer owns; each stage's layers read "
                "their own weights once gathered for the step (a weight shared across "
                "layers is not built yet). Drop FullySharded or the Pipeline for this model.")

    def scattered(self, gradients) -> list:
        """Each weight's gradient (whole, summed over the micro-batches, on
        its device) reduce-scattered once into this replica's slice there."""
        sliced = []
        for index, (gradient, whole) in enumerate(zip(gradients, self.tensors)):
            if gradient is None:
                sliced.append(None)
                continue
            with tf.device(whole.device), tf.name_scope("scattered_for_step"):
                sliced.append(self._sharding._reduce_scatter(  # pylint: disable=protected-access
                    index, gradient, self._context, self._replica, self._launcher))
        return sliced


def gathered_for_step(sharding, variables, layout) -> StepWeights:
    """Inside a replica of a pipelined step (traced): each of ``variables``
    (the model's trainable weights, in order), sharded by ``sharding`` (a
    `tfdist.communication.FullySharded`, in ``layout``: its
    `tfdist.communication.shard_layout.ShardLayout`), gathered whole on its own device,
    with no gradient of its own; every read of a weight in this step's
    graph reads it. The micro-batches' gradients are taken with respect to
    ``StepWeights.tensors``."""
    # pylint: disable=protected-access
    context = tf.distribute.get_replica_context()
    replica = sharding._replica_index(sharding._strategy)
    launcher = collectives.replica_launcher(sharding._strategy, replica)
    graph = step_graph.of_this_replica()
    gathered = sharding._gathered.setdefault(graph, {})
    tensors = []
    local_replica = distributed_variables.local_replica()
    for index, variable in enumerate(variables):
        storage = sliced_weights.storage(variable)
        local = tf.convert_to_tensor(storage)
        device = distributed_variables.local_copies(storage)[local_replica].device
        with tf.device(device), tf.name_scope("gathered_for_step"):
            slices = (context.all_gather(local, axis=0) if launcher is None
                      else collectives.all_gather_rows(launcher, local))
            whole = layout.whole(index, slices)
        gathered[(replica, index)] = whole
        tensors.append(whole)
    steps = sharding._step_weights.setdefault(graph, {})
    steps[replica] = StepWeights(tensors, variables, sharding, context, replica, launcher)
    return steps[replica]
