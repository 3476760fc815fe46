"""tfdist-run: start a local multi-worker cluster running one command.

Usage:

    tfdist-run --num_workers=2 -- python strategies/multi_worker_mirrored.py --epochs=3
    tfdist-run --num_workers=2 --num_ps=1 -- python strategies/parameter_server.py
    python -m tfdist.launch --num_workers=2 --max_restarts=1 --log_dir=/tmp/logs -- CMD...

Without --num_ps, every worker runs CMD (MultiWorkerMirroredStrategy). With
--num_ps, CMD runs once as the chief (the coordinator of
ParameterServerStrategy) and the worker and ps tasks run TensorFlow servers
(`python -m tfdist.server`); a worker server that dies is started again on
its address while the coordinator retries its steps. Every task gets its own
TF_CONFIG on free 127.0.0.1 ports. Output
lines are prefixed with the task (``[worker-1] ...``) and, with --log_dir,
also written to ``<log_dir>/worker-1.log``. Ctrl-C or SIGTERM is forwarded
to every task as SIGTERM: tfdist's Trainer stops every task at one step
(saving a checkpoint first, with a checkpoint directory), and whatever still
runs after --grace_period seconds is killed; a second Ctrl-C or SIGTERM
kills every task at once. The last line says what stopped the run and each
task's exit code.

A task stopped by SIGSTOP (or any other stop) for --hang_timeout seconds is
hung: the run fails naming it, as for a task that died.

When a task fails, the others are ended and tfdist-run exits with the failing
task's exit code (128 + N for signal N), after a summary naming that task,
its exit code and its last lines. With --max_restarts=K the whole group is
started again (new ports) up to K times, and training resumes from the
latest checkpoint.

Each task must join the cluster within --start_timeout seconds, which
`tfdist.make_strategy("multi_worker_mirrored")` reports; a task that never
joins ends the run with an error naming it. Use --start_timeout=0 for
programs that do not use tfdist.

Options:
  --num_workers N       worker tasks (required)
  --num_ps N            parameter-server tasks (default 0: no ps)
  --max_restarts K      restarts of the group after a failure (default 0)
  --min_workers M       elastic shrink: a worker that dies before joining on
                        a restart is lost, and the group restarts with one
                        worker fewer, never fewer than M (default: num_workers)
  --log_dir DIR         also write each task's output to DIR/<task>.log
  --start_timeout S     seconds for all tasks to join (default 180; 0: off)
  --grace_period S      seconds between SIGTERM and SIGKILL, and the bound on
                        a stop asked for by SIGTERM / Ctrl-C (default 15)
  --hang_timeout S      seconds a stopped (SIGSTOP) task may stay stopped
                        before the run fails naming it (default 20; 0: off)
  --ports P1,P2,...     fixed ports, one per task (default: free ports)
  --tf_logs             show TensorFlow's C++ start-up and INFO/WARNING lines
                        (hidden on the console by default; --log_dir files
                        keep them; same as TFDIST_TF_LOGS=1, `tfdist.tf_logs`)
"""

import argparse
import os
import sys
from typing import List, Optional, Sequence, Tuple

from tfdist import tf_logs
from tfdist.errors import ConfigurationError
from tfdist.launch.config import LaunchConfig
from tfdist.launch.launcher import launch


def parse_args(argv: Sequence[str]) -> Tuple[LaunchConfig, List[str]]:
    """``argv`` (without the program name) -> (config, command)."""
    argv = list(argv)
    if "--" not in argv:
        raise ConfigurationError(
            "tfdist-run needs the command after `--`, e.g. "
            "`tfdist-run --num_workers=2 -- python train.py`."
        )
    split = argv.index("--")
    own, command = argv[:split], argv[split + 1:]
    if not command:
        raise ConfigurationError("The command after `--` is empty.")
    parser = argparse.ArgumentParser(prog="tfdist-run", description=__doc__.split("\n")[0])
    parser.add_argument("--num_workers", type=int, required=True)
    parser.add_argument("--num_ps", type=int, default=0)
    parser.add_argument("--max_restarts", type=int, default=0)
    parser.add_argument("--min_workers", type=int, default=None)
    parser.add_argument("--log_dir", default=None)
    parser.add_argument("--start_timeout", type=float, default=180.0)
    parser.add_argument("--grace_period", type=float, default=15.0)
    parser.add_argument("--hang_timeout", type=float, default=20.0)
    parser.add_argument("--ports", default=None)
    parser.add_argument("--tf_logs", action="store_true")
    args = parser.parse_args(own)
    if args.tf_logs:  # the tasks inherit it
        os.environ[tf_logs.SWITCH] = "1"
    ports = tuple(int(p) for p in args.ports.split(",")) if args.ports else None
    config = LaunchConfig(
        num_workers=args.num_workers, num_ps=args.num_ps, max_restarts=args.max_restarts,
        min_workers=args.min_workers,
        log_dir=args.log_dir, start_timeout=args.start_timeout,
        grace_period=args.grace_period, hang_timeout=args.hang_timeout, ports=ports,
    )
    return config, command


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``tfdist-run``; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        config, command = parse_args(argv)
        result = launch(config, command)
    except ConfigurationError as error:
        print(f"tfdist-run: {error}", file=sys.stderr)
        return 2
    return result.exit_code


def run() -> None:
    """Console-script wrapper: exits with `main`'s code."""
    sys.exit(main())
