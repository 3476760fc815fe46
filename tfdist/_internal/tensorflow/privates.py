"""Every TensorFlow internal that tfdist reads by name (a module under
``tensorflow.python`` / ``tensorflow.core`` / ``tensorflow.compiler``, and
what it takes from it), with the tfdist module that reads it.

TensorFlow's public API has no name for these (a collective launcher, the
checkpoint's object graph, the coordination service's configuration,
device filters...). `tests/_internal/test_tensorflow_contract.py` checks
each one, one test per entry, so a TensorFlow upgrade that moves one fails
there first, naming it and the module to update; `tests/test_architecture.py`
fails on an import of a TensorFlow internal that is not listed here.
`ATTRIBUTES` names the private attributes of TensorFlow objects that the
modules of this package read behind named functions; the architecture test
fails on a module outside `tfdist/_internal/` that imports a TensorFlow
internal or reaches one of those attributes.

>>> from tfdist._internal.tensorflow import privates
>>> privates.missing()
[]
"""

import dataclasses
from typing import List, Tuple

from tfdist._internal import named_internals

__all__ = ["ATTRIBUTES", "PRIVATES", "Private", "missing"]


@dataclasses.dataclass(frozen=True)
class Private:
    """``attribute`` (dotted, may be empty: the module itself) of TensorFlow
    module ``module``, read by tfdist module ``user``."""

    module: str
    attribute: str
    user: str

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attribute}" if self.attribute else self.module

    def find(self):
        """The object, or raises ImportError / AttributeError."""
        return named_internals.found(self.module, self.attribute)


_DISTRIBUTE = "tensorflow.python.distribute"

PRIVATES: Tuple[Private, ...] = (
    Private(_DISTRIBUTE + ".collective_all_reduce_strategy",
            "CollectiveAllReduceExtended._initialize_local_devices",
            "_internal.tensorflow.multi_worker_devices"),
    Private(_DISTRIBUTE + ".sharded_variable", "ShardedVariable",
            "_internal.tensorflow.sharded_variables"),
    Private(_DISTRIBUTE + ".cross_device_utils", "CollectiveReplicaLauncher",
            "_internal.collectives, _internal.collective_shapes, _internal.row_exchange"),
    Private(_DISTRIBUTE + ".multi_worker_util", "coordination_leader",
            "_internal.tensorflow.coordination"),
    Private("tensorflow.python.ops.collective_ops", "all_to_all_v2",
            "_internal.collectives, _internal.row_exchange"),
    Private("tensorflow.python.ops.collective_ops", "all_gather_v2",
            "_internal.collectives, _internal.collective_shapes"),
    Private("tensorflow.python.ops.collective_ops", "all_reduce_v2",
            "_internal.collective_shapes"),
    Private("tensorflow.python.training.server_lib", "ClusterDeviceFilters",
            "_internal.tensorflow.cluster_views"),
    Private("tensorflow.python.trackable.base", "Trackable", "_internal.host_copies"),
    Private("tensorflow.python.trackable.data_structures", "ListWrapper",
            "_internal.tensorflow.trackable_lists"),
    Private("tensorflow.python.trackable.trackable_utils", "checkpoint_key",
            "_internal.checkpoint_keys"),
    Private("tensorflow.python.trackable.trackable_utils", "object_path_to_string",
            "_internal.checkpoint_keys"),
    Private("tensorflow.python.checkpoint.graph_view", "ObjectGraphView",
            "_internal.checkpoint_keys"),
    Private("tensorflow.python.eager.context", "context",
            "_internal.tensorflow.coordination, _internal.runtime_start"),
    Private("tensorflow.python.eager.context", "Context.configure_coordination_service",
            "_internal.tensorflow.coordination"),
    Private("tensorflow.python.eager.context", "Context.coordination_service",
            "_internal.tensorflow.coordination"),
    Private("tensorflow.python.eager.record", "VariableWatcher",
            "_internal.tensorflow.placed_gradients"),
    Private("tensorflow.python.eager.record", "record_operation",
            "_internal.tensorflow.placed_gradients"),
    Private("tensorflow.python.eager.record", "stop_recording",
            "_internal.tensorflow.placed_gradients"),
    Private("tensorflow.core.framework.attr_value_pb2", "AttrValue", "_internal.graph_order"),
    Private("tensorflow.compiler.xla.tsl.protobuf.coordination_config_pb2", "CoordinatedJob",
            "_internal.tensorflow.coordination"),
)


# Private attributes of TensorFlow objects that tfdist reads or sets, by the
# module of this package that does (instance attributes, which no import
# can check: the tests each module names pin them by behaviour). Outside
# `tfdist/_internal/` no module reaches them (`tests/test_architecture.py`).
ATTRIBUTES = {
    "_initialize_local_devices": "multi_worker_devices",
    "_update": "sharded_variables", "_select_single_value": "sharded_variables",
    "_local_results": "sharded_variables",
    "_cluster": "coordinator_workers", "_type_spec": "coordinator_workers",
    "_variant_tensor": "coordinator_workers",
    "_saver": "checkpoint_internals", "_kwargs": "checkpoint_internals",
    "_async_checkpointer_impl": "checkpoint_internals", "_async_error": "checkpoint_internals",
    "_async_save_thread": "checkpoint_internals", "_object_map": "checkpoint_internals",
    "_join_async_save_thread": "checkpoint_internals", "_queue": "checkpoint_internals",
}

def missing(privates=PRIVATES) -> List[Tuple[Private, str]]:
    """``[(private, why), ...]`` for each internal not where tfdist reads it."""
    return named_internals.missing(privates)


def modules() -> List[str]:
    """The TensorFlow internal modules listed (what tfdist may import)."""
    return sorted({private.module for private in PRIVATES})
