"""How a step is dispatched: one small adapter per strategy family.

Internal: the Trainer's. Nothing here is public API and it may change
without notice; a hand-written loop runs its steps with
`tfdist.loops.host_loop.HostLoop`, which builds the same device-side loop
(`tfdist.loops.runners.device_loop`).

Every runner implements `tfdist.loops.runners.base.Runner`:
`SynchronousRunner` for strategies whose replicas step together through
``strategy.run`` (one device, mirrored, multi-worker mirrored, TPU),
`CoordinatorRunner` for parameter-server workers. `make_runner` builds
the one for a strategy, so the Trainer never names a strategy family.
"""

from typing import Callable, Optional

import tensorflow as tf

from tfdist.loops.runners.base import Execution, Runner
from tfdist.loops.runners.coordinator import CoordinatorRunner
from tfdist.loops.runners.synchronous import SynchronousRunner


def make_runner(strategy: tf.distribute.Strategy, train_step: Callable, eval_step: Callable, *,
                after_train_step: Optional[Callable] = None, avoid_empty_replicas: bool = True,
                shard_policy: str = "auto", data_service: Optional[str] = None) -> Runner:
    """The runner for ``strategy``, given what it takes of the options
    (parameter servers take no shard policy, after-step work or padding)."""
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return CoordinatorRunner(strategy, train_step, eval_step, data_service=data_service)
    return SynchronousRunner(strategy, train_step, eval_step, shard_policy=shard_policy,
                             after_train_step=after_train_step,
                             avoid_empty_replicas=avoid_empty_replicas,
                             data_service=data_service)


__all__ = ["CoordinatorRunner", "Execution", "Runner", "SynchronousRunner", "make_runner"]
