"""Hand-written parameter-server loops: ``ClusterCoordinator`` with tfdist's data.

Tested on local clusters (tests/scenarios/tutorials/test_parameter_server_tutorial.py): TensorFlow's
parameter-server tutorial adopted with it equals one device on 1 worker
and 2 ps; on 2 workers every scheduled step is applied and counted once
and the scheduled evaluation sees each example once; the example below
runs as a program on 2 workers and 1 ps.

TensorFlow's parameter-server tutorial trains with its own loop::

    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))
    for epoch in range(num_epochs):
        for _ in range(steps_per_epoch):
            coordinator.schedule(step_fn, args=(iterator,))   # step_fn: strategy.run + reduce
        coordinator.join()

Three things are left to the user there. ``create_per_worker_dataset``
builds the same dataset on every worker, so workers train on the same
batches unless each shuffles differently. ``step_fn`` must call
``strategy.run`` and reduce. And ``schedule`` gives no visitation
guarantee: a scheduled evaluation over a repeated dataset counts some
examples twice and others never (the tutorial says so, and that TensorFlow
has no exactly-once custom evaluation loop).

`ParameterServerLoop` keeps the tutorial's shape (``schedule``, ``join``,
``fetch``) and owns those three, on what TensorFlow ships:

- Training data as in `tfdist.Trainer` under parameter servers: a dataset
  of global batches made on the coordinator is rebuilt on each worker from
  its graph, repeated, and dealt by batch (worker i of n takes batches i,
  i+n, ...: `tfdist.data.worker_stream`); a ``dataset_fn(input_context)``
  is called on each worker with an ``InputContext`` naming it (it shards
  itself), and repeated. The per-worker iterators are made once, at the
  first ``schedule``, and read on across epochs, as the tutorial's.
- ``replica_step(batch)`` gets a `tfdist.Batch` carrying its batch's example
  count (`tfdist.replica.losses.replica_loss` divides by it); the loop runs
  it with ``strategy.run`` in a ``tf.function`` and returns its outputs
  summed over the worker's replicas, as a ``RemoteValue``.
- ``evaluate(dataset, eval_step)`` schedules one closure per shard of the
  evaluation data (by default one shard per worker); any free worker runs
  any shard, building its part of the data inside the closure, so every
  batch is evaluated exactly once (at least once if a worker fails during
  the evaluation: the coordinator then runs that shard again elsewhere).

Training is asynchronous, as under `tfdist.Trainer`: with one worker the
schedule is sequential and the result equals one device on the same
batches. Keras' counters on the ps (``optimizer.iterations``, metrics)
lose no updates when workers race (`tfdist.strategies.atomic_updates`).
The strategy must have one replica per worker (CPU workers, or one GPU
each). Build the optimizer under ``strategy.scope()`` before the first
``schedule`` (``optimizer.build(model.trainable_variables)``); with
variables sharded over several ps tasks take gradients with
`tfdist.strategies.sharded.gradients` (``tape.gradient`` asks a Keras
variable for its ``handle``, which a ``ShardedVariable`` does not have).

Runnable under ``tfdist-run --num_workers=2 --num_ps=1 -- python program.py``:

>>> import keras, numpy as np, tensorflow as tf, tfdist  # doctest: +SKIP
>>> strategy = tfdist.make_strategy("parameter_server")  # doctest: +SKIP
>>> with strategy.scope():  # doctest: +SKIP
...     model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
...     optimizer = keras.optimizers.SGD(0.1)
...     optimizer.build(model.trainable_variables)
...     accuracy = keras.metrics.SparseCategoricalAccuracy()
>>> loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)  # doctest: +SKIP
>>> def replica_step(batch):                   # a tfdist.Batch, on a worker  # doctest: +SKIP
...     with tf.GradientTape() as tape:
...         logits = model(batch.x, training=True)
...         loss = tfdist.replica.losses.replica_loss(loss_fn(batch.y, logits), batch, model)
...     gradients = tfdist.strategies.sharded.gradients(tape, loss, model.trainable_variables)
...     optimizer.apply_gradients(zip(gradients, model.trainable_variables))
...     return loss
>>> def eval_step(batch):  # doctest: +SKIP
...     accuracy.update_state(batch.y, model(batch.x, training=False))
>>> x = np.random.RandomState(0).randn(1000, 8).astype("float32")  # doctest: +SKIP
>>> y = (x[:, 0] > 0).astype("int64")  # doctest: +SKIP
>>> train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1000, seed=1).batch(64)  # doctest: +SKIP
>>> loop = tfdist.loops.parameter_server_loop.ParameterServerLoop(strategy, train, replica_step)  # doctest: +SKIP
>>> for epoch in range(3):  # doctest: +SKIP
...     for _ in range(16):
...         loss = loop.schedule()
...     loop.join()
...     accuracy.reset_state()
...     loop.evaluate(tf.data.Dataset.from_tensor_slices((x, y)).batch(100), eval_step)
...     print(epoch, float(loss.fetch()), float(accuracy.result()))
"""

from typing import Callable

import tensorflow as tf

from tfdist._internal import validation
from tfdist._internal.bounded_cache import BoundedCache
from tfdist._internal.tensorflow import coordinator_workers
from tfdist.cluster import peers
from tfdist.data import epochs
from tfdist.data.batch import Batch
from tfdist.errors import ConfigurationError
from tfdist.loops.runners.per_worker import (
    PerWorkerIterators, shard_dataset_makers, worker_dataset_maker)
from tfdist.strategies import atomic_updates


def _source(data, what: str) -> epochs.Source:
    source = epochs.as_source(data, what)
    if source.per_epoch:
        raise ConfigurationError(
            f"ParameterServerLoop reads one stream of batches; the {what} is a "
            "tfdist.data.EpochDataset. Pass a tf.data.Dataset of global batches or a "
            "dataset_fn(input_context).")
    return source


def _as_batch_step(step: Callable, name: str) -> Callable:
    if not callable(step):
        raise ConfigurationError(
            f"`{name}` ({step!r}) must be a function of one `tfdist.Batch`, run on "
            "a worker.")

    # Not converted by autograph, as in `tfdist.loops.host_loop.HostLoop`.
    @tf.autograph.experimental.do_not_convert
    def run(structure):
        with atomic_updates.atomic():  # workers race on the ps: no lost counts
            return step(Batch.from_structure(structure))

    return run


class ParameterServerLoop:
    """Schedules ``replica_step`` on parameter-server workers (module doc).

    Args:
      strategy: a ParameterServerStrategy (`tfdist.make_strategy("parameter_server")`).
      dataset: a `tf.data.Dataset` of global batches ``(x, y[, sample_weight])``
        made on the coordinator, or a ``dataset_fn(input_context)`` that
        builds (and shards) one worker's batches on that worker. Read as an
        endless stream: count steps, not passes.
      replica_step: ``replica_step(batch)`` with a `tfdist.Batch`; what it
        returns comes back from `schedule`, summed over the worker's replicas.
      steps_per_execution: steps per scheduled closure.
    """

    def __init__(self, strategy: tf.distribute.Strategy, dataset, replica_step: Callable, *,
                 steps_per_execution: int = 1):
        validation.positive_int("steps_per_execution", steps_per_execution)
        step = _as_batch_step(replica_step, "replica_step")
        source = _source(dataset, "dataset")
        if not isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
            raise ConfigurationError(
                f"`strategy` ({type(strategy).__name__}) must be a ParameterServerStrategy "
                "(tfdist.make_strategy('parameter_server')); for synchronous strategies "
                "use tfdist.loops.host_loop.HostLoop.")
        if strategy.num_replicas_in_sync != 1:
            raise ConfigurationError(
                f"ParameterServerLoop runs one replica per worker; the strategy has "
                f"{strategy.num_replicas_in_sync}. Give each worker one device "
                "(CUDA_VISIBLE_DEVICES) or use CPU workers.")
        self._strategy = strategy
        # One coordinator per strategy: TensorFlow returns the existing one.
        self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        self._make_dataset = worker_dataset_maker(source, replicas=1)
        self._iterators = None
        self._execution = self._make_execution(step, steps_per_execution)
        self._evaluations = BoundedCache()  # (dataset, eval_step, num_shards) -> shard functions

    def _make_execution(self, step: Callable, steps: int):
        strategy = self._strategy

        def summed(value):
            return strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)

        @tf.function
        def execution(iterator):
            if steps > 1:
                for _ in tf.range(steps - 1):
                    strategy.run(step, args=(next(iterator),))
            outputs = strategy.run(step, args=(next(iterator),))
            return None if outputs is None else tf.nest.map_structure(summed, outputs)

        return execution

    def schedule(self):
        """Schedules ``steps_per_execution`` steps on a free worker; returns
        at once a ``RemoteValue`` of the last step's outputs (``fetch()`` it;
        a worker's error is raised there or by `join`)."""
        with peers.explain_lost_servers():
            if self._iterators is None:
                self._iterators = PerWorkerIterators(self.coordinator, self._make_dataset)()
            return self.coordinator.schedule(self._execution, args=(self._iterators,))

    def join(self) -> None:
        """Waits for every scheduled closure; a lost ps is
        `tfdist.errors.ParameterServerLostError` naming it."""
        with peers.explain_lost_servers():
            self.coordinator.join()

    def evaluate(self, dataset, eval_step: Callable, *, num_shards=None) -> None:
        """Runs ``eval_step(batch)`` on every batch of ``dataset`` once, on
        the workers, and returns when all ran (after a `join`).

        Args:
          dataset: a finite `tf.data.Dataset` of global batches made on the
            coordinator (dealt by batch: shard k takes batches k, k + n, ...),
            or a ``dataset_fn(input_context)`` called with an InputContext
            naming the shard, which must shard itself (use it when the
            pipeline holds lookup tables, e.g. Keras ``StringLookup``).
          eval_step: ``eval_step(batch)`` with a `tfdist.Batch`; it updates
            metrics created under ``strategy.scope()`` (read them after).
          num_shards: closures to schedule (default: the number of workers).
        """
        workers = coordinator_workers.workers(self.coordinator)
        num_shards = len(workers) if num_shards is None else num_shards
        validation.positive_int("num_shards", num_shards)
        def shard_functions():
            source = _source(dataset, "evaluation dataset")
            step = _as_batch_step(eval_step, "eval_step")
            return [self._make_shard_function(make_dataset, step)
                    for make_dataset in shard_dataset_makers(
                        source, num_shards=num_shards, replicas=1)]

        functions = self._evaluations.get((dataset, eval_step, num_shards), shard_functions)
        with peers.explain_lost_servers():
            for function in functions:
                self.coordinator.schedule(function)
            self.coordinator.join()

    def _make_shard_function(self, make_dataset: Callable, step: Callable):
        strategy = self._strategy

        @tf.function
        def evaluate_shard():
            # Over an iterator, autograph makes a while loop on the worker (over
            # a dataset it would make a dataset reduce, with the step inside
            # tf.data's runtime).
            for element in iter(make_dataset()):
                strategy.run(step, args=(element,))

        return evaluate_shard


__all__ = ["ParameterServerLoop"]
