"""Host loops: many replica steps per host call, for any training loop.

A ``for element in dataset: train_step(element)`` loop pays one host call
(and, under a multi-worker strategy, one round of cross-worker work) per
step. Keras' ``steps_per_execution`` and the Trainer instead run up to k
steps inside one ``tf.function`` with a device-side ``tf.range`` loop.
`HostLoop` is that loop for hand-written training loops, the one public way
to run one (the Trainer's runners build the same loop internally:
`tfdist.loops.runners.device_loop`):
``for execution in loop.executions(dataset)`` once per epoch (or
``loop.run(iterator)`` until ``execution.end_of_data``, with an iterator of
your own).

The loop reads the distributed iterator with ``get_next_as_optional``, so
the data may end inside an execution: it returns how many steps ran, and
the number of steps is a tensor argument, so a short final execution does
not retrace. When the caller knows the data lasts (``check_end=False``; the
Trainer's runner does for endless data and known lengths), the loop reads
with ``next`` as a hand-written loop does.

Under a multi-worker strategy every worker must stop after the same step
when any one is asked to (SIGTERM / Ctrl-C): `tfdist.loops.agreement` sums the
stop requests about once a second in a call of its own, not inside the
loop. The loop is a `tfdist._internal.collectives.function`: its collectives keep the
instance keys of its trace, so a worker's memory does not grow per call
(docs/reliability.md).
"""

import types
from typing import Callable, Iterator, Optional

import tensorflow as tf

from tfdist._internal import collectives, replica_random, validation
from tfdist.data import iterator_release
from tfdist.data.batch import Batch
from tfdist.errors import ConfigurationError
from tfdist.loops.agreement import StopAgreement
from tfdist.loops.execution import Execution
from tfdist.loops.runners.device_loop import device_loop


class HostLoop:
    """Runs a hand-written replica step ``steps_per_execution`` times per call.

    ``replica_step(batch)`` is called in replica context with a
    `tfdist.Batch` (``batch.x``, ``batch.y``, ``batch.sample_weight``,
    ``batch.mask``, ``batch.global_examples``); ``after_step()`` (optional)
    in cross-replica context after each step, e.g. a
    `tfdist.replica.accumulation.GradientAccumulator`'s ``after_step``.

    Ten examples in global batches of 4 (4, 4, 2) over two replicas; one
    call of up to 4 steps runs the 3 there are:

    >>> import keras, tensorflow as tf, tfdist
    >>> strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    >>> with strategy.scope():
    ...     examples = keras.metrics.Sum()
    >>> def replica_step(batch):              # a tfdist.Batch, in every replica
    ...     examples.update_state(batch.real_examples())
    >>> loop = tfdist.loops.host_loop.HostLoop(strategy, replica_step, steps_per_execution=4)
    >>> dataset = tf.data.Dataset.range(10).map(lambda i: (tf.cast([i], tf.float32), i)).batch(4)
    >>> execution = loop.run(iter(tfdist.data.distribute(strategy, dataset)))
    >>> execution.steps, execution.end_of_data, float(examples.result())
    (3, True, 10.0)
    """

    def __init__(self, strategy: tf.distribute.Strategy, replica_step: Callable, *,
                 steps_per_execution: int = 1, after_step: Optional[Callable] = None):
        validation.positive_int("steps_per_execution", steps_per_execution)
        if not callable(replica_step):
            raise ConfigurationError(
                f"`replica_step` ({replica_step!r}) must be a function of one "
                "`tfdist.Batch`, run on every replica.")
        self.steps_per_execution = steps_per_execution

        # Not converted by autograph: Keras' optimizer code converted inside a
        # tf.range loop fails under MirroredStrategy, and errors raised by
        # the user's step (tfdist's ConfigurationError) stay as they are.
        @tf.autograph.experimental.do_not_convert
        def step(structure):
            with replica_random.independent_draws():  # Dropout: a mask per replica
                return replica_step(Batch.from_structure(structure))

        self._loop = device_loop(strategy, step, after_step=after_step)
        self._stop_agreement = StopAgreement(
            strategy, spans_workers=collectives.spans_workers(strategy))

    def run(self, iterator, stop_requested: bool = False) -> Execution:
        """Runs up to ``steps_per_execution`` steps from ``iterator`` (an
        iterator of `tfdist.data.distribute`'s dataset); ``stop_requested``:
        this task wants to stop (e.g. ``PreemptionWatcher.requested``)."""
        # (A ConfigurationError from tracing the step is raised as itself:
        # `tfdist.loops.runners.device_loop`.)
        steps = int(self._loop(iterator, tf.constant(self.steps_per_execution, tf.int64)))
        # Out of data (the same step on every worker): agree now.
        stop = self._stop_agreement.after_execution(
            stop_requested, last=steps < self.steps_per_execution)
        return Execution(steps, stop, steps < self.steps_per_execution)

    def executions(self, dataset, stop_signal=None) -> Iterator[Execution]:
        """One pass over ``dataset`` (`tfdist.data.distribute`'s dataset):
        runs executions and yields each one's `Execution`, up to the one
        that ends the data or agrees a stop (``execution.stop``).

        ``stop_signal``: a `tfdist.loops.preemption.PreemptionWatcher` (or
        any object with a ``requested`` flag), read before each execution as
        `run`'s ``stop_requested``.

        The pass's iterator is the loop's: when the pass ends, or the caller
        leaves it early (``break``, an exception), it is freed on a release
        thread, not the caller's. Freeing a distributed iterator waits for
        TensorFlow's input threads to wind down, which can hold the training
        thread for seconds (`tfdist.data.iterator_release`); an iterator of
        your own given to `run` is freed wherever its last reference goes.

        >>> import keras, tensorflow as tf, tfdist
        >>> strategy = tfdist.make_strategy("mirrored", num_replicas=2)
        >>> with strategy.scope():
        ...     examples = keras.metrics.Sum()
        >>> def replica_step(batch):
        ...     examples.update_state(batch.real_examples())
        >>> loop = tfdist.loops.host_loop.HostLoop(strategy, replica_step, steps_per_execution=2)
        >>> dataset = tf.data.Dataset.range(10).map(lambda i: (tf.cast([i], tf.float32), i)).batch(4)
        >>> batches = tfdist.data.distribute(strategy, dataset)
        >>> [execution.steps for execution in loop.executions(batches)], float(examples.result())
        ([2, 1], 10.0)
        """
        owner = types.SimpleNamespace(iterator=iter(dataset))
        try:
            while True:
                requested = bool(stop_signal is not None and stop_signal.requested)
                execution = self.run(owner.iterator, requested)
                yield execution
                if execution.stop or execution.end_of_data:
                    return
        finally:
            iterator_release.release(owner, "iterator")


__all__ = ["Execution", "HostLoop"]
