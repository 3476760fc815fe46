"""One task of a Slurm job step: build TF_CONFIG from Slurm, run the command.

    srun python -m tfdist.launch.slurm_task -- python train.py --epochs=3

(the line ``tfdist-run --emit=slurm`` writes). Each task reads
``SLURM_JOB_NODELIST``, ``SLURM_TASKS_PER_NODE``, ``SLURM_PROCID`` and
``SLURM_JOB_ID`` (`tfdist.cluster.from_slurm`: one worker per task, task 0
the chief), sets ``TF_CONFIG`` and replaces itself with the command, so
signals and the exit code are the command's own. Ports: those of
``tfdist.cluster.from_slurm()`` (one scheme): ``base + rank on the node``,
the base derived from ``SLURM_JOB_ID`` (`tfdist.cluster.slurm_base_port`)
so two jobs sharing a node do not collide (unless their ids are equal
modulo 1000).
"""

import os
import sys
from typing import Mapping, Optional, Sequence

from tfdist import cluster
from tfdist.errors import ConfigurationError


def base_port(env: Mapping[str, str]) -> int:
    """`tfdist.cluster.slurm_base_port`: ``20000 + 16 * (SLURM_JOB_ID mod 1000)``."""
    return cluster.slurm_base_port(env)


def tf_config(env: Optional[Mapping[str, str]] = None) -> str:
    """This task's TF_CONFIG (JSON) from the Slurm variables in ``env``:
    ``tfdist.cluster.from_slurm(env)``, as JSON."""
    env = os.environ if env is None else env
    return cluster.from_slurm(env).to_json()


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("usage: python -m tfdist.launch.slurm_task -- COMMAND...", file=sys.stderr)
        return 2
    command = argv[argv.index("--") + 1:]
    try:
        os.environ["TF_CONFIG"] = tf_config()
    except ConfigurationError as error:
        print(f"tfdist.launch.slurm_task: {error}", file=sys.stderr)
        return 2
    os.execvp(command[0], command)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
