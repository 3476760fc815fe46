"""``make_strategy("parameter_server", ...)``: asynchronous training with ps tasks.

The training program runs as the chief (the coordinator); ps and worker
tasks run `tfdist.server`. Creating the strategy first checks TF_CONFIG,
then waits, up to ``timeout_seconds``, until every ps and worker server
accepts connections; otherwise it raises an error naming the unreachable
tasks, instead of hanging in TensorFlow's connection retries.

Variables larger than ``min_shard_bytes`` are split into up to
``max_shards`` (default: one per ps task) pieces on their first axis, so a
large embedding table is spread over the ps tasks
(``tf.distribute.experimental.partitioners.MinSizePartitioner``).

Loss semantics: training is asynchronous. Each worker's step is scaled by
that worker's own batch; with more than one worker the result is not the
single-device result (no exactness is claimed). With one worker and a
deterministic schedule it is.
"""

import socket
import time
from typing import Callable, List, Optional

import tensorflow as tf

from tfdist import cluster, errors
from tfdist.errors import ConfigurationError
from tfdist.strategies import local_devices, sharded


def _reachable(address: str, timeout: float) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_servers(config: cluster.TFConfig, timeout_seconds: float) -> None:
    """Returns once every ps and worker accepts connections, or raises."""
    pending = {
        f"{job}-{index}": address
        for job in ("ps", "worker")
        for index, address in enumerate(config.cluster.get(job, []))
    }
    deadline = time.monotonic() + timeout_seconds
    while pending:
        pending = {task: a for task, a in pending.items() if not _reachable(a, 1.0)}
        if pending and time.monotonic() > deadline:
            unreachable = ", ".join(f"{task} ({address})" for task, address in pending.items())
            raise ConfigurationError(
                f"TensorFlow servers of the cluster not reachable after {timeout_seconds:g} s: "
                f"{unreachable}. Start those tasks (`python -m tfdist.server` with "
                "their TF_CONFIG) or fix their addresses in TF_CONFIG."
            )
        if pending:
            time.sleep(0.5)


def parameter_server(
    variable_partitioner: Optional[Callable] = None,
    min_shard_bytes: int = 256 << 10,
    max_shards: Optional[int] = None,
    timeout_seconds: float = 120.0,
) -> tf.distribute.Strategy:
    config = cluster.parse_tf_config()
    if config is None:
        raise errors.TFConfigError(
            "TF_CONFIG is not set; parameter-server training needs a cluster "
            "with 'ps' and 'worker' jobs (tfdist-run --num_ps=... starts one)."
        )
    missing: List[str] = [job for job in ("ps", "worker") if job not in config.cluster]
    if missing:
        raise errors.TFConfigError(
            f"TF_CONFIG: parameter-server training needs jobs {missing} in 'cluster'."
        )
    if config.task_type == "evaluator":
        return local_devices.evaluator_strategy()
    if config.task_type != "chief":
        raise errors.TFConfigError(
            f"TF_CONFIG: the training program runs as the chief; task.type is "
            f"{config.task_type!r}. Run ps and worker tasks with `python -m tfdist.server`."
        )
    wait_for_servers(config, timeout_seconds)
    num_ps = len(config.cluster["ps"])
    if variable_partitioner is None and num_ps > 1:
        variable_partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=min_shard_bytes, max_shards=max_shards or num_ps
        )
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver(),
        variable_partitioner=variable_partitioner,
    )
    sharded.allow_sharded_updates(strategy)
    cluster.signal_ready()
    return strategy

