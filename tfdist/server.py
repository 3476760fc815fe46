"""``python -m tfdist.server``: a TensorFlow server for a ps or worker task,
or a tf.data service dispatcher or worker.

    python -m tfdist.server                                   # a ps / worker, from TF_CONFIG
    python -m tfdist.server dispatcher --port=5050
    python -m tfdist.server data_worker --dispatcher=10.0.0.1:5050 --port=5051 --host=10.0.0.2

``tfdist-run --data_service_workers=K`` runs the last two as tasks of its
local cluster (`tfdist.data.service`); on real hosts, start them yourself
and give the training tasks ``TFDIST_DATA_SERVICE=grpc://<dispatcher>``.

Under ParameterServerStrategy the chief runs the training program and the
ps and worker tasks only serve: they host variables and run what the
coordinator schedules. This starts such a server from ``TF_CONFIG``,
reports that it is up (``TFDIST_READY_FILE``, for `tfdist-run`), and serves
until it is ended.

Thread pools are kept small: on a machine with few cores, several servers
with default pools (one thread per core each) starve the gRPC threads that
carry their traffic, and steps stall.
"""

import argparse
import os
import sys

from tfdist import cluster, errors


def serve(inter_op_threads: int = 2, intra_op_threads: int = 1) -> None:
    """Starts this task's server and blocks."""
    config = cluster.parse_tf_config()
    if config is None or config.task_type not in ("ps", "worker"):
        raise errors.TFConfigError(
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
    _report_ready(f"{config.task_type}-{config.task_index} serving at {config.address}")
    server.join()


def _report_ready(what: str) -> None:
    ready = os.environ.get(cluster.READY_FILE_ENV)
    if ready:
        with open(ready, "w", encoding="utf-8") as handle:
            handle.write(str(os.getpid()))
    print(f"tfdist.server: {what}", flush=True)


def serve_data_service(role: str, port: int, dispatcher: str = "", host: str = "127.0.0.1"):
    """Starts a tf.data service ``dispatcher`` or ``data_worker`` on ``port`` and blocks."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    service = tf.data.experimental.service
    if role == "dispatcher":
        server = service.DispatchServer(service.DispatcherConfig(port=port))
    else:
        server = service.WorkerServer(service.WorkerConfig(
            dispatcher_address=dispatcher.split("://")[-1], worker_address=f"{host}:{port}",
            port=port))
    _report_ready(f"tf.data service {role} serving at {host}:{port}")
    server.join()


def _data_service_arguments(argv):
    parser = argparse.ArgumentParser(prog="python -m tfdist.server")
    parser.add_argument("role", choices=("dispatcher", "data_worker"))
    parser.add_argument("--port", type=int, required=True, help="the port to serve on")
    parser.add_argument("--dispatcher", default="",
                        help="data_worker: the dispatcher's host:port (required)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="data_worker: the address consumers reach it at")
    args = parser.parse_args(argv)
    if args.role == "data_worker" and not args.dispatcher:
        parser.error("data_worker needs --dispatcher=HOST:PORT (the dispatcher's address)")
    return args


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        args = _data_service_arguments(argv)
        serve_data_service(args.role, args.port, args.dispatcher, args.host)
        return
    try:
        serve()
    except errors.TFConfigError as error:
        print(f"tfdist.server: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
