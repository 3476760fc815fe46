"""Stop agreement across workers, about once a second, in its own host call.

A SIGTERM or Ctrl-C reaches one worker (`tfdist.loops.preemption`), but every
worker must stop after the same step, or the others wait forever in the
next collective. So workers sum their stop requests in an all-reduce.

Why not in every training call: each all-reduce costs a round trip
between workers at every step, and, with TensorFlow's default collective
instance keys, memory at every host call that is never freed
(docs/reliability.md#memory). tfdist's functions now fix their keys when
traced (`tfdist._internal.collectives.function`), which removes the
memory; the round trip is why the agreement stays out of the training
call.

`StopAgreement` instead agrees every ``interval`` executions, in a separate
tiny function, and picks the next interval in the same all-reduce: each
worker proposes how many executions fit in ``target_seconds`` (its own
measured pace), and all take the integer mean of the proposals, the same
number everywhere. Every worker calls `after_execution` once per execution,
in the same order (training is in lockstep anyway), so all agree at the
same executions, and at the last execution of an epoch or of the data. A
stop is seen within about ``target_seconds`` of steps plus one execution
(the interval grows at most 2x per agreement, to at most ``max_interval``
executions; if executions suddenly slow down, the current interval still
runs out at the new pace).
"""

import time

import tensorflow as tf

from tfdist._internal import collectives


class StopAgreement:
    """Tells every worker, at the same execution, whether any asked to stop."""

    def __init__(self, strategy: tf.distribute.Strategy, *, spans_workers: bool,
                 target_seconds: float = 1.0, max_interval: int = 1_000):
        self._strategy = strategy
        self._spans_workers = spans_workers
        self._target_seconds = target_seconds
        self._max_interval = max_interval
        self._interval = 1  # the first agreement comes after the first execution
        self._since = 0
        self._last = time.monotonic()
        self._agree = None
        self.agreements = 0  # how many all-reduces ran (for tests)

    @property
    def interval(self) -> int:
        """Executions between agreements (the same on every worker)."""
        return self._interval

    def after_execution(self, requested: bool, *, last: bool = False) -> bool:
        """Call after each execution; True on every worker once any worker
        passed ``requested`` at an agreement point. ``last`` (the same on
        every worker: the epoch or the data ends) agrees now, so a request
        is not left behind when the loop ends."""
        if not self._spans_workers:
            return requested
        self._since += 1
        if self._since < self._interval and not last:
            return False
        now = time.monotonic()
        pace = (now - self._last) / self._since  # seconds per execution, here
        proposal = min(self._max_interval, max(1, int(self._target_seconds / max(pace, 1e-6))))
        stop, interval = self._all_reduce(requested, proposal)
        # Grows at most 2x per agreement (one fast execution does not set a
        # long interval); shrinks at once when executions slow down.
        self._interval = max(1, min(interval, 2 * self._interval))
        self._since = 0
        self._last = time.monotonic()
        self.agreements += 1
        return stop

    def _all_reduce(self, requested: bool, proposal: int):
        if self._agree is None:
            strategy = self._strategy

            @collectives.function
            def agree(values):
                return collectives.sum_over_replicas(strategy, values)

            self._agree = agree
        total = self._agree(tf.constant([1.0 if requested else 0.0, float(proposal)]))
        # Each of a worker's replicas adds its proposal once. Integers this
        # small sum exactly in float32: every worker gets the same mean.
        stop_votes, proposals = (float(v) for v in total.numpy())
        return stop_votes > 0, int(proposals) // self._strategy.num_replicas_in_sync
