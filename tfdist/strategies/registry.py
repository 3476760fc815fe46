"""Strategy registry: ``make_strategy(name, **options)`` -> ``tf.distribute.Strategy``.

One call picks the devices a job trains on:

>>> import tfdist
>>> strategy = tfdist.make_strategy("one_device")
>>> strategy.num_replicas_in_sync
1

The registry imports the modules that build strategies (`tfdist.strategies.local_devices`,
`tfdist.strategies.multi_worker`, `tfdist.strategies.parameter_server`, `tfdist.strategies.tpu`); none
of them imports this module back. A new strategy is one factory function in its own module plus
one line in `_REGISTRY`; users can add their own with `register_strategy`.
"""

from typing import Callable, Dict

import tensorflow as tf

from tfdist.strategies import local_devices, multi_worker, parameter_server, tpu
from tfdist.strategies.local_devices import configure_logical_cpus  # noqa: F401  (public)

StrategyFactory = Callable[..., tf.distribute.Strategy]

_REGISTRY: Dict[str, StrategyFactory] = {
    "one_device": local_devices.one_device,
    "mirrored": local_devices.mirrored,
    "multi_worker_mirrored": multi_worker.multi_worker_mirrored,
    "parameter_server": parameter_server.parameter_server,
    "tpu": tpu.tpu_strategy,
}


def register_strategy(name: str, factory: StrategyFactory) -> None:
    """Makes ``make_strategy(name, **options)`` call ``factory(**options)``.

    >>> import tensorflow as tf, tfdist
    >>> tfdist.strategies.register_strategy("first_cpu", lambda: tf.distribute.OneDeviceStrategy("/cpu:0"))
    >>> tfdist.make_strategy("first_cpu").num_replicas_in_sync
    1
    """
    _REGISTRY[name] = factory


def known_strategies():
    """Sorted names that `make_strategy` accepts.

    >>> import tfdist
    >>> tfdist.strategies.known_strategies()
    ['mirrored', 'multi_worker_mirrored', 'one_device', 'parameter_server', 'tpu']
    """
    return sorted(_REGISTRY)


def make_strategy(name: str, **options) -> tf.distribute.Strategy:
    """Builds the strategy registered as ``name`` with ``options``.

    Make it first, before other TensorFlow work: logical CPU devices (the
    replicas of ``"mirrored"`` on a machine without GPUs) can only be made
    before TensorFlow's runtime starts.

    >>> import tfdist
    >>> strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    >>> strategy.num_replicas_in_sync
    2
    >>> with strategy.scope():
    ...     pass                                # build and compile the model here

    ``"multi_worker_mirrored"`` reads ``TF_CONFIG`` (`tfdist.cluster`),
    ``"parameter_server"`` and ``"tpu"`` need their cluster or TPU:

    >>> strategy = tfdist.make_strategy("multi_worker_mirrored")   # doctest: +SKIP
    >>> strategy = tfdist.make_strategy("tpu", tpu="local")        # doctest: +SKIP

    Raises:
      ValueError: ``name`` is not registered; the message lists known names.
    """
    if name not in _REGISTRY:
        raise ValueError(
            f"Unknown strategy name {name!r}. Known strategies: "
            f"{', '.join(known_strategies())}."
        )
    return _REGISTRY[name](**options)
