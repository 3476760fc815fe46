"""One object for what a Trainer sends over the network: `Communication`.

``communication=`` of `tfdist.Trainer` / `tfdist.attach` takes None, a
`tfdist.communication.Compression`, a `tfdist.communication.LocalSGD`, a
`tfdist.communication.ShardedOptimizerState`, or a tuple of them.
`Communication.attach` checks the combination, attaches each part to the
model's optimizer, and gives the Trainer one object with
the same four calls whatever was asked for: none (the default) makes them
no-ops, so the Trainer never tests for a part.

>>> import keras, tfdist
>>> from tfdist.communication.plan import Communication
>>> strategy = tfdist.make_strategy("one_device")
>>> with strategy.scope():
...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
...     model.compile(optimizer="sgd", loss="mse")
>>> plan = Communication.attach(None, model, strategy)
>>> plan.after_train_step(None) is None, plan.prepare(model)
(True, {})
"""

import warnings
from typing import Callable, Optional

import tensorflow as tf

from tfdist.communication import compression, local_sgd
from tfdist.communication.compression import Compression
from tfdist.communication.local_sgd import LocalSGD
from tfdist.communication.sharding import ShardedOptimizerState
from tfdist.errors import ConfigurationError


def parts_of(communication) -> tuple:
    """The parts in ``communication`` (the argument: one, a tuple or None);
    `tfdist.parallel.plan` reads them too."""
    if isinstance(communication, (tuple, list)):
        return tuple(communication)
    return () if communication is None else (communication,)


class Communication:
    """The parts asked for (`attach`); each call is a no-op without them."""

    def __init__(self, compression: Optional[Compression] = None,
                 local_sgd: Optional[LocalSGD] = None,
                 sharding: Optional[ShardedOptimizerState] = None):
        self.compression = compression
        self.local_sgd = local_sgd
        self.sharding = sharding

    @classmethod
    def attach(cls, communication, model,
               strategy: tf.distribute.Strategy) -> "Communication":
        """Checks ``communication`` (the argument), attaches its parts to
        ``model``'s optimizer and returns them as one object."""
        items = parts_of(communication)
        kinds = (Compression, LocalSGD, ShardedOptimizerState)
        unknown = [item for item in items if not isinstance(item, kinds)]
        if unknown:
            raise ConfigurationError(
                f"`communication` ({unknown[0]!r}) must be a tfdist.communication.Compression, "
                "LocalSGD or ShardedOptimizerState, a tuple of them, or None.")
        found = [[item for item in items if isinstance(item, kind)] for kind in kinds]
        if any(len(parts) > 1 for parts in found):
            raise ConfigurationError(
                f"`communication` ({communication!r}) takes at most one of each kind.")
        plan = cls(*(parts[0] if parts else None for parts in found))
        if plan.sharding is not None:
            plan._check_sharding()
            plan.sharding.attach_to(model, strategy)
        # Either part may already sit on the optimizer, from an earlier Trainer.
        local = plan.local_sgd or (plan.compression and local_sgd.attached_to(model.optimizer))
        compressed = plan.compression or (
            plan.local_sgd and compression.attached_to(model.optimizer))
        if local and compressed:
            raise ConfigurationError(
                f"communication=({local!r}, {compressed!r}): under local SGD no gradient "
                "all-reduce is left to compress (the weights are averaged in their own dtype). "
                "Use one of the two.")
        if plan.compression is not None:
            plan.compression.attach_to(model.optimizer, strategy)
        if plan.local_sgd is not None:
            plan.local_sgd.attach_to(model, strategy)
        return plan

    def _check_sharding(self) -> None:
        if self.local_sgd is not None:
            raise ConfigurationError(
                f"communication=({self.sharding!r}, {self.local_sgd!r}): local SGD keeps each "
                "replica's own weights and steps them apart, while sharded state updates one "
                "slice per replica of weights all replicas share. Use one of the two.")

    @staticmethod
    def jit_compile(communication, compiled: bool) -> bool:
        """Whether the step runs its forward and backward pass under XLA:
        ``compiled`` (``model.compile(jit_compile=...)``), except with fully
        sharded weights (in ``communication``, the argument), whose backward
        pass reduce-scatters each gradient, and collectives do not run inside
        XLA on mirrored CPU and GPU strategies: the step then runs without
        XLA, with a warning (the numbers are the same; only the speed
        differs)."""
        shards_weights = [item for item in parts_of(communication)
                          if getattr(item, "shards_weights", False)]
        if compiled and shards_weights:
            warnings.warn(
                f"model.jit_compile is True, but communication={shards_weights[0]!r} "
                "reduce-scatters each gradient in the backward pass, which cannot run inside "
                "XLA here: tfdist runs the step without XLA (the same numbers).", stacklevel=4)
            return False
        return compiled

    def after_train_step(self, after_train_step: Optional[Callable]) -> Optional[Callable]:
        """``after_train_step`` (cross-replica, after each step) followed by
        local SGD's averaging check, when there is one."""
        local = self.local_sgd
        if local is None:
            return after_train_step

        def after_step():
            if after_train_step is not None:
                after_train_step()
            local.after_step()

        return after_step

    def prepare(self, model) -> dict:
        """Once the model is built: the state to checkpoint ({} without local SGD)."""
        return {} if self.local_sgd is None else self.local_sgd.prepare(model)

    def average_now(self) -> None:
        """Before a save or an epoch's end: every replica's weights identical."""
        if self.local_sgd is not None:
            self.local_sgd.average_now()

    def __repr__(self):
        parts = [repr(part) for part in (self.compression, self.local_sgd, self.sharding)
                 if part is not None]
        return f"Communication({', '.join(parts)})"
