"""How many local CPUs a MultiWorkerMirroredStrategy uses: TensorFlow's
strategy uses every local GPU but exactly one CPU, and chooses its devices
in one private method of its ``CollectiveAllReduceExtended``, called once
while the strategy is built. `local_cpus` swaps that method for that
duration only (`tfdist.strategies.multi_worker`: replicas on logical CPUs).

Pinned by `tests/_internal/test_tensorflow_contract.py` (listed in
`privates`).
"""

import contextlib

from tensorflow.python.distribute import collective_all_reduce_strategy as _cars


@contextlib.contextmanager
def local_cpus(count: int):
    """Within the block, a MultiWorkerMirroredStrategy built without GPUs
    takes ``count`` local CPUs (logical devices already configured) as its
    replicas."""
    extended = _cars.CollectiveAllReduceExtended
    original = extended._initialize_local_devices  # pylint: disable=protected-access

    def with_logical_cpus(self, cluster_resolver, worker_device):
        devices, kind = original(self, cluster_resolver, worker_device)
        if kind == "CPU":
            devices = tuple(f"{worker_device}/device:CPU:{i}" for i in range(count))
        return devices, kind

    extended._initialize_local_devices = with_logical_cpus  # pylint: disable=protected-access
    try:
        yield
    finally:
        extended._initialize_local_devices = original  # pylint: disable=protected-access
