"""Job definitions for clusters tfdist-run does not start itself.

``tfdist-run --emit=trainjob`` prints a Kubeflow Trainer v2 ``TrainJob``
and its training runtime; ``--emit=tfjob`` the v1 ``TFJob`` Kubeflow
deprecated, for clusters that still run the v1 training operator (both in
`tfdist.launch.kubeflow`). ``tfdist-run --emit=slurm``
prints an ``sbatch`` script: ``srun`` starts one task per node, and each
task builds its ``TF_CONFIG`` from Slurm's variables
(`tfdist.cluster.from_slurm`, in ``python -m tfdist.launch.slurm_task``).

The roles follow tfdist-run's: without ps tasks every worker (and the
optional chief) runs the command (MultiWorkerMirroredStrategy); with ps
tasks the command runs once, as the chief (the ParameterServerStrategy
coordinator), and workers and ps run ``python -m tfdist.server``.
"""

import dataclasses
import shlex
from typing import Optional, Sequence

from tfdist.errors import ConfigurationError
from tfdist.launch.kubeflow import tfjob_manifest, trainjob_manifests
from tfdist.launch.yaml_text import documents, to_yaml

EMIT_KINDS = ("trainjob", "tfjob", "slurm")
RESTART_POLICIES = ("OnFailure", "Never", "Always", "ExitCode")


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
    port: int = 2222  # Kubernetes: each pod's TensorFlow server port

    def __post_init__(self):
        if self.restart_policy not in RESTART_POLICIES:
            raise ConfigurationError(
                f"`--restart_policy` ({self.restart_policy!r}) must be one of "
                f"{', '.join(RESTART_POLICIES)} (the TFJob replica restart policies; "
                "a TrainJob allows OnFailure and Never).")
        if not isinstance(self.gpus, int) or self.gpus < 0:
            raise ConfigurationError(f"`--gpus` ({self.gpus!r}) must be 0 or more.")
        if not self.name or not all(c.isalnum() or c == "-" for c in self.name):
            raise ConfigurationError(
                f"`--name` ({self.name!r}) must be letters, digits and '-' (a Kubernetes "
                "object name).")


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
    """The text of a ``kind`` ("trainjob", "tfjob" or "slurm") job for ``spec``."""
    if kind == "trainjob":
        return documents(trainjob_manifests(spec))
    if kind == "tfjob":
        return to_yaml(tfjob_manifest(spec)) + "\n"
    if kind == "slurm":
        return slurm_script(spec)
    raise ConfigurationError(f"`--emit` ({kind!r}) must be one of {', '.join(EMIT_KINDS)}.")
