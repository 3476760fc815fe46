"""What cluster managers and training platforms set, turned into a TF_CONFIG:
every resolver returns a validated `tfdist.cluster.TFConfig`.

Slurm job steps set ``SLURM_JOB_NODELIST`` / ``SLURM_TASKS_PER_NODE`` /
``SLURM_PROCID`` (`from_slurm`); a Kubernetes TFJob's operator sets
``TF_CONFIG`` (`from_tfjob`). Vertex AI custom jobs set ``CLUSTER_SPEC`` (worker pools ``workerpool0`` to
``workerpool3``: the primary replica, workers, parameter servers,
evaluator), and for TensorFlow containers also ``TF_CONFIG``. SageMaker
training jobs set ``SM_HOSTS`` (a JSON list of host names) and
``SM_CURRENT_HOST``, and with a ``distribution`` also ``TF_CONFIG``.
`platform_tf_config` reads whichever is there when ``TF_CONFIG`` is not;
`tfdist.cluster.parse_tf_config` (so ``make_strategy``) uses it and exports
``TF_CONFIG`` for TensorFlow.

Each malformed variable is an error naming it, its value and what is
expected. Only the standard library is used: this runs before TensorFlow.
"""

import json
import os
import re
from typing import List, Mapping, Optional

from tfdist.cluster.tf_config import TFConfig, build_tf_config, parse_tf_config, validate
from tfdist.errors import PlatformEnvironmentError, TFConfigError

SLURM_BASE_PORT, SLURM_PORT_BLOCK, SLURM_JOB_SLOTS = 20000, 16, 1000

# Vertex AI worker pools -> TF_CONFIG jobs (workerPoolSpecs[0..3]).
VERTEX_POOLS = {"workerpool0": "chief", "workerpool1": "worker", "workerpool2": "ps",
                "workerpool3": "evaluator"}
SAGEMAKER_PORT = 2222



def _json(env: Mapping[str, str], name: str, expected: str):
    try:
        return json.loads(env[name])
    except json.JSONDecodeError as error:
        raise PlatformEnvironmentError(
            f"{name} is not valid JSON ({error.msg}): {env[name][:200]!r}; expected "
            f"{expected}.") from error


def from_vertex(env: Mapping[str, str]) -> TFConfig:
    """The TF_CONFIG dict of a Vertex AI replica, from ``CLUSTER_SPEC``."""
    if "CLUSTER_SPEC" not in env:
        raise PlatformEnvironmentError(
            "CLUSTER_SPEC is not set: not inside a Vertex AI custom job?")
    expected = ('{"cluster": {"workerpool0": ["host:port"], ...}, '
                '"task": {"type": "workerpool0", "index": 0}}')
    spec = _json(env, "CLUSTER_SPEC", expected)
    if not isinstance(spec, dict) or not isinstance(spec.get("cluster"), dict) \
            or not isinstance(spec.get("task"), dict):
        raise PlatformEnvironmentError(
            f"CLUSTER_SPEC ({env['CLUSTER_SPEC'][:200]!r}) needs 'cluster' and 'task' "
            f"objects: {expected}.")
    unknown = sorted(set(spec["cluster"]) - set(VERTEX_POOLS))
    pool = spec["task"].get("type")
    if unknown or pool not in VERTEX_POOLS:
        raise PlatformEnvironmentError(
            f"CLUSTER_SPEC names worker pools {unknown or [pool]}; Vertex AI's are "
            f"{', '.join(VERTEX_POOLS)}.")
    if "workerpool0" not in spec["cluster"]:
        raise PlatformEnvironmentError(
            "CLUSTER_SPEC has no 'workerpool0': Vertex AI jobs need the primary replica "
            "(workerPoolSpecs[0], replicaCount 1).")
    # As Vertex's own TF_CONFIG: the primary replica is the chief (it also
    # trains under MultiWorkerMirroredStrategy), then workers, ps, evaluator.
    cluster = {VERTEX_POOLS[name]: addresses for name, addresses in spec["cluster"].items()}
    return validate({"cluster": cluster,
                     "task": {"type": VERTEX_POOLS[pool], "index": spec["task"].get("index", 0)}})


def from_sagemaker(env: Mapping[str, str], port: int = SAGEMAKER_PORT) -> TFConfig:
    """The TF_CONFIG of a SageMaker host: every host a worker (sorted,
    so every host computes the same list), on ``port``."""
    for name in ("SM_HOSTS", "SM_CURRENT_HOST"):
        if name not in env:
            raise PlatformEnvironmentError(
                f"{name} is not set: not inside a SageMaker training job?")
    hosts = _json(env, "SM_HOSTS", 'a list of host names, e.g. ["algo-1", "algo-2"]')
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
        raise PlatformEnvironmentError(
            f"SM_HOSTS ({env['SM_HOSTS'][:200]!r}) must be a non-empty JSON list of host "
            'names, e.g. ["algo-1", "algo-2"].')
    hosts = sorted(hosts)
    current = env["SM_CURRENT_HOST"]
    if current not in hosts:
        raise PlatformEnvironmentError(
            f"SM_CURRENT_HOST ({current!r}) is not one of SM_HOSTS ({hosts}).")
    return build_tf_config({"worker": [f"{host}:{port}" for host in hosts]}, "worker",
                           hosts.index(current))


def platform_tf_config(env: Mapping[str, str]) -> Optional[TFConfig]:
    """The TF_CONFIG a platform's variables describe, or None: Vertex AI
    (``CLUSTER_SPEC``), then SageMaker with 2+ hosts (``SM_HOSTS``)."""
    if env.get("CLUSTER_SPEC", "").strip():
        return from_vertex(env)
    if env.get("SM_HOSTS", "").strip():
        config = from_sagemaker(env)
        return config if len(config.cluster["worker"]) > 1 else None
    return None


def expand_slurm_nodelist(nodelist: str) -> List[str]:
    """Slurm's compressed host list, expanded.

    >>> from tfdist import cluster
    >>> cluster.expand_slurm_nodelist("node[01-03,07],gpu5")
    ['node01', 'node02', 'node03', 'node07', 'gpu5']
    """
    hosts = []
    for match in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist):
        prefix, ranges = match.group(1), match.group(2)
        if not ranges:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            width = len(low)
            for number in range(int(low), int(high or low) + 1):
                hosts.append(f"{prefix}{number:0{width}d}")
    return hosts


def _expand_tasks_per_node(value: str) -> List[int]:
    """``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts = []
    for part in value.split(","):
        match = re.match(r"^(\d+)(?:\(x(\d+)\))?$", part.strip())
        if not match:
            raise TFConfigError(f"SLURM_TASKS_PER_NODE ({value!r}) is not understood.")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def slurm_base_port(env: Mapping[str, str] = None) -> int:
    """The first port of this Slurm job's tasks on each node:
    ``20000 + 16 * (SLURM_JOB_ID mod 1000)``, a block of 16 ports per job (up
    to 16 tasks per node) between 20000 and 35999, so two jobs sharing a node
    do not collide (unless their ids are equal modulo 1000). Without
    ``SLURM_JOB_ID``: 20000.

    >>> from tfdist import cluster
    >>> cluster.slurm_base_port({"SLURM_JOB_ID": "4242"})
    23872
    """
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID", "0")
    if not job_id.isdigit():
        raise TFConfigError(
            f"SLURM_JOB_ID ({job_id!r}) is not a number. Run inside a Slurm job "
            "(sbatch / srun set it), or pass `base_port=` explicitly.")
    return SLURM_BASE_PORT + SLURM_PORT_BLOCK * (int(job_id) % SLURM_JOB_SLOTS)


def from_slurm(env: Mapping[str, str] = None, *, base_port: Optional[int] = None) -> TFConfig:
    """The cluster of a Slurm job step: one worker per task (task 0 is chief).

    Task ``i`` on a node listens on ``base_port + its rank on that node``;
    ``base_port`` defaults to `slurm_base_port` (derived from
    ``SLURM_JOB_ID``), the ports ``python -m tfdist.launch.slurm_task`` (the
    ``tfdist-run --emit=slurm`` scripts) uses.

    >>> from tfdist import cluster
    >>> env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[3-4]",
    ...        "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_PROCID": "1"}
    >>> config = cluster.from_slurm(env)
    >>> config.cluster["worker"], config.task_index, config.is_chief
    (['node3:23872', 'node3:23873', 'node4:23872', 'node4:23873'], 1, False)
    """
    env = os.environ if env is None else env
    for name in ("SLURM_JOB_NODELIST", "SLURM_PROCID", "SLURM_TASKS_PER_NODE"):
        if name not in env:
            raise TFConfigError(f"{name} is not set: not inside a Slurm job step (srun)?")
    if base_port is None:
        base_port = slurm_base_port(env)
    hosts = expand_slurm_nodelist(env["SLURM_JOB_NODELIST"])
    per_node = _expand_tasks_per_node(env["SLURM_TASKS_PER_NODE"])
    if len(per_node) != len(hosts):
        raise TFConfigError(
            f"SLURM_TASKS_PER_NODE ({env['SLURM_TASKS_PER_NODE']!r}) describes "
            f"{len(per_node)} nodes but SLURM_JOB_NODELIST has {len(hosts)}."
        )
    workers = [
        f"{host}:{base_port + rank}" for host, count in zip(hosts, per_node) for rank in range(count)
    ]
    return build_tf_config({"worker": workers}, "worker", int(env["SLURM_PROCID"]))


def from_tfjob(env: Mapping[str, str] = None) -> TFConfig:
    """The cluster of a Kubernetes TFJob (its operator sets TF_CONFIG).

    The operator's extra keys (``environment``, ``rpc_layer``) are allowed.

    >>> import json
    >>> from tfdist import cluster
    >>> env = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["run-worker-0:2222"]},
    ...                                 "task": {"type": "worker", "index": 0},
    ...                                 "environment": "cloud"})}
    >>> cluster.from_tfjob(env).address
    'run-worker-0:2222'
    """
    env = os.environ if env is None else env
    if "TF_CONFIG" not in env:
        raise TFConfigError("TF_CONFIG is not set: not inside a TFJob replica?")
    return parse_tf_config(env["TF_CONFIG"])
