"""Job definitions for clusters tfdist-run does not start itself.

``tfdist-run --emit=tfjob`` prints a Kubeflow ``TFJob`` (kubeflow.org/v1):
the training operator starts the replicas and gives each the ``TF_CONFIG``
tfdist reads (`tfdist.cluster.from_tfjob`). ``tfdist-run --emit=slurm``
prints an ``sbatch`` script: ``srun`` starts one task per node, and each
task builds its ``TF_CONFIG`` from Slurm's variables
(`tfdist.cluster.from_slurm`, in ``python -m tfdist.launch.slurm_task``).

The roles follow tfdist-run's: without ps tasks every worker (and the
optional chief) runs the command (MultiWorkerMirroredStrategy); with ps
tasks the command runs once, as the chief (the ParameterServerStrategy
coordinator), and workers and ps run ``python -m tfdist.server``.
"""

import dataclasses
import json
import shlex
from typing import List, Optional, Sequence

from tfdist.errors import ConfigurationError

EMIT_KINDS = ("tfjob", "slurm")
RESTART_POLICIES = ("OnFailure", "Never", "Always", "ExitCode")
SERVER_COMMAND = ["python", "-m", "tfdist.server"]


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """What to emit: the cluster's shape, the image and the command."""

    command: Sequence[str]
    num_workers: int
    num_ps: int = 0
    chief: bool = False
    image: Optional[str] = None
    name: str = "tfdist"
    restart_policy: str = "OnFailure"
    cpu: Optional[str] = None
    memory: Optional[str] = None
    gpus: int = 0
    time_limit: Optional[str] = None  # Slurm: --time

    def __post_init__(self):
        if self.restart_policy not in RESTART_POLICIES:
            raise ConfigurationError(
                f"`--restart_policy` ({self.restart_policy!r}) must be one of "
                f"{', '.join(RESTART_POLICIES)} (the TFJob replica restart policies).")
        if not isinstance(self.gpus, int) or self.gpus < 0:
            raise ConfigurationError(f"`--gpus` ({self.gpus!r}) must be 0 or more.")
        if not self.name or not all(c.isalnum() or c == "-" for c in self.name):
            raise ConfigurationError(
                f"`--name` ({self.name!r}) must be letters, digits and '-' (a Kubernetes "
                "object name).")


# -- Kubernetes TFJob ---------------------------------------------------------


def tfjob_manifest(spec: JobSpec) -> dict:
    """The ``TFJob`` object (kubeflow.org/v1) for ``spec``."""
    if not spec.image:
        raise ConfigurationError(
            "`--emit=tfjob` needs `--image=IMAGE`: the container image with tfdist and "
            "your program, e.g. --image=us-docker.pkg.dev/PROJECT/REPO/train:latest.")
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


def _replica_spec(spec: JobSpec, count: int, command: List[str], gpus=None) -> dict:
    container = {
        "name": "tensorflow",  # the operator finds the training container by this name
        "image": spec.image,
        "command": [str(part) for part in command],
    }
    limits = {}
    if spec.cpu:
        limits["cpu"] = str(spec.cpu)
    if spec.memory:
        limits["memory"] = str(spec.memory)
    gpus = spec.gpus if gpus is None else gpus
    if gpus:
        limits["nvidia.com/gpu"] = gpus
    if limits:
        container["resources"] = {"limits": limits}
    return {
        "replicas": count,
        "restartPolicy": spec.restart_policy,
        "template": {"spec": {"containers": [container]}},
    }


def to_yaml(value, indent: int = 0) -> str:
    """Block-style YAML for dicts, lists, strings, numbers and booleans
    (strings are JSON-quoted, which YAML reads as the same strings)."""
    pad = "  " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:\n{to_yaml(item, indent + 1)}")
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
        return "\n".join(lines)
    if isinstance(value, list):
        lines = []
        for item in value:
            if isinstance(item, dict) and item:
                first, *rest = to_yaml(item, indent + 1).split("\n")
                lines.append(f"{pad}- {first.lstrip()}")
                lines.extend(rest)
            else:
                lines.append(f"{pad}- {_scalar(item)}")
        return "\n".join(lines)
    return pad + _scalar(value)


def _scalar(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (dict, list)):  # empty
        return json.dumps(value)
    return json.dumps(str(value))


# -- Slurm ----------------------------------------------------------------------


def slurm_script(spec: JobSpec) -> str:
    """An ``sbatch`` script: one task per node, each a worker."""
    if spec.num_ps or spec.chief:
        raise ConfigurationError(
            "`--emit=slurm` starts workers only (MultiWorkerMirroredStrategy): drop "
            "`--num_ps` / `--chief`, or run parameter servers with `--emit=tfjob`.")
    directives = [
        f"--job-name={spec.name}",
        f"--nodes={spec.num_workers}",
        "--ntasks-per-node=1",
        f"--output={spec.name}-%j.out",
    ]
    if spec.cpu:
        directives.append(f"--cpus-per-task={spec.cpu}")
    if spec.memory:
        directives.append(f"--mem={spec.memory}")
    if spec.gpus:
        directives.append(f"--gpus-per-node={spec.gpus}")
    if spec.time_limit:
        directives.append(f"--time={spec.time_limit}")
    command = " ".join(shlex.quote(str(part)) for part in spec.command)
    lines = ["#!/bin/bash"] + [f"#SBATCH {d}" for d in directives] + [
        "# Made by `tfdist-run --emit=slurm`. Each task builds its TF_CONFIG from",
        "# SLURM_JOB_NODELIST / SLURM_TASKS_PER_NODE / SLURM_PROCID, on ports derived",
        "# from SLURM_JOB_ID (tfdist.cluster.from_slurm), then runs the command.",
        "set -euo pipefail",
        "srun --kill-on-bad-exit=1 python -m tfdist.launch.slurm_task -- " + command,
    ]
    return "\n".join(lines) + "\n"


def emit(kind: str, spec: JobSpec) -> str:
    """The text of a ``kind`` ("tfjob" or "slurm") job for ``spec``."""
    if kind == "tfjob":
        return to_yaml(tfjob_manifest(spec)) + "\n"
    if kind == "slurm":
        return slurm_script(spec)
    raise ConfigurationError(f"`--emit` ({kind!r}) must be one of {', '.join(EMIT_KINDS)}.")
