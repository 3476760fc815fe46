"""Kubeflow job definitions: a Trainer v2 ``TrainJob`` (``--emit=trainjob``)
and the v1 ``TFJob`` Kubeflow deprecated (``--emit=tfjob``).

Kubeflow Trainer v2 (``trainer.kubeflow.org/v1alpha1``) runs a ``TrainJob``
on a training runtime: a JobSet template. It has no TensorFlow runtime;
its maintainers' answer for TensorFlow (kubeflow/trainer#2699) is a plain
runtime (an ``mlPolicy`` with no framework policy) and ``TF_CONFIG`` set by
hand. `trainjob_manifests` writes both objects for one job:

- the ``TrainingRuntime``, named like the job: a replicated job ``node``
  (the one the ``TrainJob``'s ``trainer`` fills in: image, command, env,
  ``numNodes``, ``resourcesPerNode``), plus ``chief`` and ``ps`` replicated
  jobs when the job has them;
- the ``TrainJob`` referring to it (``kind: TrainingRuntime``; the default
  kind is ``ClusterTrainingRuntime``).

Every pod's ``TF_CONFIG`` names the JobSet's stable hostnames,
``<job>-<replicated job>-0-<i>.<job>`` (a headless Service named like the
job), and reads its own index from the Indexed Job's completion index:
``TFDIST_TASK_INDEX`` is taken from the pod annotation
``batch.kubernetes.io/job-completion-index``, and Kubernetes expands
``$(TFDIST_TASK_INDEX)`` in the ``TF_CONFIG`` entry after it.

Roles follow tfdist-run's: without ps every worker (and the optional chief)
runs the command; with ps the command runs on the chief only (the
coordinator), workers and ps run ``python -m tfdist.server``, and the
JobSet succeeds when the chief does (servers never exit).
"""

import json
import re
from typing import Dict, List, Optional

from tfdist.errors import ConfigurationError

SERVER_COMMAND = ["python", "-m", "tfdist.server"]

API_VERSION = "trainer.kubeflow.org/v1alpha1"
TRAINER_STEP_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
INDEX_VARIABLE = "TFDIST_TASK_INDEX"
WORKER_JOB = "node"  # the replicated job (and container) Trainer fills in
TRAINJOB_RESTART_POLICIES = ("OnFailure", "Never")  # a Job's pods allow only these
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_LABEL_MAX = 63


# -- Kubeflow Trainer v2 TrainJob -------------------------------------------------


def trainjob_manifests(spec) -> List[dict]:
    """[``TrainingRuntime``, ``TrainJob``] for a `tfdist.launch.emit.JobSpec`."""
    _check_trainjob(spec)
    addresses = trainjob_addresses(spec)
    parameter_servers = spec.num_ps > 0
    worker_command = SERVER_COMMAND if parameter_servers else list(spec.command)
    replicated_jobs = []
    if "chief" in addresses:
        replicated_jobs.append(_role_job(spec, "chief", 1, list(spec.command), addresses))
    if parameter_servers:
        replicated_jobs.append(_role_job(spec, "ps", spec.num_ps, SERVER_COMMAND, addresses))
    replicated_jobs.append({
        "name": WORKER_JOB,
        "template": {
            "metadata": {"labels": {TRAINER_STEP_LABEL: "trainer"}},
            "spec": {"template": {"spec": {
                "restartPolicy": spec.restart_policy,
                "containers": [{"name": WORKER_JOB, "image": spec.image,
                                "ports": [{"containerPort": spec.port, "name": "tf-port"}]}],
            }}},
        },
    })
    jobset = {"replicatedJobs": replicated_jobs}
    if parameter_servers:
        jobset = {"successPolicy": {"operator": "Any", "targetReplicatedJobs": ["chief"]},
                  **jobset}
    runtime = {
        "apiVersion": API_VERSION,
        "kind": "TrainingRuntime",
        "metadata": {"name": spec.name, "labels": {"trainer.kubeflow.org/framework": "tensorflow"}},
        # A plain runtime: no framework policy. Trainer applies
        # resourcesPerNode only when the runtime has an mlPolicy.
        "spec": {"mlPolicy": {"numNodes": 1}, "template": {"spec": jobset}},
    }
    trainer = {
        "numNodes": spec.num_workers,
        "image": spec.image,
        "command": [str(part) for part in worker_command],
        "env": _tf_config_env(addresses, "worker"),
    }
    resources = _resources(spec, spec.gpus)
    if resources:
        trainer["resourcesPerNode"] = resources
    trainjob = {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": spec.name},
        "spec": {
            "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                           "name": spec.name},
            "trainer": trainer,
        },
    }
    return [runtime, trainjob]


def trainjob_addresses(spec) -> Dict[str, List[str]]:
    """TF_CONFIG's cluster for the JobSet's hostnames: {"chief": [...],
    "worker": [...], "ps": [...]} (roles the job has)."""
    def hosts(replicated_job, count):
        return [f"{spec.name}-{replicated_job}-0-{index}.{spec.name}:{spec.port}"
                for index in range(count)]

    addresses = {}
    if spec.chief or spec.num_ps:
        addresses["chief"] = hosts("chief", 1)
    addresses["worker"] = hosts(WORKER_JOB, spec.num_workers)
    if spec.num_ps:
        addresses["ps"] = hosts("ps", spec.num_ps)
    return addresses


def _role_job(spec, role: str, count: int, command: List[str], addresses) -> dict:
    container = {"name": "tensorflow", "image": spec.image,
                 "command": [str(part) for part in command],
                 "env": _tf_config_env(addresses, role),
                 "ports": [{"containerPort": spec.port, "name": "tf-port"}]}
    resources = _resources(spec, 0 if role == "ps" else spec.gpus)
    if resources:
        container["resources"] = resources
    return {
        "name": role,
        "template": {"spec": {
            "parallelism": count,
            "completions": count,
            "template": {"spec": {"restartPolicy": spec.restart_policy,
                                  "containers": [container]}},
        }},
    }


def _tf_config_env(addresses, role: str) -> List[dict]:
    """The env entries that give a pod of ``role`` its TF_CONFIG: its index
    first (from the completion index), then TF_CONFIG, which Kubernetes
    expands ``$(TFDIST_TASK_INDEX)`` in."""
    cluster = json.dumps(addresses, separators=(",", ":"))
    index = "0" if role == "chief" else f"$({INDEX_VARIABLE})"
    tf_config = f'{{"cluster":{cluster},"task":{{"type":"{role}","index":{index}}}}}'
    entries = [{"name": "TF_CONFIG", "value": tf_config}]
    if role != "chief":
        entries.insert(0, {"name": INDEX_VARIABLE,
                           "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}})
    return entries


def _check_trainjob(spec) -> None:
    _check_image(spec, "trainjob")
    if spec.restart_policy not in TRAINJOB_RESTART_POLICIES:
        raise ConfigurationError(
            f"`--restart_policy` ({spec.restart_policy!r}) must be OnFailure or Never for "
            "`--emit=trainjob` (a Job's pods allow only these; JobSet restarts whole jobs).")
    if not _DNS_LABEL.match(spec.name):
        raise ConfigurationError(
            f"`--name` ({spec.name!r}) must be lower-case letters, digits and '-', starting "
            "with a letter, for `--emit=trainjob` (the JobSet's hostnames are made from it).")
    longest = max(f"{spec.name}-{WORKER_JOB}-0-{spec.num_workers - 1}",
                  f"{spec.name}-ps-0-{max(spec.num_ps - 1, 0)}", key=len)
    if len(longest) > _DNS_LABEL_MAX:
        raise ConfigurationError(
            f"`--name` ({spec.name!r}) is too long for `--emit=trainjob`: the hostname "
            f"{longest!r} has {len(longest)} characters, over Kubernetes' {_DNS_LABEL_MAX}. "
            "Use a shorter name.")


# -- Kubeflow Training Operator v1 TFJob (deprecated by Kubeflow) ----------------


def tfjob_manifest(spec) -> dict:
    """The ``TFJob`` object (kubeflow.org/v1) for ``spec``; the training
    operator sets each replica's TF_CONFIG (`tfdist.cluster.from_tfjob`)."""
    _check_image(spec, "tfjob")
    parameter_servers = spec.num_ps > 0
    replicas = {}
    if spec.chief or parameter_servers:
        replicas["Chief"] = _replica_spec(spec, 1, list(spec.command))
    worker_command = SERVER_COMMAND if parameter_servers else list(spec.command)
    replicas["Worker"] = _replica_spec(spec, spec.num_workers, worker_command)
    if parameter_servers:
        replicas["PS"] = _replica_spec(spec, spec.num_ps, SERVER_COMMAND, gpus=0)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": spec.name},
        "spec": {"runPolicy": {"cleanPodPolicy": "Running"}, "tfReplicaSpecs": replicas},
    }


def _replica_spec(spec, count: int, command: List[str], gpus: Optional[int] = None) -> dict:
    container = {
        "name": "tensorflow",  # the operator finds the training container by this name
        "image": spec.image,
        "command": [str(part) for part in command],
    }
    resources = _resources(spec, spec.gpus if gpus is None else gpus)
    if resources:
        container["resources"] = resources
    return {
        "replicas": count,
        "restartPolicy": spec.restart_policy,
        "template": {"spec": {"containers": [container]}},
    }


# -- shared -------------------------------------------------------------------------


def _check_image(spec, kind: str) -> None:
    if not spec.image:
        raise ConfigurationError(
            f"`--emit={kind}` needs `--image=IMAGE`: the container image with tfdist and "
            "your program, e.g. --image=us-docker.pkg.dev/PROJECT/REPO/train:latest.")


def _resources(spec, gpus: int) -> Optional[dict]:
    limits = {}
    if spec.cpu:
        limits["cpu"] = str(spec.cpu)
    if spec.memory:
        limits["memory"] = str(spec.memory)
    if gpus:
        limits["nvidia.com/gpu"] = gpus
    return {"limits": limits} if limits else None
