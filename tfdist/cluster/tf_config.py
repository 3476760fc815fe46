"""Who am I: TF_CONFIG parsed, validated and built; task roles; resolvers.

TensorFlow reads ``TF_CONFIG`` deep inside strategy creation and reports a
mistake, if at all, as a hang or a gRPC error. `parse_tf_config` checks it
first, without starting TensorFlow, and names the field and value:

>>> from tfdist.cluster import parse_tf_config
>>> config = parse_tf_config('{"cluster": {"worker": ["127.0.0.1:2222",'
...     ' "127.0.0.1:2223"]}, "task": {"type": "worker", "index": 1}}')
>>> config.task_type, config.task_index, config.num_workers, config.is_chief
('worker', 1, 2, False)

`build_tf_config` makes one from host lists (the launcher uses it);
`from_slurm` and `from_tfjob` resolve the cluster of a Slurm allocation or
of a Kubernetes TFJob.
"""

import dataclasses
import json
import os
import re
from typing import Dict, List, Mapping, Optional

from tfdist.errors import TFConfigError

JOB_NAMES = ("chief", "worker", "ps", "evaluator")
# Set by tfdist-run: a task writes this file once it has joined the cluster.
READY_FILE_ENV = "TFDIST_READY_FILE"
# Slurm tasks' ports: a block of SLURM_PORT_BLOCK per job id mod SLURM_JOB_SLOTS.
_ADDRESS = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.\-]+):(?P<port>\d+)$")



@dataclasses.dataclass(frozen=True)
class TFConfig:
    """A validated TF_CONFIG: the cluster and this process's task.

    >>> from tfdist import cluster
    >>> config = cluster.build_tf_config({"chief": ["host0:2222"], "worker": ["host1:2222"]},
    ...                                  "worker", 0)
    >>> config.num_workers, config.is_chief, config.address
    (2, False, 'host1:2222')
    >>> config.to_json()      # what TF_CONFIG holds
    '{"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"]}, "task": {"type": "worker", "index": 0}}'
    """

    cluster: Dict[str, List[str]]
    task_type: str
    task_index: int

    @property
    def num_workers(self) -> int:
        """Tasks that train: the chief (if any) plus the workers."""
        return len(self.cluster.get("chief", [])) + len(self.cluster.get("worker", []))

    @property
    def is_chief(self) -> bool:
        """The chief task, or worker 0 when the cluster has no chief."""
        if "chief" in self.cluster:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    @property
    def address(self) -> Optional[str]:
        """This task's ``host:port``, None for an evaluator outside the cluster."""
        tasks = self.cluster.get(self.task_type)
        return tasks[self.task_index] if tasks else None

    def to_json(self) -> str:
        return json.dumps(
            {"cluster": self.cluster,
             "task": {"type": self.task_type, "index": self.task_index}}
        )


def _fail(message: str) -> None:
    raise TFConfigError(f"TF_CONFIG: {message}")


def _validate_address(job: str, index: int, address) -> None:
    where = f"cluster.{job}[{index}]"
    if not isinstance(address, str):
        _fail(f"{where} must be a 'host:port' string; got {address!r}.")
    match = _ADDRESS.match(address)
    if not match:
        _fail(f"{where} ({address!r}) is not a 'host:port' address.")
    port = int(match.group("port"))
    if not 0 < port < 65536:
        _fail(f"{where} ({address!r}) has port {port}, outside 1-65535.")


def validate(raw: Mapping) -> TFConfig:
    """Checks a decoded TF_CONFIG dict; returns the `TFConfig`.

    >>> from tfdist import cluster
    >>> cluster.validate({"cluster": {"worker": ["h1:2222", "h2:2222"]},
    ...                   "task": {"type": "worker", "index": 1}}).task_index
    1
    """
    if not isinstance(raw, Mapping):
        _fail(f"must be a JSON object; got {type(raw).__name__}.")
    cluster, task = raw.get("cluster"), raw.get("task")
    if not isinstance(cluster, Mapping) or not cluster:
        _fail(f"'cluster' must be a non-empty object of job name -> addresses; got {cluster!r}.")
    if not isinstance(task, Mapping):
        _fail(f"'task' must be an object with 'type' and 'index'; got {task!r}.")
    seen: Dict[str, str] = {}
    for job, addresses in cluster.items():
        if job not in JOB_NAMES:
            _fail(f"unknown job name {job!r} in 'cluster'; expected one of {JOB_NAMES}.")
        if not isinstance(addresses, list) or not addresses:
            _fail(f"cluster.{job} must be a non-empty list of 'host:port'; got {addresses!r}.")
        for index, address in enumerate(addresses):
            _validate_address(job, index, address)
            if address in seen:
                _fail(f"address {address!r} is used twice: by {seen[address]} and {job}[{index}].")
            seen[address] = f"{job}[{index}]"
    if len(cluster.get("chief", [])) > 1:
        _fail(f"cluster.chief may have one task; got {len(cluster['chief'])}.")
    task_type, task_index = task.get("type"), task.get("index", 0)
    if task_type not in JOB_NAMES:
        _fail(f"task.type ({task_type!r}) must be one of {JOB_NAMES}.")
    if task_type not in cluster and task_type != "evaluator":
        _fail(f"task.type ({task_type!r}) is not a job in 'cluster' ({sorted(cluster)}).")
    if not isinstance(task_index, int) or isinstance(task_index, bool):
        _fail(f"task.index ({task_index!r}) must be an integer.")
    size = len(cluster.get(task_type, [])) or 1
    if not 0 <= task_index < size:
        _fail(f"task.index ({task_index}) is out of range for job {task_type!r} with {size} task(s).")
    return TFConfig(
        cluster={job: list(addresses) for job, addresses in cluster.items()},
        task_type=task_type,
        task_index=task_index,
    )


def parse_tf_config(text: Optional[str] = None) -> Optional[TFConfig]:
    """Parses ``text`` (default: the ``TF_CONFIG`` variable); None if unset.

    Without ``text`` and ``TF_CONFIG``, a managed platform's variables
    (Vertex AI ``CLUSTER_SPEC``, SageMaker ``SM_HOSTS``: `tfdist.cluster.platforms`)
    give the config, which is then exported as ``TF_CONFIG`` for TensorFlow.

    >>> from tfdist import cluster
    >>> config = cluster.parse_tf_config('{"cluster": {"worker": ["h1:2222", "h2:2222"]},'
    ...                                  ' "task": {"type": "worker", "index": 0}}')
    >>> config.task_type, config.task_index, config.is_chief
    ('worker', 0, True)
    """
    if text is None:
        text = os.environ.get("TF_CONFIG", "")
        if not text.strip():
            from tfdist.cluster import platforms  # pylint: disable=import-outside-toplevel

            config = platforms.platform_tf_config(os.environ)
            if config is not None:  # exported for TensorFlow's own resolver
                os.environ["TF_CONFIG"] = config.to_json()
            return config
    if not text.strip():
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise TFConfigError(
            f"TF_CONFIG is not valid JSON ({error.msg} at line {error.lineno} "
            f"column {error.colno}): {text[:200]!r}"
        ) from error
    return validate(raw)


def _current(config: Optional[TFConfig]) -> Optional[TFConfig]:
    return config if config is not None else parse_tf_config()


def is_chief(config: Optional[TFConfig] = None) -> bool:
    """True for the chief (or worker 0), and for a job without TF_CONFIG.
    Each of these functions reads ``TF_CONFIG`` when given no ``config``.

    >>> from tfdist import cluster
    >>> config = cluster.build_tf_config({"chief": ["host0:2222"], "worker": ["host1:2222"]},
    ...                                  "worker", 0)
    >>> cluster.is_chief(config), cluster.task_type(config), cluster.task_id(config)
    (False, 'worker', 0)
    """
    config = _current(config)
    return True if config is None else config.is_chief


def task_type(config: Optional[TFConfig] = None) -> Optional[str]:
    """This task's job name (``"chief"``, ``"worker"``, ``"ps"``,
    ``"evaluator"``); None without TF_CONFIG.

    >>> from tfdist import cluster
    >>> cluster.task_type(cluster.build_tf_config({"ps": ["h0:2222"], "worker": ["h1:2222"]},
    ...                                           "ps", 0))
    'ps'
    """
    config = _current(config)
    return None if config is None else config.task_type


def task_id(config: Optional[TFConfig] = None) -> int:
    """This task's index in its job; 0 without TF_CONFIG.

    >>> from tfdist import cluster
    >>> cluster.task_id(cluster.build_tf_config({"worker": ["h1:2222", "h2:2222"]}, "worker", 1))
    1
    """
    config = _current(config)
    return 0 if config is None else config.task_index


def task_name(config: Optional[TFConfig] = None) -> str:
    """``"<type>-<index>"`` of this task (``"worker-0"`` without TF_CONFIG),
    as tfdist-run names tasks in its output.

    >>> from tfdist import cluster
    >>> config = cluster.build_tf_config({"chief": ["host0:2222"], "worker": ["host1:2222"]},
    ...                                  "worker", 0)
    >>> cluster.task_name(config)
    'worker-0'
    """
    return f"{task_type(config) or 'worker'}-{task_id(config)}"


def num_workers(config: Optional[TFConfig] = None) -> int:
    """Training tasks in the cluster (chief and workers); 1 without TF_CONFIG.

    >>> from tfdist import cluster
    >>> config = cluster.build_tf_config({"chief": ["host0:2222"], "worker": ["host1:2222"]},
    ...                                  "worker", 0)
    >>> cluster.num_workers(config)
    2
    """
    config = _current(config)
    return 1 if config is None else config.num_workers


def build_tf_config(
    cluster: Mapping[str, List[str]], task_type: str, task_index: int
) -> TFConfig:
    """A validated `TFConfig` for one task of ``cluster`` (job -> addresses).

    >>> from tfdist import cluster
    >>> config = cluster.build_tf_config({"worker": ["h1:2222", "h2:2222"]}, "worker", 1)
    >>> config.address, config.is_chief
    ('h2:2222', False)
    """
    return validate(
        {"cluster": {job: list(a) for job, a in cluster.items()},
         "task": {"type": task_type, "index": task_index}}
    )


def signal_ready() -> None:
    """Tells the launcher this task has joined the cluster (if it asked).

    `tfdist-run` sets ``TFDIST_READY_FILE`` per task, so it can tell a task
    that never joins from a slow one. ``make_strategy`` calls it; without
    the variable it does nothing.

    >>> from tfdist import cluster
    >>> cluster.signal_ready()
    """
    path = os.environ.get(READY_FILE_ENV)
    if path:
        with open(path, "w", encoding="utf-8") as ready:
            ready.write(str(os.getpid()))
