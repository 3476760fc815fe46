"""How a step is dispatched: one small adapter per strategy family.

Internal: the Trainer's. Nothing here is public API and it may change
without notice; a hand-written loop runs its steps with
`tfdist.loops.host_loop.HostLoop`, which builds the same device-side loop
(`tfdist.loops.runners.device_loop`).

`SynchronousRunner` serves strategies whose replicas step together through
``strategy.run`` (one device, mirrored, multi-worker mirrored, TPU);
`CoordinatorRunner` schedules steps on parameter-server workers. Both offer
``iterator`` (data for an epoch), ``train`` (dispatch an execution),
``train_many`` (a stretch of executions with nothing to do between them:
`tfdist.loops.runners.executions`), ``sync`` (wait before metrics are read),
``evaluate`` and
``explain_failures`` (a lost task becomes an error naming it).
`for_strategy` picks one, so the Trainer never names a strategy family.
"""

import tensorflow as tf

from tfdist.loops.runners.coordinator import CoordinatorRunner
from tfdist.loops.runners.synchronous import SynchronousRunner


def for_strategy(strategy: tf.distribute.Strategy):
    """The runner class for ``strategy``."""
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return CoordinatorRunner
    return SynchronousRunner


__all__ = ["CoordinatorRunner", "SynchronousRunner", "for_strategy"]
