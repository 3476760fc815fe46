"""Everything replicas and workers agree on, in one place.

tfdist communicates across replicas for three reasons only, and each has one
function here:

* `all_reduce_sum`: global counts a replica can not read from its batch
  (loss denominators under Keras masks, the example count without a
  carried count column, synchronized batch statistics over real rows),
  and the batch's gradient when the optimizer clips (`tfdist.replica.gradients`);
* `sum_over_replicas` / `any_worker`: host-side agreements, each in its own
  small function: the stop agreement (SIGTERM / Ctrl-C on any worker stops
  every worker at the same step; `tfdist.loops.agreement`, about once a second)
  and choices that decide which collectives run;
* `barrier`: every worker has joined the cluster.

`function` makes tfdist's own ``tf.function``s whose collectives keep the
instance keys of their trace, so a worker's memory does not grow per call.

Otherwise gradient sums belong to the optimizer (``apply_gradients``) and metric
totals are reduced by Keras when read. The exceptions are sharded optimizer
state (`tfdist.communication.sharding`), whose gradients are reduce-scattered
(`reduce_scatter_sum`) and whose updated slices are all-gathered, and fully
sharded weights (`tfdist.communication.fully_sharded`), gathered when a step
reads them (`all_gather_rows`), their gradients reduce-scattered; and rows
exchanged between every pair of replicas in numbers each pair chooses
(`tfdist._internal.row_exchange`: the all-to-all under tables sharded by
vocabulary).
"""

import contextlib
import functools
from typing import Optional

import tensorflow as tf
from tensorflow.python.distribute import cross_device_utils as _cross_device_utils

from tfdist._internal import collective_shapes

# Variable-shaped collectives keep fixed keys safely: one key per padded size.
collective_shapes.install()


def spans_workers(strategy: tf.distribute.Strategy) -> bool:
    """Whether ``strategy`` is a MultiWorkerMirroredStrategy over 2+ workers."""
    return (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and getattr(strategy.extended, "_num_workers", 1) > 1)


def uses_instance_keys(strategy: tf.distribute.Strategy) -> bool:
    """Whether ``strategy`` reduces with TensorFlow's collective ops
    (MultiWorkerMirroredStrategy, on any number of workers and replicas):
    there each eager reduction, such as reading a replica-local variable
    outside a function, takes a new instance key whose record stays, so
    tfdist's reads and resets run in a `function` instead."""
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def all_reduce_sum(value):
    """Sums ``value`` (a tensor or a structure of them) over all replicas.

    Call in replica context (inside ``strategy.run``).
    """
    context = tf.distribute.get_replica_context()
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)


def sum_over_replicas(strategy: tf.distribute.Strategy, values) -> tf.Tensor:
    """The sum over every replica of ``values`` (the same tensor on each of
    a worker's replicas): the same result on every worker.

    Call in cross-replica context, inside a ``tf.function``.
    """
    per_replica = strategy.run(lambda: tf.identity(tf.cast(values, tf.float32)))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


def any_worker(strategy: tf.distribute.Strategy, requested) -> tf.Tensor:
    """True on every worker when any worker passed a true ``requested``.

    Call in cross-replica context, inside a ``tf.function``.
    """
    return sum_over_replicas(strategy, requested) > 0


def replica_launcher(strategy: tf.distribute.Strategy, replica: int):
    """The collective launcher of local replica ``replica`` (its index in
    the whole group) when ``strategy`` reduces with TensorFlow's collective
    ops (MultiWorkerMirroredStrategy; MirroredStrategy with
    ``CollectiveAllReduce``); None otherwise."""
    cross_device_ops = getattr(strategy.extended, "_cross_device_ops", None)
    launchers = getattr(cross_device_ops, "_launchers", None)
    if not launchers:
        return None
    return launchers[replica % len(launchers)]


def group_launcher(strategy: tf.distribute.Strategy, devices, replica: int):
    """The collective launcher of replica ``replica`` (its index in the
    whole group) in a group of the strategy's size over other devices than
    its replicas': ``devices``, one per local replica in their order (a
    tensor-parallel shard's copies, `tfdist.communication.FullySharded`
    with the model axis), so a collective runs where its operands live,
    not on each replica's first device. The strategy's own launcher when
    ``devices`` are its replicas'; None when it does not reduce with
    collective ops (`replica_launcher`).

    Every worker must ask for its groups in the same order (TensorFlow
    numbers a new group's key by the order it is first asked for), as
    every worker attaches the same model the same way."""
    cross_device_ops = getattr(strategy.extended, "_cross_device_ops", None)
    launchers = getattr(cross_device_ops, "_launchers", None)
    if not launchers:
        return None
    # pylint: disable=protected-access
    devices = tuple(_full_name(d) for d in devices)
    if devices == tuple(_full_name(l._device) for l in launchers):
        return launchers[replica % len(launchers)]
    groups = cross_device_ops.__dict__.setdefault("_tfdist_device_groups", {})
    if devices not in groups:
        keys, first = cross_device_ops._collective_keys, launchers[0]
        group_key = keys.get_group_key(devices)
        groups[devices] = [_cross_device_utils.CollectiveReplicaLauncher(
            group_key, first._group_size, keys, device, first._options) for device in devices]
    return groups[devices][replica % len(devices)]


def subgroup_launcher(strategy: tf.distribute.Strategy, devices, member: Optional[int]):
    """The collective launcher of ``devices[member]`` in a group of
    ``len(devices)`` members over ``devices`` (full names, in this process
    or another: `replica_devices`), a subset of the strategy's replicas
    (`tfdist.communication.gossip`'s pairs of neighbours). ``member``
    None: only the group's key, for a group without a device here. None
    when the strategy does not reduce with collective ops
    (`replica_launcher`).

    Every worker must ask for every group, its own or not, in the same
    order: TensorFlow numbers a new group's key by the order it is first
    asked for (`group_launcher`)."""
    cross_device_ops = getattr(strategy.extended, "_cross_device_ops", None)
    launchers = getattr(cross_device_ops, "_launchers", None)
    if not launchers:
        return None
    # pylint: disable=protected-access
    devices = tuple(_full_name(d) for d in devices)
    keys = cross_device_ops._collective_keys
    groups = cross_device_ops.__dict__.setdefault("_tfdist_subgroups", {})
    if devices not in groups:  # (the key now; a member's launcher when first asked for)
        # A new key even where a group over the same devices exists: two
        # replicas of one worker are a pair, and also the strategy's group
        # there (TensorFlow keys groups by their local devices).
        groups[devices] = [keys.get_group_key(devices + ("tfdist-subgroup",))] + [
            None] * len(devices)
    group = groups[devices]
    if member is None:
        return None
    if group[1 + member] is None:
        group[1 + member] = _cross_device_utils.CollectiveReplicaLauncher(
            group[0], len(devices), keys, devices[member], launchers[0]._options)
    return group[1 + member]


def replica_devices(strategy: tf.distribute.Strategy) -> list:
    """Every replica's device, full names, in the order of the replicas'
    ids (``replica_id_in_sync_group``): this process's replicas under
    MirroredStrategy; under MultiWorkerMirroredStrategy each task's (the
    chief first, then the workers by index: TensorFlow's ids in the
    cluster), each task with the same local devices as this one."""
    local = [tf.DeviceSpec.from_string(_full_name(d)) for d in strategy.extended.worker_devices]
    resolver = getattr(strategy, "cluster_resolver", None)
    spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
    tasks = [("chief", 0)] if spec.get("chief") else []
    tasks += [("worker", index) for index in range(len(spec.get("worker", [])))]
    if len(tasks) < 2:
        return [device.to_string() for device in local]
    return [device.replace(job=job, task=task).to_string()
            for job, task in tasks for device in local]


def local_replica_ids(strategy: tf.distribute.Strategy) -> list:
    """The ids of this process's replicas (positions in `replica_devices`)."""
    local = {_full_name(d) for d in strategy.extended.worker_devices}
    return [index for index, device in enumerate(replica_devices(strategy)) if device in local]


def _full_name(device: str) -> str:
    """``device`` named in full (job, replica, task: a variable's copies'
    devices and a launcher's are; a short name is this process's)."""
    spec = tf.DeviceSpec.from_string(device)
    return spec.replace(job=spec.job or "localhost", replica=spec.replica or 0,
                        task=spec.task or 0).to_string()


def reduce_scatter_sum(launcher, rows: tf.Tensor) -> tf.Tensor:
    """Row ``r`` of ``rows`` (shape ``[N, length]``, one row per replica)
    summed over every replica, on replica ``r``: a reduce-scatter.

    TensorFlow's CPU collectives have no reduce-scatter (its op runs on
    NCCL alone: "did not find collective implementation"), so this is an
    all-to-all (row ``j`` goes to replica ``j``) and a sum of the N rows
    received, in replica order. Each replica sends and receives
    ``(N - 1) / N`` of ``rows``: a ring reduce-scatter's bytes. Call in
    replica context with the replica's `replica_launcher`.
    """
    from tensorflow.python.ops import collective_ops  # pylint: disable=import-outside-toplevel

    received = _launch(launcher, collective_ops.all_to_all_v2, rows)
    with tf.device(launcher._device):  # pylint: disable=protected-access
        return tf.reduce_sum(received, axis=0)


def all_gather_rows(launcher, local: tf.Tensor) -> tf.Tensor:
    """Every replica's ``local`` (the same static shape on each), one after
    the other in replica order along axis 0: one all-gather op, where
    ``ReplicaContext.all_gather`` runs two (it gathers the shapes first).
    Call in replica context with the replica's `replica_launcher`."""
    from tensorflow.python.ops import collective_ops  # pylint: disable=import-outside-toplevel

    return _launch(launcher, collective_ops.all_gather_v2, local)


def _launch(launcher, collective, tensor: tf.Tensor, instance_key=None) -> tf.Tensor:
    """``collective`` (a ``collective_ops`` v2 op) of ``tensor`` in
    ``launcher``'s group, on its device, with ``instance_key`` (by default
    its next one), its ordering token (collectives of one replica run in the
    order traced), its communication hint and its timeout."""
    # pylint: disable=protected-access
    if instance_key is None:
        instance_key = launcher._next_instance_key()
    ordering_token = launcher._get_ordering_token()
    options = launcher._options
    with tf.device(launcher._device):
        return collective(
            tensor, launcher._group_size, launcher._group_key, instance_key,
            communication_hint=options.implementation.value,
            timeout=options.timeout_seconds, ordering_token=ordering_token)


def barrier(strategy: tf.distribute.Strategy) -> None:
    """Returns once every worker has joined (one tiny all-reduce)."""

    @tf.function
    def all_reduce_one():
        return strategy.reduce(
            tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None
        )

    all_reduce_one()


@contextlib.contextmanager
def _instance_keys_fixed_at_trace():
    """Collectives traced inside take their instance keys at trace time.

    TensorFlow's default (``_prefer_unique_instance_key``) draws a new key for
    every call of a function, and each worker's collective param resolver
    keeps a record per key that it never frees: memory per collective op
    per host call under MultiWorkerMirroredStrategy, which grows without
    bound in a long run (docs/reliability.md#memory). TensorFlow reads the
    flag while it traces, so the flag is off only while tfdist's functions
    are called (and, at their first call, traced).
    """
    launcher = _cross_device_utils.CollectiveReplicaLauncher
    previous = launcher._prefer_unique_instance_key  # pylint: disable=protected-access
    launcher._prefer_unique_instance_key = False  # pylint: disable=protected-access
    try:
        yield
    finally:
        launcher._prefer_unique_instance_key = previous  # pylint: disable=protected-access


def function(python_function, **tf_function_options):
    """``tf.function(python_function)`` whose collectives keep the instance
    keys they got when traced, instead of a new key per call.

    Keys fixed at trace time must be the same on every worker, so every
    worker must trace the function at the same point of the same sequence of
    collectives: true of tfdist's loops, agreements and multi-worker metric
    reads (`tfdist.replica.metrics`), whose traces depend only on global values
    (type specs of the distributed data, global step counts, metric
    variable counts), never on a worker's own shapes. Functions that may
    retrace on one worker alone (``reduce_retracing`` over per-worker
    shapes, as in predict's last batch) and users' own functions keep
    TensorFlow's default.
    """
    traced = tf.function(python_function, **tf_function_options)

    @functools.wraps(python_function)
    def call(*args, **kwargs):
        with _instance_keys_fixed_at_trace():
            return traced(*args, **kwargs)

    return call
