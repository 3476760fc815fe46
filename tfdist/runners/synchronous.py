"""Runs up to N replica steps per call inside one ``tf.function``.

The inner loop is a device-side ``tf.while_loop`` (Keras'
``steps_per_execution``): the host dispatches once per N steps. The loop reads
the distributed iterator with ``get_next_as_optional`` so it stops cleanly
when the data ends inside an execution, and returns how many steps ran; the
outer loop (the Trainer) uses that count to end the epoch. ``num_steps`` is a
tensor argument, so a shorter final execution does not retrace.
"""

from typing import Callable

import tensorflow as tf

from tfdist import data as data_lib


class SynchronousRunner:
    """Dispatches replica steps with ``strategy.run``."""

    needs_steps_per_epoch = False

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        train_step: Callable,
        eval_step: Callable,
        *,
        shard_policy: str = "auto",
    ):
        self._strategy = strategy
        self._shard_policy = shard_policy
        self._train_loop = self._make_loop(train_step)
        self._eval_loop = self._make_loop(eval_step)
        self._distributed = {}

    def _make_loop(self, replica_step: Callable):
        strategy = self._strategy

        @tf.function
        def loop(iterator, num_steps):
            steps_run = tf.constant(0, tf.int64)
            for _ in tf.range(num_steps):
                optional = iterator.get_next_as_optional()
                if not optional.has_value():
                    break
                strategy.run(replica_step, args=(optional.get_value(),))
                steps_run += 1
            return steps_run

        return loop

    def _distribute(self, data, *, epoch, skip_steps, partial_batch, global_batch_size):
        """The distributed dataset; reused while the data, epoch source and
        position are unchanged (building one costs tens of milliseconds)."""
        key = (data, None if isinstance(data, tf.data.Dataset) else epoch,
               skip_steps, partial_batch)
        if key not in self._distributed:
            if len(self._distributed) >= 4:
                self._distributed.clear()
            self._distributed[key] = data_lib.distribute(
                self._strategy, data, epoch=epoch, skip_steps=skip_steps,
                partial_batch=partial_batch, global_batch_size=global_batch_size,
                shard_policy=self._shard_policy,
            )
        return self._distributed[key]

    def iterator(self, data, *, epoch, skip_steps, partial_batch, global_batch_size=None):
        """A fresh iterator over ``data`` for ``epoch``, after ``skip_steps``."""
        return iter(self._distribute(
            data, epoch=epoch, skip_steps=skip_steps, partial_batch=partial_batch,
            global_batch_size=global_batch_size,
        ))

    def train(self, iterator, num_steps: int) -> int:
        """Runs up to ``num_steps`` training steps; returns how many ran."""
        return int(self._train_loop(iterator, tf.constant(num_steps, tf.int64)))

    def sync(self) -> None:
        """Nothing to wait for: `train` returns when its steps are done."""

    def evaluate(self, data, *, steps, partial_batch, global_batch_size=None) -> None:
        """Runs the evaluation step over ``data`` (or its first ``steps``)."""
        iterator = self.iterator(data, epoch=0, skip_steps=0, partial_batch=partial_batch,
                                 global_batch_size=global_batch_size)
        done = 0
        while steps is None or done < steps:
            chunk = 1024 if steps is None else steps - done
            ran = int(self._eval_loop(iterator, tf.constant(chunk, tf.int64)))
            done += ran
            if ran < chunk:
                break
