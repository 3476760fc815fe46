"""Mirrored variables whose copies live on devices tfdist chooses: a
pipeline stage's weights under a strategy with several replicas keep
replica r's copy on replica r's device for that stage
(`tfdist.parallel.pipeline`), not on the replica's own device.

A ``MirroredStrategy`` (and ``MultiWorkerMirroredStrategy``) makes a
variable one copy per replica, on its replica's device, or on the devices
of the variable named by ``strategy.extended.colocate_vars_with`` (how an
optimizer's slots follow their weight). It reads that variable's devices
from its private ``_devices`` attribute; `mirrored_on` hands the
strategy's creator an object with only that attribute, so every other
part of making the variable (its copies' initial values, names,
aggregation, the wrapper that reads the local copy in a replica and
writes every copy in an update) is the strategy's own. Each copy is then
indexed by replica, as every mirrored variable's are: replica r reads and
updates copy r, wherever it lives.

>>> import tensorflow as tf, tfdist
>>> devices = tfdist.strategies.configure_logical_cpus(4)
>>> strategy = tf.distribute.MirroredStrategy(devices[:2])
>>> with strategy.scope(), mirrored_on(strategy, devices[2:]):
...     variable = tf.Variable([1.0, 2.0])
>>> [copy.device[-5:] for copy in variable.values]
['CPU:2', 'CPU:3']
"""

import contextlib
from typing import Sequence

import tensorflow as tf


class _Devices:
    """What a mirrored strategy reads of a variable to colocate with:
    its devices, one per replica."""

    def __init__(self, devices: Sequence[str]):
        self._devices = tuple(devices)  # (the name MirroredExtended._create_variable reads)


@contextlib.contextmanager
def mirrored_on(strategy: tf.distribute.Strategy, devices: Sequence[str]):
    """Within ``strategy.scope()``: variables made in the block are
    ``strategy``'s mirrored variables with replica r's copy on
    ``devices[r]`` (one device per local replica)."""
    local = len(strategy.extended.worker_devices)
    if len(devices) != local:
        raise ValueError(f"mirrored_on: {len(devices)} devices for {local} local replicas.")

    def create(next_creator, **kwargs):
        kwargs["colocate_with"] = _Devices(devices)
        return next_creator(**kwargs)

    with tf.variable_creator_scope(create):
        yield


def on_devices_of(strategy: tf.distribute.Strategy, variable):
    """Within ``strategy.scope()``: variables made in the block have
    ``variable``'s devices, one copy per replica (a pipeline stage's weight
    keeps its slices and optimizer state on the stage's devices, not the
    replicas' own); no change for a variable with one copy."""
    if not is_distributed(variable):
        return contextlib.nullcontext()
    return mirrored_on(strategy, [copy.device for copy in local_copies(variable)])


def is_distributed(variable) -> bool:
    """Whether ``variable`` (a ``tf.Variable``) is a strategy's variable
    with one copy per replica."""
    return isinstance(variable, tf.distribute.DistributedValues)


def local_copies(variable) -> list:
    """Each local replica's copy of distributed ``variable``, in replica order."""
    return list(variable.values)


def running_copy(variable):
    """The running replica's copy of distributed ``variable`` (a gather on
    it reads that copy's rows; one on the distributed variable reads every
    copy); ``variable`` itself when it is not distributed."""
    if not is_distributed(variable):
        return variable
    return local_copies(variable)[local_replica()]


def local_replica() -> int:
    """The running replica's index among this process's replicas (0
    outside a replica, or on one): which of its pipelines, or copies,
    it uses."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return 0
    index = tf.get_static_value(context.replica_id_in_sync_group)
    return int(index) % len(context.strategy.extended.worker_devices)
