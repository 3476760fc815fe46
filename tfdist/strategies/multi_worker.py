"""``make_strategy("multi_worker_mirrored", ...)``: synchronous training across workers.

>>> import tfdist
>>> strategy = tfdist.make_strategy(            # doctest: +SKIP
...     "multi_worker_mirrored", communication="ring", peer_timeout_seconds=10,
...     num_replicas=2)   # 2 logical CPUs per worker when it has no GPU

Before TensorFlow starts, TF_CONFIG is validated (`tfdist.cluster`), so a
typo is an error naming the field, not a hang. A dead or hung peer is found
by heartbeats (`tfdist.cluster.peers`), not by per-collective timeouts, which cost a
thread per collective: the Trainer then raises `PeerLostError` naming the
task. Creating the strategy ends with a barrier (one
tiny all-reduce) that returns once every worker has joined; then, if the
launcher asked for it (``TFDIST_READY_FILE``), the task reports that it
joined, so `tfdist-run` can tell a task that never joins from a slow one.
"""

from typing import Optional

import tensorflow as tf

from tfdist import cluster
from tfdist._internal import collectives
from tfdist._internal.tensorflow import multi_worker_devices
from tfdist.cluster import peers, stop_signals
from tfdist.errors import ConfigurationError
from tfdist.strategies import local_devices
from tfdist.strategies.local_devices import configure_logical_cpus

_IMPLEMENTATIONS = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def multi_worker_mirrored(
    communication: str = "auto",
    peer_timeout_seconds: float = 10.0,
    timeout_seconds: Optional[float] = None,
    num_replicas: Optional[int] = None,
) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy over TF_CONFIG's workers.

    Args:
      communication: "auto", "ring" or "nccl".
      peer_timeout_seconds: heartbeat timeout: a peer silent this long is
        lost, and every task's pending step raises (measured detection
        times: docs/reliability.md#faults-a-lost-or-hung-task).
      timeout_seconds: an extra timeout on every collective. Off by default:
        TensorFlow keeps a thread per collective alive for this long, so at
        fast step rates threads pile up until the process aborts.
      num_replicas: logical CPUs per worker when it has no GPU.
    """
    config = cluster.parse_tf_config()  # fails fast, before TensorFlow starts
    if config is not None and config.task_type == "evaluator":
        return local_devices.evaluator_strategy()
    if communication not in _IMPLEMENTATIONS:
        raise ConfigurationError(
            f"`communication` ({communication!r}) must be one of {sorted(_IMPLEMENTATIONS)}."
        )
    if not isinstance(peer_timeout_seconds, (int, float)) or peer_timeout_seconds <= 0:
        raise ConfigurationError(
            f"`peer_timeout_seconds` ({peer_timeout_seconds!r}) must be a positive "
            "number of seconds: how long a silent peer may go unnoticed."
        )
    if timeout_seconds is not None and timeout_seconds <= 0:
        raise ConfigurationError(
            f"`timeout_seconds` ({timeout_seconds!r}) must be positive or None."
        )
    gpus = local_devices.physical_devices("GPU")
    cpus = 1
    if num_replicas is not None and not gpus:
        configure_logical_cpus(num_replicas)
        cpus = num_replicas
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=_IMPLEMENTATIONS[communication],
        timeout_seconds=timeout_seconds,
    )
    if config is not None:
        peers.configure_heartbeats(config, peer_timeout_seconds)
    with multi_worker_devices.local_cpus(cpus):
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    # TensorFlow's coordination agent now catches SIGTERM and only logs it;
    # a stop request must still stop this task.
    if config is not None:
        stop_signals.exit_outside_training()
    collectives.barrier(strategy)
    if config is not None:
        cluster.signal_ready()
    return strategy

