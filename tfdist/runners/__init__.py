"""How a step is dispatched: one small adapter per strategy family.

`SynchronousRunner` serves strategies whose replicas step together through
``strategy.run`` (one device, mirrored, multi-worker mirrored, TPU). A
runner offers ``iterator`` (data for an epoch), ``train`` (dispatch an
execution), ``sync`` (wait before metrics are read) and ``evaluate``, so a
parameter-server runner (``ClusterCoordinator.schedule`` / ``join``) can
slot in beside it.
"""

from tfdist.runners.synchronous import SynchronousRunner

__all__ = ["SynchronousRunner"]
