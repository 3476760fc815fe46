"""What managed training platforms set, turned into a TF_CONFIG.

Vertex AI custom jobs set ``CLUSTER_SPEC`` (worker pools ``workerpool0`` to
``workerpool3``: the primary replica, workers, parameter servers,
evaluator), and for TensorFlow containers also ``TF_CONFIG``. SageMaker
training jobs set ``SM_HOSTS`` (a JSON list of host names) and
``SM_CURRENT_HOST``, and with a ``distribution`` also ``TF_CONFIG``.
`platform_tf_config` reads whichever is there when ``TF_CONFIG`` is not, and
returns the TF_CONFIG dict; `tfdist.cluster.parse_tf_config` (so
``make_strategy``) uses it and exports ``TF_CONFIG`` for TensorFlow.

Each malformed variable is an error naming it, its value and what is
expected. Only the standard library is used: this runs before TensorFlow.
"""

import json
from typing import Mapping, Optional

from tfdist.errors import PlatformEnvironmentError

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


def from_vertex(env: Mapping[str, str]) -> dict:
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
    return {"cluster": cluster,
            "task": {"type": VERTEX_POOLS[pool], "index": spec["task"].get("index", 0)}}


def from_sagemaker(env: Mapping[str, str], port: int = SAGEMAKER_PORT) -> dict:
    """The TF_CONFIG dict of a SageMaker host: every host a worker (sorted,
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
    return {"cluster": {"worker": [f"{host}:{port}" for host in hosts]},
            "task": {"type": "worker", "index": hosts.index(current)}}


def platform_tf_config(env: Mapping[str, str]) -> Optional[dict]:
    """The TF_CONFIG dict a platform's variables describe, or None: Vertex AI
    (``CLUSTER_SPEC``), then SageMaker with 2+ hosts (``SM_HOSTS``)."""
    if env.get("CLUSTER_SPEC", "").strip():
        return from_vertex(env)
    if env.get("SM_HOSTS", "").strip():
        config = from_sagemaker(env)
        return config if len(config["cluster"]["worker"]) > 1 else None
    return None
