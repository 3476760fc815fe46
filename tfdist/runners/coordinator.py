"""Parameter-server dispatch: ``ClusterCoordinator.schedule`` / ``join``.

Each execution (``steps_per_execution`` steps) is a closure scheduled on
whichever worker is free, reading that worker's own dataset: a global-batch
dataset is sharded by batch across workers (worker ``i`` of ``n`` gets
batches ``i, i+n, ...``) and repeated, so workers do not read the same
examples and ``steps_per_epoch`` bounds an epoch. Scheduling is
asynchronous; `sync` joins all closures and runs before metrics are read or
a checkpoint is written (log points, epoch ends). A worker that dies has its
closures retried on the others by the coordinator.

Evaluation runs inline on the coordinator over the whole dataset, in order,
so every evaluation example counts exactly once.
"""

from typing import Callable

import tensorflow as tf

from tfdist import data as data_lib
from tfdist.errors import ConfigurationError


class CoordinatorRunner:
    """Schedules replica steps on parameter-server workers."""

    needs_steps_per_epoch = True

    def __init__(self, strategy, train_step: Callable, eval_step: Callable, *,
                 shard_policy: str = "auto"):
        del shard_policy  # Per-worker datasets are sharded by batch here.
        self._strategy = strategy
        self._coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        self._train_execution = self._make_execution(train_step)
        self._eval_loop = self._make_inline_loop(eval_step)
        self._iterators = {}

    def _make_execution(self, replica_step):
        strategy = self._strategy

        @tf.function
        def execution(iterator, num_steps):
            for _ in tf.range(num_steps):
                strategy.run(replica_step, args=(next(iterator),))

        return execution

    @staticmethod
    def _make_inline_loop(replica_step):
        @tf.function
        def loop(iterator):
            for batch in iterator:
                replica_step(batch)

        return loop

    def iterator(self, data, *, epoch, skip_steps, partial_batch, global_batch_size=None):
        """A per-worker iterator over ``data``, kept across epochs."""
        if isinstance(data, data_lib.EpochDataset):
            data = data.make_dataset(0)
        if not isinstance(data, tf.data.Dataset):
            raise ConfigurationError(
                "Parameter-server training takes a tf.data.Dataset of global "
                f"batches; got {type(data).__name__}."
            )
        key = (data, partial_batch)
        if key not in self._iterators:
            data_lib.validate_element_spec(data.element_spec)
            # A dataset made here can not be shipped to a worker as a tensor;
            # its graph can, and each worker rebuilds it (as TensorFlow does
            # for datasets passed to create_per_worker_dataset).
            graph = data._as_serialized_graph(  # pylint: disable=protected-access
                external_state_policy=tf.data.experimental.ExternalStatePolicy.WARN
            ).numpy()
            spec = data.element_spec

            def dataset_fn(input_context):
                rebuilt = tf.data.experimental.from_variant(
                    tf.raw_ops.DatasetFromGraph(graph_def=graph), spec
                )
                shard = rebuilt.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
                return data_lib.apply_partial_batch_policy(
                    shard, partial_batch, global_batch_size, add_global_count=True
                ).repeat().prefetch(tf.data.AUTOTUNE)

            # Through distribute_datasets_from_function, each worker's call
            # gets an InputContext naming that worker.
            per_worker = self._coordinator.create_per_worker_dataset(
                self._strategy.distribute_datasets_from_function(dataset_fn)
            )
            self._iterators[key] = iter(per_worker)
        return self._iterators[key]

    def train(self, iterator, num_steps: int) -> int:
        """Schedules ``num_steps`` steps on a free worker; does not wait."""
        self._coordinator.schedule(
            self._train_execution, args=(iterator, tf.constant(num_steps, tf.int64))
        )
        return num_steps

    def sync(self) -> None:
        """Waits for every scheduled closure (raises a worker's error)."""
        self._coordinator.join()

    def evaluate(self, data, *, steps, partial_batch, global_batch_size=None) -> None:
        """Runs the evaluation step over ``data`` inline, on the coordinator."""
        if isinstance(data, data_lib.EpochDataset):
            data = data.make_dataset(0)
        dataset = data_lib.apply_partial_batch_policy(
            data if steps is None else data.take(steps), partial_batch,
            global_batch_size, add_global_count=True,
        )
        self._eval_loop(iter(dataset))
