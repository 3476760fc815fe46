"""Which devices each replica's model axis runs on: the rows of a
``keras.distribution.DeviceMesh`` read against the strategy's replicas
(`tfdist.parallel.tensor_parallel`).

A mesh of data x model devices has one row per data-axis index, and the
data axis is the strategy's replicas: row r lists replica r's model
devices. In one process (no strategy, or a ``MirroredStrategy``) the rows
name this process's devices (``"cpu:2"`` or ``"/device:GPU:1"``). Over the
workers of a ``MultiWorkerMirroredStrategy`` each row names its worker's
devices with their job and task (``"/job:worker/task:1/device:CPU:0"``),
every row on one worker (the model axis moves activations at every split
layer, so it stays inside a process), and each worker runs the rows on
its own task. `mesh_devices` lists them for a strategy, replica by
replica, as ``keras.distribution.list_devices()`` lists a JAX cluster's:

>>> import tfdist
>>> mesh_devices(None, model_devices=2)
['/device:CPU:0', '/device:CPU:1']
"""

from typing import List, Optional, Sequence

import tensorflow as tf

from tfdist.errors import ConfigurationError


def mesh_devices(strategy: Optional[tf.distribute.Strategy], model_devices: int,
                 device_type: str = "CPU") -> List[str]:
    """The devices of a data x model mesh over ``strategy``'s replicas,
    row by row (module doc): replica r's model devices are the ones of
    ``device_type`` from its own device's index on, ``model_devices`` of
    them; over workers, named with each worker's job and task, in the
    order of the strategy's replicas (a chief's first, then the workers').
    Pass them to ``keras.distribution.DeviceMesh((replicas, model_devices),
    ...)``; on CPUs, configure the logical devices first
    (`tfdist.strategies.configure_logical_cpus`)."""
    tasks = _tasks(strategy)
    local = 1 if strategy is None or strategy.num_replicas_in_sync == 1 \
        else len(strategy.extended.worker_devices)
    names = []
    for job, task in tasks:
        for replica in range(local):
            for index in range(model_devices):
                spec = tf.DeviceSpec(job=job, task=task, device_type=device_type,
                                     device_index=replica * model_devices + index)
                names.append(spec.to_string())
    return names


def _tasks(strategy) -> list:
    """``(job, task)`` of each process with replicas, in replica order
    (MultiWorkerMirroredStrategy numbers a chief's replicas first); one
    ``(None, None)`` in one process."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if strategy is None or resolver is None or not _across_workers(strategy):
        return [(None, None)]
    jobs = resolver.cluster_spec().as_dict()
    tasks = []
    for job in ("chief", "worker"):
        count = len(jobs.get(job, [])) if not isinstance(jobs.get(job), dict) else \
            max(jobs[job]) + 1
        tasks += [(job, index) for index in range(count)]
    return tasks


def _across_workers(strategy) -> bool:
    return strategy.num_replicas_in_sync > 1 and \
        strategy.num_replicas_in_sync != len(strategy.extended.worker_devices)


def local_rows(rows: Sequence[Sequence[str]], strategy: Optional[tf.distribute.Strategy],
               data_axis: str, what) -> List[List[str]]:
    """Each local replica's model devices, this process's rows of the
    mesh (``rows``: one per data-axis index), checked against the
    strategy and the devices this process has (module doc); each a
    `tfdist.errors.ConfigurationError` naming the device and what to do."""
    replicas = 1 if strategy is None else strategy.num_replicas_in_sync
    if len(rows) != replicas:
        raise ConfigurationError(
            f"parallel={what!r}: the mesh's data axis ({data_axis!r}) has {len(rows)} rows, "
            f"but the strategy has {replicas} replica(s); the data axis is the strategy's "
            f"replicas. Make them equal (e.g. tfdist.make_strategy('mirrored', num_replicas="
            f"{len(rows)}), and build and compile the model in its scope).")
    specs = [[_spec(device) for device in row] for row in rows]
    flat = [_key(spec) for row in specs for spec in row]
    if len(set(flat)) != len(flat):
        raise ConfigurationError(
            f"parallel={what!r}: the mesh lists a device twice: {[d for r in rows for d in r]}.")
    if strategy is not None and _across_workers(strategy):
        specs = _this_workers_rows(rows, specs, strategy, what)
    known = {(d.device_type, d.device_index)
             for d in map(_spec, (d.name for d in tf.config.list_logical_devices()))}
    missing = [spec.to_string() for row in specs for spec in row
               if (spec.device_type, spec.device_index) not in known]
    if missing:
        raise ConfigurationError(
            f"parallel={what!r}: the mesh names devices this process does not have: "
            f"{missing} (it has {sorted(d.name for d in tf.config.list_logical_devices())}). "
            "On CPUs, configure logical ones first: tfdist.strategies.configure_logical_cpus(n).")
    return [[_local_name(spec, strategy) for spec in row] for row in specs]


def _this_workers_rows(rows, specs, strategy, what) -> list:
    """The rows on this worker's task, each named whole on one task."""
    mine = tf.DeviceSpec.from_string(strategy.extended.worker_devices[0])
    expected = mesh_devices(strategy, len(rows[0]), mine.device_type)
    for row, row_specs in zip(rows, specs):
        places = {(spec.job, spec.task) for spec in row_specs}
        if any(job is None or task is None for job, task in places):
            raise ConfigurationError(
                f"parallel={what!r}: over the workers of a MultiWorkerMirroredStrategy, each "
                f"mesh device names its worker's job and task; row {list(row)} does not. "
                f"For this cluster: tfdist.parallel.mesh_devices(strategy, "
                f"model_devices={len(row)}) gives {expected}.")
        if len(places) != 1:
            raise ConfigurationError(
                f"parallel={what!r}: mesh row {list(row)} spans workers; a replica's model "
                "devices must be one worker's (the model axis moves activations at every "
                f"split layer). For this cluster: {expected}.")
    local = [row for row in specs if (row[0].job, row[0].task) == (mine.job, mine.task)]
    if len(local) != len(strategy.extended.worker_devices):
        raise ConfigurationError(
            f"parallel={what!r}: this worker ({mine.job} {mine.task}) has "
            f"{len(strategy.extended.worker_devices)} replica(s) but the mesh has "
            f"{len(local)} row(s) on it. For this cluster: {expected}.")
    return local


def _local_name(spec: tf.DeviceSpec, strategy) -> str:
    """``spec`` as this process names it: with the worker's job, replica
    and task over workers (as the strategy's own devices are), else bare."""
    if strategy is not None and _across_workers(strategy):
        mine = tf.DeviceSpec.from_string(strategy.extended.worker_devices[0])
        return mine.replace(device_type=spec.device_type,
                            device_index=spec.device_index).to_string()
    return _bare(spec)


def _spec(device: str) -> tf.DeviceSpec:
    spec = tf.DeviceSpec.from_string(device if device.startswith("/") else "/" + device)
    return spec.replace(device_type=(spec.device_type or "").upper(),
                        device_index=spec.device_index or 0)


def _key(spec: tf.DeviceSpec) -> tuple:
    return (spec.job, spec.task, spec.device_type, spec.device_index)


def _bare(spec: tf.DeviceSpec) -> str:
    return tf.DeviceSpec(device_type=spec.device_type,
                         device_index=spec.device_index).to_string()


def canonical(device: str) -> str:
    """``device`` as ``/device:TYPE:INDEX`` (job and task left out)."""
    return _bare(_spec(device))
