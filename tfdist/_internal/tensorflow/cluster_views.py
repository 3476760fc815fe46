"""Which tasks a cluster's worker servers see: the device filters
``tf.config.experimental_connect_to_cluster`` takes, which have no public
class (`tfdist.parallel.cluster_stages`: a pipeline's chief connects to
worker servers that must see each other to send between stages).

Pinned by `tests/_internal/test_tensorflow_contract.py` (listed in
`privates`).

>>> filters = workers_seeing(2, ["/job:chief", "/job:worker"])
>>> type(filters).__name__
'ClusterDeviceFilters'
"""

from typing import Sequence

from tensorflow.python.training import server_lib


def workers_seeing(num_workers: int, visible: Sequence[str]):
    """Device filters by which each of ``num_workers`` worker tasks sees the
    jobs ``visible`` (``"/job:chief"``, ...) and nothing else."""
    filters = server_lib.ClusterDeviceFilters()
    for index in range(num_workers):
        filters.set_device_filters("worker", index, list(visible))
    return filters
