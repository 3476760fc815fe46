"""Runs up to N replica steps per call inside one ``tf.function``.

The loops are `tfdist.loop.make_loop`'s (Keras' ``steps_per_execution``: the
host dispatches once per N steps); under a multi-worker strategy workers
agree on stop requests about once a second (`tfdist.agreement`). The outer
loop (the Trainer) uses the count of steps run to end the epoch.
"""

from typing import Callable, Optional

import tensorflow as tf

from tfdist import collectives, peers
from tfdist import loop as host_loop
from tfdist import data as data_lib
from tfdist.agreement import StopAgreement


class SynchronousRunner:
    """Dispatches replica steps with ``strategy.run``."""

    needs_steps_per_epoch = False
    predicts_on_coordinator = False  # see tfdist.predict

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        train_step: Callable,
        eval_step: Callable,
        *,
        shard_policy: str = "auto",
        after_train_step: Optional[Callable] = None,
    ):
        self._strategy = strategy
        self._shard_policy = shard_policy
        self._multi_worker = collectives.spans_workers(strategy)
        self._train_loop = host_loop.make_loop(strategy, train_step, after_step=after_train_step)
        self.stop_agreement = StopAgreement(strategy, spans_workers=self._multi_worker)
        self._eval_loop = host_loop.make_loop(strategy, eval_step)
        self._distributed = {}
        self._agree = None

    def _distribute(self, source, *, epoch, skip_steps, partial_batch, global_batch_size):
        """The distributed dataset; reused while the data, epoch source and
        position are unchanged (building one costs tens of milliseconds)."""
        key = (source.original, epoch if source.per_epoch else None, skip_steps, partial_batch)
        if key not in self._distributed:
            if len(self._distributed) >= 4:
                self._distributed.clear()
            self._distributed[key] = data_lib.distribute(
                self._strategy, source, epoch=epoch, skip_steps=skip_steps,
                partial_batch=partial_batch, global_batch_size=global_batch_size,
                shard_policy=self._shard_policy, avoid_empty_replicas=True,
            )
        return self._distributed[key]

    def iterator(self, source, *, epoch, skip_steps, partial_batch, global_batch_size=None):
        """A fresh iterator over ``source`` (`tfdist.epochs.Source`) for
        ``epoch``, after ``skip_steps``."""
        return iter(self._distribute(
            source, epoch=epoch, skip_steps=skip_steps, partial_batch=partial_batch,
            global_batch_size=global_batch_size,
        ))

    def train(self, iterator, num_steps: int, stop_requested: bool = False, *,
              ends_epoch: bool = False):
        """Runs up to ``num_steps`` training steps.

        Returns ``(steps run, stop)``: ``stop`` is True on every worker, at
        the same call, once any worker passed ``stop_requested``
        (`tfdist.agreement`: within about a second of steps, and always at
        the execution that ends the epoch (``ends_epoch``) or the data).
        """
        ran = int(self._train_loop(iterator, tf.constant(num_steps, tf.int64)))
        last = ends_epoch or ran < num_steps
        return ran, self.stop_agreement.after_execution(stop_requested, last=last)

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
        """Runs the evaluation step over ``source`` (or its first ``steps``)."""
        iterator = self.iterator(source, epoch=0, skip_steps=0, partial_batch=partial_batch,
                                 global_batch_size=global_batch_size)
        done = 0
        while steps is None or done < steps:
            chunk = 1024 if steps is None else steps - done
            ran = int(self._eval_loop(iterator, tf.constant(chunk, tf.int64)))
            done += ran
            if ran < chunk:
                break
