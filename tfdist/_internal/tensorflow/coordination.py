"""TensorFlow's coordination service, configured by tfdist before a
MultiWorkerMirroredStrategy starts it with TensorFlow's defaults: the
heartbeat timeout that finds a lost peer (`tfdist.cluster.peers`).

TensorFlow's public API has neither the configuration call (an eager
context method) nor the service's leader (the task the others report to),
nor the job message that names the coordinated jobs. Pinned by
`tests/_internal/test_tensorflow_contract.py` (listed in `privates`).

>>> import tensorflow as tf
>>> coordination_leader(tf.train.ClusterSpec({"worker": ["a:1", "b:2"]}))
'/job:worker/replica:0/task:0'
"""

from typing import Sequence

import tensorflow as tf
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.eager import context


def coordination_leader(spec: tf.train.ClusterSpec) -> str:
    """The task the coordination service runs on (``/job:chief/...``, else
    the first worker)."""
    return multi_worker_util.coordination_leader(spec)


def configure(spec: tf.train.ClusterSpec, jobs: Sequence[str], *, heartbeat_timeout_ms: int,
              shutdown_barrier_timeout_ms: int) -> bool:
    """Configures this process's coordination service for ``jobs`` of
    ``spec`` (those that it has); returns False, changing nothing, when the
    process configured one already (it keeps its own settings)."""
    if context.context().coordination_service is not None:
        return False
    coordinated = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=spec.num_tasks(job))
                   for job in jobs if job in spec.jobs]
    context.context().configure_coordination_service(
        service_type="standalone", service_leader=coordination_leader(spec),
        heartbeat_timeout_in_ms=heartbeat_timeout_ms,
        shutdown_barrier_timeout_in_ms=shutdown_barrier_timeout_ms,
        coordinated_jobs=coordinated)
    return True
