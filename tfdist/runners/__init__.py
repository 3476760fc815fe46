"""How a step is dispatched: one small adapter per strategy family.

`SynchronousRunner` serves strategies whose replicas step together through
``strategy.run`` (one device, mirrored, multi-worker mirrored, TPU).
"""

from tfdist.runners.synchronous import SynchronousRunner

__all__ = ["SynchronousRunner"]
