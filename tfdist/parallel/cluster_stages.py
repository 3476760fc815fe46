"""Pipeline stages on the tasks of a cluster: the first stage on the chief
(the process that runs the training program), one more on each worker.

The workers run TensorFlow servers (``python -m tfdist.server``), as under
parameter servers; the chief connects to them
(``tf.config.experimental_connect_to_cluster``) and its one traced step
places each stage's weights and ops on its task's device. TensorFlow's
runtime sends the activations and gradients between the tasks (Send /
Recv over gRPC); the step is the same as on the devices of one process,
so it is as exact.

``tfdist-run --num_workers=K --workers_serve -- python train.py`` starts
such a cluster on one machine (a chief and K worker servers); on real
hosts each task needs its ``TF_CONFIG`` (cluster ``chief`` and
``worker``), the workers ``python -m tfdist.server``.

    devices = tfdist.parallel.task_devices()   # first: before other TF work
    model = ...                                               # built and compiled
    pipeline = tfdist.parallel.Pipeline(cuts=["block_2"], micro_batches=8, devices=devices)
    tfdist.attach(model, parallel=pipeline).fit(...)

Every wait on another task is bounded: `task_devices` waits at most
``timeout_seconds`` for the servers and names the ones it cannot reach.
A stage's worker that dies mid-step fails the step with TensorFlow's
error (its task named), and `tfdist-run` ends the group and, with
``--max_restarts``, starts it again from the last checkpoint; a worker
stopped (SIGSTOP) is named after ``--hang_timeout``.
"""

from typing import List

import tensorflow as tf

from tfdist import cluster, errors
from tfdist._internal.tensorflow import cluster_views
from tfdist.strategies import parameter_server


def task_devices(timeout_seconds: float = 120.0) -> List[str]:
    """Connects this program (the chief) to the worker servers in
    ``TF_CONFIG`` and returns one device per task: the chief's, then each
    worker's in order (their first GPU where the chief has one, else the
    CPU). Call it before other TensorFlow work: connecting resets
    TensorFlow's context.

    Raises `tfdist.errors.TFConfigError` without a chief and workers in
    ``TF_CONFIG`` or on another task than the chief, and
    `tfdist.errors.ConfigurationError` naming the workers not reachable
    within ``timeout_seconds``.
    """
    config = cluster.parse_tf_config()
    if config is None or "chief" not in config.cluster or "worker" not in config.cluster:
        raise errors.TFConfigError(
            "Pipeline stages on a cluster need TF_CONFIG with a 'chief' (this program) and "
            "'worker' tasks (TensorFlow servers); `tfdist-run --num_workers=K "
            "--workers_serve -- CMD` starts one.")
    if config.task_type != "chief":
        raise errors.TFConfigError(
            f"TF_CONFIG: the training program runs as the chief; task.type is "
            f"{config.task_type!r}. Run the worker tasks with `python -m tfdist.server`.")
    parameter_server.wait_for_servers(config, timeout_seconds)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    # Each worker sees the chief and the other workers (stages send to
    # their neighbours), as ParameterServerStrategy filters its workers'
    # view; without a filter the chief waits forever as it connects.
    view = cluster_views.workers_seeing(len(config.cluster["worker"]),
                                        ["/job:chief", "/job:worker"])
    tf.config.experimental_connect_to_cluster(
        resolver.cluster_spec(), job_name="chief", protocol=resolver.rpc_layer or "grpc",
        cluster_device_filters=view)
    cluster.signal_ready()
    kind = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    workers = len(config.cluster["worker"])
    return ([f"/job:chief/replica:0/task:0/device:{kind}:0"]
            + [f"/job:worker/replica:0/task:{index}/device:{kind}:0" for index in range(workers)])
