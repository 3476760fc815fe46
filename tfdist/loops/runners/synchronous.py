"""Runs up to N replica steps per call inside one ``tf.function``.

The loops are `tfdist.loops.runners.device_loop`'s (Keras' ``steps_per_execution``: the
host dispatches once per N steps), without the per-step end-of-data check
while the data certainly lasts (endless data, or a known length on one
worker: `CountedIterator`); under a multi-worker strategy workers
agree on stop requests about once a second (`tfdist.loops.agreement`). The outer
loop (the Trainer) uses the count of steps run to end the epoch.
"""

import dataclasses
import math
from typing import Any, Callable, Optional, Union

import tensorflow as tf

from tfdist import data as data_lib
from tfdist.cluster import peers
from tfdist.data import iterator_release
from tfdist.loops.agreement import StopAgreement
from tfdist.loops.cadence import ExecutionPlan
from tfdist.loops.runners.base import Execution, ignore_steps, run_each
from tfdist.loops.runners.device_loop import device_loop
from tfdist._internal import collectives
from tfdist._internal.bounded_cache import BoundedCache


@dataclasses.dataclass
class CountedIterator:
    """A distributed iterator and the steps it certainly still has
    (``math.inf``: endless; 0: unknown). Executions within that many steps
    run without an end-of-data check (`tfdist.loops.runners.device_loop`)."""

    iterator: Any
    guaranteed_steps: Union[int, float]

    def release(self) -> None:
        """Done with it: TensorFlow frees the iterator off this thread
        (`tfdist.data.iterator_release`: freeing it here can stall seconds)."""
        iterator_release.release(self, "iterator")


class CountedLoops:
    """A replica step's two host loops: with and without the end check."""

    def __init__(self, strategy, replica_step, after_step=None):
        self._checked = device_loop(strategy, replica_step, after_step=after_step)
        self._unchecked = device_loop(
            strategy, replica_step, after_step=after_step, check_end=False)
        self._step_counts = {}  # num_steps -> its int64 tensor, made once

    def _steps(self, num_steps: int) -> tf.Tensor:
        steps = self._step_counts.get(num_steps)
        if steps is None:
            steps = self._step_counts[num_steps] = tf.constant(num_steps, tf.int64)
        return steps

    def unchecked(self, num_steps: int):
        """``(loop, steps)``: ``loop(iterator, steps)`` runs ``num_steps``
        steps without the end check (for iterators that certainly have them)."""
        return self._unchecked, self._steps(num_steps)

    def run(self, counted: CountedIterator, num_steps: int) -> int:
        """Runs up to ``num_steps`` steps; returns how many ran."""
        steps = self._steps(num_steps)
        if num_steps <= counted.guaranteed_steps:
            self._unchecked(counted.iterator, steps)
            counted.guaranteed_steps -= num_steps
            return num_steps
        ran = int(self._checked(counted.iterator, steps))
        counted.guaranteed_steps = max(0, counted.guaranteed_steps - ran)
        return ran


class SynchronousRunner:
    """Dispatches replica steps with ``strategy.run`` (a
    `tfdist.loops.runners.base.Runner`)."""

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        train_step: Callable,
        eval_step: Callable,
        *,
        shard_policy: str = "auto",
        after_train_step: Optional[Callable] = None,
        avoid_empty_replicas: bool = True,
        data_service: Optional[str] = None,
    ):
        self._strategy = strategy
        self._shard_policy = shard_policy
        self._data_service = data_service
        self._avoid_empty_replicas = avoid_empty_replicas
        self._multi_worker = collectives.spans_workers(strategy)
        self._train_loops = CountedLoops(strategy, train_step, after_step=after_train_step)
        self.stop_agreement = StopAgreement(strategy, spans_workers=self._multi_worker)
        self._eval_loops = CountedLoops(strategy, eval_step)
        self._distributed = BoundedCache()
        self._agree = None

    def _distribute(self, source, *, epoch, skip_steps, partial_batch, global_batch_size):
        """``(distributed dataset, guaranteed steps)``; reused while the
        data, epoch source and position are unchanged (building one costs
        tens of milliseconds)."""
        key = (source.original, epoch if source.per_epoch else None, skip_steps, partial_batch)
        return self._distributed.get(key, lambda: data_lib.distribute_counted(
            self._strategy, source, epoch=epoch, skip_steps=skip_steps,
            partial_batch=partial_batch, global_batch_size=global_batch_size,
            shard_policy=self._shard_policy, avoid_empty_replicas=self._avoid_empty_replicas,
            data_service=self._data_service,
        ))

    def iterator(self, source, *, epoch, skip_steps, partial_batch,
                 global_batch_size=None) -> CountedIterator:
        """A fresh iterator over ``source`` (`tfdist.data.epochs.Source`) for
        ``epoch``, after ``skip_steps``."""
        distributed, guaranteed_steps = self._distribute(
            source, epoch=epoch, skip_steps=skip_steps, partial_batch=partial_batch,
            global_batch_size=global_batch_size,
        )
        return CountedIterator(iter(distributed), guaranteed_steps)

    def check_fit(self, steps_per_epoch: Optional[int]) -> None:
        """Every ``fit`` runs: an epoch ends with its data or ``steps_per_epoch``."""

    def new_pass_each_epoch(self) -> bool:
        """False: with ``steps_per_epoch`` an iterator runs on across epochs (as Keras')."""
        return False

    def predicts_inline(self) -> bool:
        """False: ``predict`` runs through ``strategy.run`` (`tfdist.training.predict`)."""
        return False

    def train(self, iterator: CountedIterator, plan: ExecutionPlan,
              stop_requested: Callable[[], bool],
              advance: Callable[[int], None] = ignore_steps) -> Execution:
        """Runs ``plan`` (`tfdist.loops.runners.base`'s contract).

        Under a multi-worker strategy, or when the data may end, each
        execution goes through `_execute`, which agrees on stops across
        workers (`tfdist.loops.agreement`). While the data certainly lasts
        on one worker, a bare Python loop of calls runs them, as a
        hand-written loop does (less Python per execution for `Trainer.fit`
        without batch callbacks; figures:
        docs/performance.md#measurements-behind-design-choices).
        """
        if self._multi_worker or plan.total_steps > iterator.guaranteed_steps:
            return run_each(self._execute, iterator, plan, stop_requested, advance)
        loop, steps = self._train_loops.unchecked(plan.num_steps)
        distributed = iterator.iterator
        for executed in range(1, plan.executions + 1):
            loop(distributed, steps)
            iterator.guaranteed_steps -= plan.num_steps
            advance(plan.num_steps)
            if stop_requested():
                return Execution(executed * plan.num_steps, stop=True)
        return Execution(plan.total_steps)

    def _execute(self, iterator: CountedIterator, num_steps: int, requested: bool,
                 last: bool):
        """One execution of up to ``num_steps`` steps: ``(steps run, stop)``;
        ``stop`` is True on every worker, at the same execution, once any
        worker passed ``requested`` (within about a second of steps, and
        always at the execution that ends the epoch (``last``) or the data)."""
        ran = self._train_loops.run(iterator, num_steps)
        return ran, self.stop_agreement.after_execution(requested, last=last or ran < num_steps)

    def sync(self) -> None:
        """Nothing to wait for: `train` returns when its steps are done."""

    def any_worker(self, flag: bool) -> bool:
        """True on every worker when any worker passed True (one all-reduce
        under a multi-worker strategy): for choices that decide which
        collectives run, so every worker makes the same one."""
        if not self._multi_worker:
            return flag
        if self._agree is None:
            self._agree = collectives.function(
                lambda value: collectives.any_worker(self._strategy, value))
        return bool(self._agree(tf.constant(1.0 if flag else 0.0)))

    @staticmethod
    def explain_failures(checkpoint_dir=None):
        """A step aborted over a lost multi-worker peer raises `PeerLostError`."""
        return peers.explain_lost_peers(checkpoint_dir)

    def evaluate(self, source, *, steps, partial_batch, global_batch_size=None) -> None:
        """Runs the evaluation step over ``source`` (or its first ``steps``).

        Data of a known length on one worker is read to its end without the
        per-step end check, as ``fit`` reads it (`CountedIterator`): the
        loop without the optional and its branch is cheaper to trace and
        to run.
        """
        iterator = self.iterator(source, epoch=0, skip_steps=0, partial_batch=partial_batch,
                                 global_batch_size=global_batch_size)
        if steps is None and 0 < iterator.guaranteed_steps < math.inf:
            steps = iterator.guaranteed_steps  # the data's whole length
        done = 0
        try:
            while steps is None or done < steps:
                chunk = 1024 if steps is None else steps - done
                ran = self._eval_loops.run(iterator, chunk)
                done += ran
                if ran < chunk:
                    break
        finally:
            iterator.release()
