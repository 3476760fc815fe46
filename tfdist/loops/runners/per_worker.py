"""Per-worker iterators for parameter-server training.

Under ParameterServerStrategy each worker reads its own iterator, which must
live on that worker. `ClusterCoordinator.create_per_worker_dataset` builds
the same dataset on every worker, so it can not give workers different
shards. Here each worker gets its own creation function, baked with its
index: ``make_dataset(worker, num_workers)`` runs inside it, so the dataset
is built on that worker.

Two details matter:
- A dataset made on the coordinator reaches the workers as its serialized
  graph (`rebuilder`), captured as an eager tensor, not a Python constant:
  grappler would constant-fold ``DatasetFromGraph`` of a constant into a
  variant constant, which can not be sent to a worker.
- The functions are registered as worker *resources*, so when a worker
  restarts, the coordinator runs its function again and the worker gets a
  fresh iterator over its own shard.
"""

from typing import Callable

import tensorflow as tf

MakeDataset = Callable[[int, int], tf.data.Dataset]


def rebuilder(dataset: tf.data.Dataset) -> Callable[[], tf.data.Dataset]:
    """A function that rebuilds ``dataset`` wherever it runs (on a worker)."""
    graph = tf.raw_ops.DatasetToGraphV2(
        input_dataset=dataset._variant_tensor,  # pylint: disable=protected-access
        external_state_policy=tf.data.experimental.ExternalStatePolicy.WARN.value,
        strip_device_assignment=True,
    )
    element_spec = dataset.element_spec

    def rebuild() -> tf.data.Dataset:
        return tf.data.experimental.from_variant(
            tf.raw_ops.DatasetFromGraph(graph_def=graph), element_spec
        )

    return rebuild


class PerWorkerIterators:
    """Makes ``PerWorkerValues`` of fresh iterators, worker ``i`` reading
    ``make_dataset(i, num_workers)``; pass them to ``schedule``.

    The per-worker functions are traced once, here; each call only creates
    new iterators on the workers (as ``iter()`` of a
    ``create_per_worker_dataset`` does), so a ``fit`` per epoch does not pay
    the tracing again.
    """

    def __init__(self, coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator,
                 make_dataset: MakeDataset):
        # Worker.create_resource is the one way to create a resource on one
        # worker only (ClusterCoordinator has no public per-worker variant).
        workers = coordinator._cluster.workers  # pylint: disable=protected-access
        num_workers = len(workers)
        self._functions = []
        for worker in workers:

            def make_iterator(index=worker.worker_index):
                return iter(make_dataset(index, num_workers))

            self._functions.append(
                (worker, tf.function(make_iterator).get_concrete_function()))

    def __call__(self):
        remote_iterators = []
        for worker, function in self._functions:
            remote = worker.create_resource(function)
            # Lets functions that take this iterator be traced on the coordinator.
            remote._type_spec = function.structured_outputs._type_spec  # pylint: disable=protected-access
            remote_iterators.append(remote)
        return tf.distribute.experimental.coordinator.PerWorkerValues(tuple(remote_iterators))

