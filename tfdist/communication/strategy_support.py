"""Which strategies a `tfdist.communication` part runs under: one check,
each part saying in its own words why it cannot run under the others.

>>> import tfdist
>>> from tfdist.communication.strategy_support import refuse_strategy
>>> refuse_strategy("LocalSGD(4)", tfdist.make_strategy("one_device"),
...                 parameter_servers="averages synchronous replicas.")  # runs: no error
"""

from typing import Optional

import tensorflow as tf

from tfdist.errors import ConfigurationError


def refuse_strategy(part, strategy: tf.distribute.Strategy, *, parameter_servers: str,
                    tpu: Optional[str] = None) -> None:
    """Raises `ConfigurationError` ("communication=<part> <why> Drop it.")
    under ParameterServerStrategy (``parameter_servers``: why) and, when
    ``tpu`` says why, under TPUStrategy."""
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        why = parameter_servers
    elif tpu is not None and isinstance(
            strategy, (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)):
        why = tpu
    else:
        return
    raise ConfigurationError(f"communication={part!r} {why} Drop it.")
