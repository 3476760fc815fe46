"""Which devices: the `make_strategy` registry (`tfdist.strategies.registry`)
and the factories it calls: local devices and logical CPUs
(`tfdist.strategies.local_devices`), multi-worker mirrored
(`tfdist.strategies.multi_worker`), parameter servers
(`tfdist.strategies.parameter_server`, `tfdist.strategies.sharded`), and
Cloud TPU (`tfdist.strategies.tpu`)."""

from tfdist._internal import lazy

_NAMES = {name: "tfdist.strategies.registry" for name in (
    "configure_logical_cpus", "known_strategies", "register_strategy")}
__all__ = sorted(_NAMES)
__getattr__ = lazy.attributes(__name__, _NAMES)
