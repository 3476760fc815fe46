"""What tfdist reads of a ParameterServerStrategy ``ClusterCoordinator``
and of a dataset that TensorFlow's public API does not name: the
coordinator's workers (the one way to make a resource on one worker only:
``Worker.create_resource``), a remote resource's type spec (so functions
taking it trace on the coordinator), and a dataset's variant tensor (to
serialise it and rebuild it on a worker). Used by the parameter-server
runners (`tfdist.loops.runners.per_worker`, `tfdist.loops.parameter_server_loop`).

Pinned by the parameter-server tests that run these runners on real ps and
worker tasks (`tests/scenarios/test_parameter_server.py`); TensorFlow
keeps them as instance attributes, which no import can check.
"""

import tensorflow as tf


def workers(coordinator) -> list:
    """The coordinator's worker objects, in task order (each has
    ``worker_index`` and ``create_resource``)."""
    return list(coordinator._cluster.workers)  # pylint: disable=protected-access


def give_type_spec(remote, traced_function) -> None:
    """Gives ``remote`` (a remote resource a worker made by
    ``traced_function``, a concrete function) its outputs' type spec."""
    remote._type_spec = traced_function.structured_outputs._type_spec  # pylint: disable=protected-access


def variant_tensor(dataset: tf.data.Dataset) -> tf.Tensor:
    """The variant tensor that holds ``dataset`` (``DatasetToGraphV2``'s input)."""
    return dataset._variant_tensor  # pylint: disable=protected-access
