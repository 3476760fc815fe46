"""``python -m tfdist.server``: a TensorFlow server for a ps or worker task.

Under ParameterServerStrategy the chief runs the training program and the
ps and worker tasks only serve: they host variables and run what the
coordinator schedules. This starts such a server from ``TF_CONFIG``,
reports that it is up (``TFDIST_READY_FILE``, for `tfdist-run`), and serves
until it is ended.

Thread pools are kept small: on a machine with few cores, several servers
with default pools (one thread per core each) starve the gRPC threads that
carry their traffic, and steps stall.
"""

import os
import sys

from tfdist import cluster


def serve(inter_op_threads: int = 2, intra_op_threads: int = 1) -> None:
    """Starts this task's server and blocks."""
    config = cluster.parse_tf_config()
    if config is None or config.task_type not in ("ps", "worker"):
        raise cluster.TFConfigError(
            "tfdist.server needs TF_CONFIG with task.type 'ps' or 'worker'; got "
            f"{None if config is None else config.task_type!r}."
        )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    server = tf.distribute.Server(
        tf.train.ClusterSpec(config.cluster),
        job_name=config.task_type,
        task_index=config.task_index,
        protocol="grpc",
        config=tf.compat.v1.ConfigProto(
            inter_op_parallelism_threads=inter_op_threads,
            intra_op_parallelism_threads=intra_op_threads,
        ),
        start=True,
    )
    ready = os.environ.get(cluster.READY_FILE_ENV)
    if ready:
        with open(ready, "w", encoding="utf-8") as handle:
            handle.write(str(os.getpid()))
    print(f"tfdist.server: {config.task_type}-{config.task_index} serving at "
          f"{config.address}", flush=True)
    server.join()


def main() -> None:
    try:
        serve()
    except cluster.TFConfigError as error:
        print(f"tfdist.server: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
