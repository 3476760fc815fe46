"""The strategies tests run on, in one place: the in-process columns
(logical CPU devices, `tests/conftest.py` makes 4) and the two real-cluster
columns (tasks started by ``tfdist-run`` with their own TF_CONFIG).

The ``make_strategy`` fixture, the conformance matrix and the cluster tests
all draw from here; a combination that does not apply skips with its reason
where the test decides it.
"""

import contextlib
import dataclasses
from typing import List

import tensorflow as tf

import tfdist

IN_PROCESS = {"one_device": 1, "mirrored_2": 2, "mirrored_3": 3, "mirrored_4": 4}


def in_process(replicas: int):
    """One device for 1 replica, else MirroredStrategy on ``replicas`` logical CPUs."""
    if replicas == 1:
        return tfdist.make_strategy("one_device")
    return tfdist.make_strategy("mirrored", num_replicas=replicas)


@contextlib.contextmanager
def collectives_bounded(strategy, seconds: float):
    """Within the block, the collectives ``strategy``'s steps trace time out
    after ``seconds`` (a deadlock fails the test instead of hanging the
    suite). MirroredStrategy takes no timeout, so its launchers' options
    are set (TensorFlow reads them when it traces a collective)."""
    launchers = getattr(getattr(strategy.extended, "_cross_device_ops", None), "_launchers", [])
    before = [launcher._options for launcher in launchers]  # pylint: disable=protected-access
    for launcher in launchers:
        launcher._options = tf.distribute.experimental.CommunicationOptions(  # pylint: disable=protected-access
            timeout_seconds=seconds)
    try:
        yield
    finally:
        for launcher, options in zip(launchers, before):
            launcher._options = options  # pylint: disable=protected-access


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A real cluster column.

    Attributes:
      launcher_args: ``tfdist-run``'s arguments.
      strategy: the name the program passes to `tfdist.make_strategy`.
      reporting_tasks: the tasks that write results (every worker, or the chief).
    """

    launcher_args: List[str]
    strategy: str
    reporting_tasks: List[str]


CLUSTERS = {
    "multi_worker_2": Cluster(["--num_workers=2"], "multi_worker_mirrored",
                              ["worker-0", "worker-1"]),
    "ps_1_worker": Cluster(["--num_workers=1", "--num_ps=1"], "parameter_server", ["chief-0"]),
}
