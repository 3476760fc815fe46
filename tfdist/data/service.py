"""Input pipelines run on the tf.data service, TensorFlow's own engine.

A training worker whose preprocessing needs more CPU than its host has can
hand its pipeline to the tf.data service
(``tf.data.experimental.service``): a dispatcher and worker servers that
run a dataset's graph on other processes or hosts and stream its elements
back. tfdist uses it as it is:

- ``tfdist-run --data_service_workers=K`` starts a dispatcher and ``K``
  service workers beside the training tasks and gives every training task
  the dispatcher's address in ``TFDIST_DATA_SERVICE``; on real hosts,
  ``python -m tfdist.server dispatcher`` and ``python -m tfdist.server
  data_worker`` start them, and the address comes from that variable or
  an argument.
- ``data_service=`` (on `tfdist.DataOptions`, for `tfdist.Trainer` and
  `tfdist.attach`, and on `tfdist.data.distribute`) takes the address, or
  ``"auto"`` for the variable (no service when it is unset).

What runs where, and what stays exact: the dataset of global batches (the
user's whole pipeline, batching included) runs on the service, one job per
training worker and epoch, with sharding OFF: each training worker receives
every global batch in order and then keeps its replicas' slices, exactly as
without the service. With **one** service worker the batches arrive in
their order, so training equals one device (tested on 2 training workers).
With several, OFF would have every service worker produce the whole
dataset (each batch several times), and the service's other modes change
which examples form a batch and their order; tfdist refuses several
service workers under a synchronous strategy rather than train silently
on other data.

Under parameter servers (asynchronous: no step waits for another, so
there is no one-device order to keep) the workers share one job per
epoch with dynamic sharding (`shared_epoch_job`): the dispatcher hands the
dataset's source out in splits, each service worker runs the pipeline on
the splits it gets, and each training worker takes whatever batch is
ready next. Every example is visited at most once per epoch (exactly once
when no service worker fails; a killed service worker's unfinished
splits are lost for that epoch, TensorFlow's dynamic-sharding guarantee),
and K service workers can serve it. The pipeline's source must be
splittable (``range``, ``from_tensor_slices``, file-based readers);
batches form from each service worker's examples, so the last batches of
an epoch may be partial (up to one per service worker).

>>> import tensorflow as tf
>>> from tfdist.data import service
>>> dispatcher = tf.data.experimental.service.DispatchServer()
>>> worker = tf.data.experimental.service.WorkerServer(
...     tf.data.experimental.service.WorkerConfig(dispatcher.target.split("://")[1]))
>>> batches = tf.data.Dataset.range(10).map(lambda x: x * x).batch(4)
>>> [b.numpy().tolist() for b in service.read_through(batches, dispatcher.target)]
[[0, 1, 4, 9], [16, 25, 36, 49], [64, 81]]
"""

import os
from typing import Optional

from tfdist.errors import ConfigurationError

ADDRESS_ENV = "TFDIST_DATA_SERVICE"
WORKERS_ENV = "TFDIST_DATA_SERVICE_WORKERS"  # set by tfdist-run: how many service workers


def resolve(data_service: Optional[str]) -> Optional[str]:
    """The dispatcher address to read through, or None for no service.

    ``None``: no service. ``"auto"``: ``TFDIST_DATA_SERVICE`` if set (by
    ``tfdist-run --data_service_workers``), else no service. Otherwise an
    address, ``host:port`` or ``grpc://host:port``.

    >>> resolve(None), resolve("10.0.0.2:5050")
    (None, 'grpc://10.0.0.2:5050')
    """
    if data_service is None:
        return None
    if not isinstance(data_service, str) or not data_service.strip():
        raise ConfigurationError(
            f"`data_service` ({data_service!r}) must be a dispatcher address "
            "('host:port' or 'grpc://host:port'), 'auto' (TFDIST_DATA_SERVICE), or None.")
    if data_service == "auto":
        address = os.environ.get(ADDRESS_ENV, "").strip()
        return resolve(address) if address else None
    address = data_service.strip()
    host_port = address.split("://", 1)[-1]
    if "://" in address and not address.startswith("grpc://") or ":" not in host_port:
        raise ConfigurationError(
            f"`data_service` ({data_service!r}) is not a dispatcher address: use "
            "'host:port' or 'grpc://host:port' (e.g. 'grpc://10.0.0.2:5050'), or 'auto'.")
    return "grpc://" + host_port


def check_synchronous(strategy_name: str) -> None:
    """Refuses several service workers for a synchronous strategy (module doc)."""
    workers = os.environ.get(WORKERS_ENV)
    if workers and int(workers) > 1:
        raise ConfigurationError(
            f"data_service under {strategy_name} reads every global batch in order, which "
            f"takes one tf.data service worker; TFDIST_DATA_SERVICE_WORKERS is {workers}. "
            "Start one (tfdist-run --data_service_workers=1): with several, each batch "
            "would be produced several times (sharding OFF) or batches would change "
            "(dynamic sharding).")


def shared_epoch_job(dataset, address: str, job_name: str):
    """A function making, wherever it runs (a parameter-server worker),
    ``dataset`` read from the service's job ``job_name`` with dynamic
    sharding: every reader of that name shares one pass over the dataset.

    ``dataset`` is registered with the dispatcher here (on the
    coordinator); the readers only name it.

    >>> import tensorflow as tf
    >>> from tfdist.data import service
    >>> dispatcher = tf.data.experimental.service.DispatchServer()
    >>> workers = [tf.data.experimental.service.WorkerServer(
    ...     tf.data.experimental.service.WorkerConfig(dispatcher.target.split("://")[1]))
    ...     for _ in range(2)]
    >>> read = service.shared_epoch_job(tf.data.Dataset.range(10), dispatcher.target, "epoch-0")
    >>> first, second = iter(read()), iter(read())   # two readers, one pass
    >>> seen = [int(v) for v in first] + [int(v) for v in second]
    >>> sorted(seen)
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (tfdist-run imports this module)

    data_service = tf.data.experimental.service
    dataset_id = data_service.register_dataset(address, dataset).numpy()
    element_spec = dataset.element_spec

    def read():
        return data_service.from_dataset_id(
            processing_mode=data_service.ShardingPolicy.DYNAMIC, service=address,
            dataset_id=dataset_id, element_spec=element_spec, job_name=job_name,
            max_outstanding_requests=1)

    return read


def read_through(dataset, address: str):
    """``dataset`` (a ``tf.data.Dataset``) produced by the service at
    ``address``: a job of its own (one per iterator), sharding OFF, elements
    in order from one worker."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (tfdist-run imports this module)

    return dataset.apply(tf.data.experimental.service.distribute(
        processing_mode=tf.data.experimental.service.ShardingPolicy.OFF, service=address))
