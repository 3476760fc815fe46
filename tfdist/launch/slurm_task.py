"""One task of a Slurm job step: build TF_CONFIG from Slurm, run the command.

    srun python -m tfdist.launch.slurm_task -- python train.py --epochs=3

(the line ``tfdist-run --emit=slurm`` writes). Each task reads
``SLURM_JOB_NODELIST``, ``SLURM_TASKS_PER_NODE`` and ``SLURM_PROCID``
(`tfdist.cluster.from_slurm`: one worker per task, task 0 the chief), sets
``TF_CONFIG`` and replaces itself with the command, so signals and the exit
code are the command's own. Ports: ``base + rank on the node``, the base
derived from ``SLURM_JOB_ID`` so two jobs sharing a node do not collide
(unless their ids are equal modulo 1000).
"""

import os
import sys
from typing import Mapping, Optional, Sequence

from tfdist import cluster
from tfdist.errors import ConfigurationError

BASE_PORT, PORT_BLOCK, JOB_SLOTS = 20000, 16, 1000


def base_port(env: Mapping[str, str]) -> int:
    """``20000 + 16 * (SLURM_JOB_ID mod 1000)``: a block of 16 ports per job
    (up to 16 tasks per node), between 20000 and 35999."""
    job_id = env.get("SLURM_JOB_ID", "0")
    if not job_id.isdigit():
        raise ConfigurationError(f"SLURM_JOB_ID ({job_id!r}) is not a number.")
    return BASE_PORT + PORT_BLOCK * (int(job_id) % JOB_SLOTS)


def tf_config(env: Optional[Mapping[str, str]] = None) -> str:
    """This task's TF_CONFIG (JSON) from the Slurm variables in ``env``."""
    env = os.environ if env is None else env
    return cluster.from_slurm(env, base_port=base_port(env)).to_json()


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
