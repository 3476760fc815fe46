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


class SynchronousRunner:
    """Dispatches replica steps with ``strategy.run``."""

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        train_step: Callable,
        eval_step: Callable,
    ):
        self._strategy = strategy
        self._train_loop = self._make_loop(train_step)
        self._eval_loop = self._make_loop(eval_step)

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

    def train(self, iterator, num_steps: int) -> int:
        """Runs up to ``num_steps`` training steps; returns how many ran."""
        return int(self._train_loop(iterator, tf.constant(num_steps, tf.int64)))

    def evaluate(self, iterator, num_steps: int) -> int:
        """Runs up to ``num_steps`` evaluation steps; returns how many ran."""
        return int(self._eval_loop(iterator, tf.constant(num_steps, tf.int64)))
