"""How a step is dispatched: one small adapter per strategy family.

`SynchronousRunner` serves strategies whose replicas step together through
``strategy.run`` (one device, mirrored, multi-worker mirrored, TPU);
`CoordinatorRunner` schedules steps on parameter-server workers. Both offer
``iterator`` (data for an epoch), ``train`` (dispatch an execution),
``sync`` (wait before metrics are read) and ``evaluate``.
"""

from tfdist.runners.coordinator import CoordinatorRunner
from tfdist.runners.synchronous import SynchronousRunner

__all__ = ["CoordinatorRunner", "SynchronousRunner"]
