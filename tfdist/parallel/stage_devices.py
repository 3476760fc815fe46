"""Which device runs each stage of each replica's pipeline
(`tfdist.parallel.pipeline`).

Without a strategy (or on one replica) the stages run on the devices
given, else on S GPUs when there are, else on S logical CPUs. Under a
strategy with d local replicas each replica has a pipeline of its own:
given, ``devices`` lists S per replica, replica 0's first; by default
replica r's stage 0 runs on the replica's own device (where its batch
arrives) and its other stages on the next devices of the same kind the
strategy does not use, replica after replica (a MultiWorkerMirroredStrategy
worker's on its own devices: each worker a pipeline of its own). With v
stages per device a pipeline runs on S / v devices, stage s on its
device s mod (S / v):

>>> per_replica(None, 2, None)          # (no strategy: 2 logical CPUs)
[['/cpu:0', '/cpu:1']]
>>> per_replica(["/cpu:0", "/cpu:2", "/cpu:1", "/cpu:3"], 2, None)
Traceback (most recent call last):
...
tfdist.errors.ConfigurationError: Pipeline: 1 pipeline(s) of 2 stages need 2 devices (one per stage for each local replica); got ['/cpu:0', '/cpu:2', '/cpu:1', '/cpu:3'].
"""

from typing import List, Optional, Sequence

import tensorflow as tf

from tfdist.errors import ConfigurationError


def per_replica(devices: Optional[Sequence[str]], stages: int,
                strategy: Optional[tf.distribute.Strategy], *,
                stages_per_device: int = 1) -> List[List[str]]:
    """One list of ``stages / stages_per_device`` devices per local replica
    of ``strategy`` (module doc)."""
    replica_devices = _replica_devices(strategy)
    count = max(1, len(replica_devices))
    wanted = stages // stages_per_device
    if devices is not None:
        devices = list(devices)
        if len(devices) != wanted * count:
            each = ("one per stage" if stages_per_device == 1
                    else f"one per {stages_per_device} stages")
            raise ConfigurationError(
                f"Pipeline: {count} pipeline(s) of {stages} stages need {wanted * count} "
                f"devices ({each} for each local replica); got {devices}.")
        return [devices[r * wanted:(r + 1) * wanted] for r in range(count)]
    if not replica_devices:
        return [_default_devices(wanted)]
    return _beside_replicas(replica_devices, wanted,
                            "stages" if stages_per_device == 1 else "pipeline devices")


def _replica_devices(strategy) -> List[str]:
    """The local replicas' devices of a strategy with several replicas (in
    this process or over workers: a MultiWorkerMirroredStrategy worker with
    one local replica gives its device, with its job and task); [] for one
    replica in all."""
    if strategy is None or strategy.num_replicas_in_sync == 1:
        return []
    return list(strategy.extended.worker_devices)


def _default_devices(stages: int) -> List[str]:
    from tfdist.strategies import local_devices  # pylint: disable=import-outside-toplevel

    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) >= stages:
        return [device.name for device in gpus[:stages]]
    return local_devices.configure_logical_cpus(stages)


def _beside_replicas(replica_devices: List[str], stages: int,
                     counted: str = "stages") -> List[List[str]]:
    """Replica r's stage 0 on its device, its stages 1.. on the devices of
    that kind (on its task) that no replica uses, in order (``stages``:
    the devices each pipeline runs on)."""
    first = tf.DeviceSpec.from_string(replica_devices[0])
    kind = first.device_type
    used = {tf.DeviceSpec.from_string(device).device_index for device in replica_devices}
    available = len(tf.config.list_logical_devices(kind))
    free = [first.replace(device_index=index).to_string()
            for index in range(available) if index not in used]
    needed = len(replica_devices) * (stages - 1)
    if len(free) < needed:
        raise ConfigurationError(
            f"Pipeline: {len(replica_devices)} replicas x {stages} {counted} need "
            f"{len(replica_devices) * stages} {kind} devices, {needed} beside the replicas' "
            f"own ({replica_devices}); this process has {available}. On CPUs, configure "
            f"them first: tfdist.strategies.configure_logical_cpus("
            f"{len(replica_devices) * stages}) before making the strategy; or give "
            "Pipeline(devices=[...]), one per stage for each replica.")
    return [[replica_devices[r]] + free[r * (stages - 1):(r + 1) * (stages - 1)]
            for r in range(len(replica_devices))]
