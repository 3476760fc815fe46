"""The runner contract's cases (`tests/loops/runner_contract.py`) on
`CoordinatorRunner`, over an in-process cluster of one worker and one
parameter server (TensorFlow servers in this process, as TensorFlow's
parameter-server tutorial makes them). Prints the observations as JSON.

Run by `tests/loops/test_runner_contract.py`: connecting to a cluster
changes the process for good, so it runs in a process of its own.
"""

import json
import socket
import sys

import tensorflow as tf

from tests.loops import runner_contract
from tfdist.loops.runners import CoordinatorRunner


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main():
    spec = {"worker": [f"127.0.0.1:{_free_port()}"], "ps": [f"127.0.0.1:{_free_port()}"]}
    cluster = tf.train.ClusterSpec(spec)
    servers = [tf.distribute.Server(cluster, job_name=job, task_index=0, protocol="grpc",
                                    start=True) for job in ("worker", "ps")]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    observed = runner_contract.observe(CoordinatorRunner, strategy, "coordinator")
    print(json.dumps(observed))
    sys.stdout.flush()
    del servers


if __name__ == "__main__":
    main()
