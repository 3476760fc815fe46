"""This process among the processes that run the training program: what
Horovod's ``hvd.rank()``, ``hvd.size()``, ``hvd.local_rank()``,
``hvd.local_size()`` and "rank 0" gave, on every strategy and launcher.

Read from ``TF_CONFIG`` (as `tfdist.cluster.tf_config` reads it), so it
answers before TensorFlow starts:

- no ``TF_CONFIG`` (one device, MirroredStrategy, a Cloud TPU's single
  client): one process, rank 0, the chief;
- MultiWorkerMirroredStrategy (``tfdist-run``, Slurm, Kubeflow, Vertex AI,
  SageMaker, Ray, Spark): the chief first if the cluster has one, then the
  workers in order; "local" groups the processes by the host in their
  address, in rank order (under ``tfdist-run`` every task is on 127.0.0.1);
- ParameterServerStrategy: the coordinator (the chief) is the one process
  that runs the program; workers and ps run ``python -m tfdist.server``.

Replicas are not processes: a process drives every local device, so the
batch and learning-rate arithmetic Horovod did with ``hvd.size()`` uses
``strategy.num_replicas_in_sync``.

>>> from tfdist import cluster
>>> config = cluster.build_tf_config(
...     {"chief": ["host0:2222"], "worker": ["host0:2223", "host1:2222"]}, "worker", 1)
>>> cluster.training_process(config)
TrainingProcess(rank=2, size=3, local_rank=0, local_size=1, is_chief=False)
>>> cluster.training_process(None).rank      # without TF_CONFIG (when none is set)
0
"""

import dataclasses
from typing import List, Optional

from tfdist.cluster.tf_config import TFConfig, parse_tf_config
from tfdist.errors import ConfigurationError

_UNSET = object()


@dataclasses.dataclass(frozen=True)
class TrainingProcess:
    """This process's place: ``rank`` in 0..``size``-1 (the chief is 0),
    ``local_rank`` in 0..``local_size``-1 among those on its host."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    is_chief: bool


def training_process(config=_UNSET) -> TrainingProcess:
    """This process among the training processes; reads ``TF_CONFIG`` when
    given no ``config`` (``None``: a process without one).

    An evaluator, or a worker or ps of a parameter-server cluster, runs no
    part of the training program: asking there is an error naming the task.
    """
    if config is _UNSET:
        config = parse_tf_config()
    if config is None:
        return TrainingProcess(rank=0, size=1, local_rank=0, local_size=1, is_chief=True)
    tasks = _training_tasks(config)
    me = (config.task_type, config.task_index)
    if me not in tasks:
        runs = ("runs `python -m tfdist.server` under ParameterServerStrategy; the chief "
                "(the coordinator) runs the program" if "ps" in config.cluster
                else "evaluates beside training")
        raise ConfigurationError(
            f"This task, {config.task_type}-{config.task_index}, is not a training process: "
            f"it {runs}.")
    hosts = [_host(config.cluster[job][index]) for job, index in tasks]
    rank = tasks.index(me)
    local = [position for position, host in enumerate(hosts) if host == hosts[rank]]
    return TrainingProcess(rank=rank, size=len(tasks), local_rank=local.index(rank),
                           local_size=len(local), is_chief=config.is_chief)


def _training_tasks(config: TFConfig) -> List[tuple]:
    """(job, index) of every process that runs the program, in rank order."""
    chiefs = [("chief", index) for index in range(len(config.cluster.get("chief", [])))]
    if "ps" in config.cluster:
        return chiefs
    return chiefs + [("worker", index) for index in range(len(config.cluster.get("worker", [])))]


def _host(address: Optional[str]) -> str:
    return address.rsplit(":", 1)[0]
