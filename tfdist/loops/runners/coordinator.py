"""Parameter-server dispatch: ``ClusterCoordinator.schedule`` / ``join``.

Each execution (``steps_per_execution`` steps) is a closure scheduled on
whichever worker is free, reading that worker's own iterator
(`tfdist.loops.runners.per_worker`), built on the worker: a dataset made on the
coordinator is repeated and dealt out by batch (worker ``i`` of ``n`` gets
batches ``i, i+n, ...``: `tfdist.data.worker_stream`), a
``dataset_fn(input_context)`` is called once per worker with that worker's
pipeline id. The streams are endless, so ``steps_per_epoch`` bounds an
epoch. Step outputs are never fetched. Scheduling is
asynchronous; `sync` joins all closures and runs before metrics are read or
a checkpoint is written (log points, epoch ends). A worker that dies has its
closures retried on the others by the coordinator.

With ``data_service`` the global batches are made on the tf.data service
instead: one job per epoch, shared by the workers with dynamic sharding
(`tfdist.data.service.shared_epoch_job`), so each example is visited at
most once per epoch. Such an epoch ends after ``steps_per_epoch`` steps or
with its pass over the data, whichever comes first: a step scheduled after
the pass finds no batch and does nothing (the optimizer does not count
it), and `sync` warns how many did so.

Evaluation runs inline on the coordinator over the whole dataset, in order,
so every evaluation example counts exactly once.
"""

import itertools
import uuid
import warnings
from typing import Callable, Optional

import tensorflow as tf

from tfdist import data as data_lib
from tfdist._internal.bounded_cache import BoundedCache
from tfdist.data import service
from tfdist.cluster import peers
from tfdist.errors import ConfigurationError
from tfdist.loops.cadence import ExecutionPlan
from tfdist.loops.runners.base import Execution, ignore_steps, run_each
from tfdist.loops.runners.per_worker import PerWorkerIterators, worker_dataset_maker
from tfdist.strategies import atomic_updates


class CoordinatorRunner:
    """Schedules replica steps on parameter-server workers (a
    `tfdist.loops.runners.base.Runner`).

    It takes no shard policy (workers deal out batches, or a dataset_fn
    shards), runs nothing after a step (no gradient accumulation:
    `tfdist.replica.accumulation`) and never pads (a worker's replica has
    its whole batch).
    """

    def __init__(self, strategy, train_step: Callable, eval_step: Callable, *,
                 data_service: Optional[str] = None):
        self._strategy = strategy
        self._coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        self._train_step = train_step
        self._service = service.resolve(data_service)
        # One job per iterator (an epoch), named for this run: the workers' readers meet in it.
        self._job_names = (f"tfdist-{uuid.uuid4().hex[:12]}-{n}" for n in itertools.count())
        if self._service:
            with strategy.scope():  # on a ps: steps that found the epoch's data used up
                self._empty_steps = tf.Variable(0, dtype=tf.int64, trainable=False)
            self._empty_steps_seen = 0
        self._train_execution = self._make_execution(train_step)
        # Full-size executions (the largest size seen: steps_per_execution)
        # take no step-count argument, as TensorFlow's own loop: scheduling
        # one costs the coordinator less (figures:
        # docs/performance.md#measurements-behind-design-choices); shorter
        # ones share one general function.
        self._full_steps, self._full_execution = 0, None
        self._step_counts = {}
        self._eval_loop = self._make_inline_loop(eval_step)
        self._iterator_makers = BoundedCache()

    def _make_execution(self, replica_step, num_steps=None):
        """``execution(iterator, num_steps)``, or with ``num_steps`` given,
        ``execution(iterator)`` that runs that many steps."""
        strategy = self._strategy

        def run_steps(iterator, steps):
            with atomic_updates.atomic():  # workers race on the ps: no lost counts
                for _ in tf.range(steps):
                    if self._service is None:
                        strategy.run(replica_step, args=(next(iterator),))
                        continue
                    batch = iterator.get_next_as_optional()  # the epoch's pass may be used up
                    if batch.has_value():
                        strategy.run(replica_step, args=(batch.get_value(),))
                    else:
                        self._empty_steps.assign_add(1)

        if num_steps is None:
            return tf.function(run_steps)
        return tf.function(lambda iterator: run_steps(iterator, num_steps))

    @staticmethod
    def _make_inline_loop(replica_step):
        @tf.function
        def loop(iterator):
            # A while loop on the optional, not ``for batch in iterator``:
            # AutoGraph runs that loop's body in a cond, whose branch graphs
            # drop the call-time captures of a parameter-server lookup table
            # (a StringLookup in the model: "You must feed a value for
            # placeholder tensor ... Lookup/Placeholder"); while bodies keep them.
            with atomic_updates.atomic():
                batch = iterator.get_next_as_optional()
                while batch.has_value():
                    replica_step(batch.get_value())
                    batch = iterator.get_next_as_optional()

        return loop

    def iterator(self, source, *, epoch, skip_steps, partial_batch, global_batch_size=None):
        """Per-worker iterators over ``source`` (`tfdist.data.epochs.Source`;
        `tfdist.data.worker_stream`), after the ``skip_steps`` batches
        already trained on.

        The dataset graph and the per-worker functions are made once per
        (data, epoch source, position, policy) and reused by later calls
        (e.g. one ``fit`` per epoch), as TensorFlow's own loop reuses its
        ``create_per_worker_dataset``: rebuilding them at every call put
        short ``fit`` calls behind that loop (figures:
        docs/performance.md#measurements-behind-design-choices). On the
        tf.data service every call makes a job of its own (a new pass), so
        nothing is reused."""
        if self._service:
            return PerWorkerIterators(self._coordinator, self._service_dataset_maker(
                source, epoch=epoch, skip_steps=skip_steps, partial_batch=partial_batch,
                global_batch_size=global_batch_size))()
        key = (source.original, epoch if source.per_epoch else None, skip_steps,
               partial_batch, global_batch_size)
        return self._iterator_makers.get(key, lambda: PerWorkerIterators(
            self._coordinator, worker_dataset_maker(
                source, replicas=self._strategy.num_replicas_in_sync, epoch=epoch,
                skip_steps=skip_steps, partial_batch=partial_batch,
                global_batch_size=global_batch_size)))()

    def _service_dataset_maker(self, source, *, epoch, skip_steps, partial_batch,
                               global_batch_size):
        """Every worker reads one new shared job: one pass (module docstring)."""
        if source.per_replica:
            raise ConfigurationError(
                "data_service takes a dataset of global batches (or an EpochDataset); "
                "a dataset_fn builds per-worker pipelines on the training workers. "
                "Pass the global-batch dataset, or data_service=None.")
        if skip_steps:
            warnings.warn(
                f"Resuming epoch {epoch + 1} after {skip_steps} steps on the tf.data "
                "service: its dynamic sharding keeps no position, so the epoch's data "
                "is read again from its start (the examples of those steps are "
                "trained on again).")
        dataset = data_lib.apply_partial_batch_policy(
            source.global_batches(epoch), partial_batch, global_batch_size,
            add_global_count=True)
        read = service.shared_epoch_job(dataset, self._service, next(self._job_names))
        return lambda worker, num_workers: read()

    def check_fit(self, steps_per_epoch: Optional[int]) -> None:
        """Workers read endless streams: ``fit`` needs ``steps_per_epoch``."""
        if steps_per_epoch is None:
            raise ConfigurationError(
                "Parameter-server training needs `steps_per_epoch`: workers read "
                "repeated shards of the data, so an epoch has no natural end."
            )

    def new_pass_each_epoch(self) -> bool:
        """True on the tf.data service: each epoch is a job of its own (one pass)."""
        return self._service is not None

    def predicts_inline(self) -> bool:
        """True: ``predict`` runs on the coordinator (`tfdist.training.predict`)."""
        return True

    def train(self, iterator, plan: ExecutionPlan, stop_requested: Callable[[], bool],
              advance: Callable[[int], None] = ignore_steps) -> Execution:
        """Schedules the plan's executions on free workers; does not wait
        (`sync` does). The coordinator alone decides to stop, so a request
        is the stop (nothing to agree on)."""
        return run_each(self._schedule, iterator, plan, stop_requested, advance)

    def _schedule(self, iterator, num_steps: int, requested: bool, last: bool):
        """Schedules one execution of ``num_steps`` steps: ``(num_steps, requested)``."""
        del last
        if num_steps >= self._full_steps:
            if num_steps > self._full_steps:
                self._full_steps = num_steps
                self._full_execution = self._make_execution(self._train_step, num_steps)
            self._coordinator.schedule(self._full_execution, args=(iterator,))
        else:
            if num_steps not in self._step_counts:
                self._step_counts[num_steps] = tf.constant(num_steps, tf.int64)
            self._coordinator.schedule(
                self._train_execution, args=(iterator, self._step_counts[num_steps]))
        return num_steps, requested

    @staticmethod
    def any_worker(flag: bool) -> bool:
        """One coordinator decides alone (metrics are read on it)."""
        return flag

    def sync(self) -> None:
        """Waits for every scheduled closure (raises a worker's error)."""
        self._coordinator.join()
        if self._service:
            empty = int(self._empty_steps.numpy())
            if empty > self._empty_steps_seen:
                warnings.warn(
                    f"{empty - self._empty_steps_seen} scheduled steps ({empty} in this run) "
                    "found the epoch's data on the tf.data service used up and did nothing "
                    "(each example is read at most once per epoch). Lower steps_per_epoch "
                    "to the number of batches an epoch has.")
                self._empty_steps_seen = empty

    @staticmethod
    def explain_failures(checkpoint_dir=None):
        """A lost ps raises `ParameterServerLostError` naming it."""
        return peers.explain_lost_servers(checkpoint_dir)

    def evaluate(self, source, *, steps, partial_batch, global_batch_size=None) -> None:
        """Runs the evaluation step over ``source`` inline, on the coordinator."""
        if source.per_replica:
            raise ConfigurationError(
                f"Parameter-server evaluation takes a tf.data.Dataset of global "
                f"batches or a tfdist.data.EpochDataset; the {source.what} is a "
                "dataset_fn. Pass the evaluation data as global batches."
            )
        data = source.global_batches(0)
        dataset = data_lib.apply_partial_batch_policy(
            data if steps is None else data.take(steps), partial_batch,
            global_batch_size, add_global_count=True,
        )
        self._eval_loop(iter(dataset))
