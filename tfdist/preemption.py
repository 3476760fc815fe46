"""Preemption: on SIGTERM, every worker stops at the same step and saves.

A cluster manager preempts a job by sending SIGTERM, often to one task.
`PreemptionWatcher` turns the signal into a flag; at each execution boundary
the Trainer asks `should_stop()`, which under a multi-worker strategy sums
the flag over all workers (one tiny all-reduce), so all workers
agree on the step. The Trainer then saves a checkpoint with the exact data
position, and raises `Preempted`, a ``SystemExit`` with code 143 (128 +
SIGTERM), which `tfdist-run --max_restarts` answers with a restart; `fit`
then resumes mid-epoch where it stopped. This is tfdist's equivalent of
``tf.distribute.experimental.PreemptionCheckpointHandler``, built on the
Trainer's own checkpoint so there is one writer per directory.
"""

import signal
import threading

import tensorflow as tf

PREEMPTED_EXIT_CODE = 143


class Preempted(SystemExit):
    """Training stopped on SIGTERM after saving a checkpoint."""

    def __init__(self, step: int):
        super().__init__(PREEMPTED_EXIT_CODE)
        self.step = step

    def __str__(self):
        return f"preempted (SIGTERM): checkpoint saved at step {self.step}"


class PreemptionWatcher:
    """Catches SIGTERM while active; agrees on stopping across workers."""

    def __init__(self, strategy: tf.distribute.Strategy):
        self._strategy = strategy
        self._flag = threading.Event()
        self._previous = None
        self._multi_worker = (
            isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and getattr(strategy.extended, "_num_workers", 1) > 1
        )
        if self._multi_worker:
            self._any_worker = self._make_any_worker()

    def _make_any_worker(self):
        strategy = self._strategy

        @tf.function
        def any_worker(flag):
            per_replica = strategy.run(lambda: tf.identity(flag))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        return any_worker

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def __exit__(self, *exc_info):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _on_signal(self, signum, frame):
        del signum, frame
        self._flag.set()

    def should_stop(self) -> bool:
        """True once any worker got SIGTERM (same answer on every worker)."""
        local = self._flag.is_set()
        if not self._multi_worker:
            return local
        return bool(self._any_worker(tf.constant(1.0 if local else 0.0)) > 0)
