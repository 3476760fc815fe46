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

from typing import Callable, List, Optional

import tensorflow as tf

from tfdist._internal.tensorflow import coordinator_workers
from tfdist.data import distributed

MakeDataset = Callable[[int, int], tf.data.Dataset]


def rebuilder(dataset: tf.data.Dataset) -> Callable[[], tf.data.Dataset]:
    """A function that rebuilds ``dataset`` wherever it runs (on a worker)."""
    graph = tf.raw_ops.DatasetToGraphV2(
        input_dataset=coordinator_workers.variant_tensor(dataset),
        external_state_policy=tf.data.experimental.ExternalStatePolicy.WARN.value,
        strip_device_assignment=True,
    )
    element_spec = dataset.element_spec

    def rebuild() -> tf.data.Dataset:
        return tf.data.experimental.from_variant(
            tf.raw_ops.DatasetFromGraph(graph_def=graph), element_spec
        )

    return rebuild


def worker_dataset_maker(source, *, replicas: int, epoch: int = 0, skip_steps: int = 0,
                         partial_batch: str = "exact",
                         global_batch_size: Optional[int] = None) -> MakeDataset:
    """``make_dataset(worker, num_workers)``: one worker's endless stream of
    `tfdist.Batch` structures from ``source`` (a `tfdist.data.epochs.Source`),
    after the ``skip_steps`` batches already trained on.

    A dataset of global batches is rebuilt on the worker (`rebuilder`) and
    dealt out batch by batch (`tfdist.data.worker_stream`); a
    ``dataset_fn(input_context)`` is called with an InputContext naming
    the worker, so it can shard, and skips its share of ``skip_steps``.
    ``replicas`` is the strategy's ``num_replicas_in_sync`` (one per
    worker under parameter-server training: each batch is one step's)."""
    if not source.per_replica:
        rebuild = rebuilder(source.global_batches(epoch))

        def make_dataset(worker, num_workers):
            return distributed.worker_stream(
                rebuild(), worker, num_workers, skip_steps=skip_steps,
                partial_batch=partial_batch, global_batch_size=global_batch_size)
    else:
        def make_dataset(worker, num_workers):
            context = tf.distribute.InputContext(
                num_input_pipelines=num_workers, input_pipeline_id=worker,
                num_replicas_in_sync=replicas)
            dataset = source.call_dataset_fn(context).repeat().skip(skip_steps // num_workers)
            return distributed.apply_partial_batch_policy(
                dataset, partial_batch, global_batch_size, add_global_count=True,
            ).prefetch(tf.data.AUTOTUNE)
    return make_dataset


def shard_dataset_makers(source, *, num_shards: int, replicas: int) -> List[Callable]:
    """One ``make_dataset()`` per shard of a finite (evaluation) ``source``,
    each to be called inside a closure, so on the worker that runs it:
    shard ``i`` of a global-batch dataset is its batches ``i, i +
    num_shards, ...``; a ``dataset_fn`` gets an InputContext naming shard
    ``i`` of ``num_shards``."""
    rebuild = None if source.per_replica else rebuilder(source.global_batches(0))

    def maker(shard):
        def make_dataset():
            if rebuild is not None:
                dataset = rebuild().shard(num_shards, shard)
            else:
                dataset = source.call_dataset_fn(tf.distribute.InputContext(
                    num_input_pipelines=num_shards, input_pipeline_id=shard,
                    num_replicas_in_sync=replicas))
            return distributed.apply_partial_batch_policy(
                dataset, "exact", add_global_count=True)

        return make_dataset

    return [maker(shard) for shard in range(num_shards)]


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
        workers = coordinator_workers.workers(coordinator)
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
            coordinator_workers.give_type_spec(remote, function)
            remote_iterators.append(remote)
        return tf.distribute.experimental.coordinator.PerWorkerValues(tuple(remote_iterators))

