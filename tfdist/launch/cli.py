"""tfdist-run: start a local multi-worker cluster running one command.

Usage:

    tfdist-run --num_workers=2 -- python strategies/multi_worker_mirrored.py --epochs=3
    tfdist-run --num_workers=2 --num_ps=1 -- python strategies/parameter_server.py
    tfdist-run --num_workers=2 --workers_serve -- python pipeline_on_three_tasks.py
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
  --workers_serve       CMD runs once, as a chief, and the N workers run
                        TensorFlow servers that hold a pipeline's stages
                        (tfdist.parallel.cluster_stages); no ps tasks
  --data_service_workers K
                        also run a tf.data service dispatcher and K service
                        workers (tasks data-dispatcher, data-worker-0..); every
                        training task gets TFDIST_DATA_SERVICE=grpc://<dispatcher>,
                        which data_service="auto" reads (default 0: none)
  --evaluator           also run an evaluator task (evaluator-0): the same
                        command, whose fit evaluates each new checkpoint in
                        the checkpoint directory on fit's validation data
                        beside training; it never fails or stops training
  --evaluator_timeout S seconds the evaluator may take, once training is
                        done, to evaluate the last checkpoint (default 120)
  --max_restarts K      restarts of the group after a failure (default 0)
  --bandwidth RATE      run every task in a network namespace whose loopback
                        is limited to RATE (a tc rate: 1gbit, 10gbit, 500mbit),
                        one link all tasks share; Linux and root only
  --host_discovery SCRIPT
                        elastic growth: SCRIPT prints how many workers can run
                        (an integer, or host[:slots] lines); the group starts
                        at its answer (between --min_workers and
                        --num_workers) and, when the answer changes, stops at
                        a checkpoint and starts again at the new size
                        (programs need a checkpoint directory:
                        CheckpointOptions(directory=...))
  --discovery_interval S
                        seconds between runs of the script (default 5)
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
                        keep them; same as TFDIST_TF_LOGS=1)
  -h, --help            print this manual and exit

Job definitions for other clusters (printed, nothing started; `emit`):

    tfdist-run --emit=trainjob --image=IMAGE --num_workers=2 [--num_ps=1] [--chief] -- CMD...
    tfdist-run --emit=slurm --num_workers=4 [--gpus=1] [--time=02:00:00] -- CMD... > job.sbatch

  --emit KIND           trainjob (a Kubeflow Trainer v2 TrainJob and its
                        TrainingRuntime), tfjob (a Kubeflow v1 TFJob: Kubeflow
                        deprecated TFJob; for clusters still on the v1 training
                        operator) or slurm (an sbatch script)
  --image IMAGE         the container image (trainjob, tfjob; required)
  --chief               add a chief that also runs CMD (trainjob, tfjob; implied
                        with ps)
  --name NAME           the job name (default tfdist; trainjob: lower case, it
                        names the pods' hostnames)
  --port P              each pod's TensorFlow port (trainjob; default 2222)
  --restart_policy P    OnFailure (default) or Never; tfjob also Always, ExitCode
  --cpu N, --memory M, --gpus G
                        resources per replica / node (e.g. --cpu=4 --memory=16Gi)
  --time T              Slurm time limit (--time of sbatch)
"""

import argparse
import os
import sys
from typing import List, Optional, Sequence, Tuple

from tfdist._internal import tf_logs
from tfdist.errors import ConfigurationError
from tfdist.launch.config import LaunchConfig
from tfdist.launch.emit import emit, EMIT_KINDS, JobSpec
from tfdist.launch.network import exec_limited, inside
from tfdist.launch.launcher import launch


def _split(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """tfdist-run's own arguments and the command after ``--``."""
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
    return own, command


def parse_args(argv: Sequence[str]) -> Tuple[LaunchConfig, List[str]]:
    """``argv`` (without the program name) -> (config, command)."""
    own, command = _split(argv)
    parser = argparse.ArgumentParser(prog="tfdist-run", description=__doc__.split("\n")[0])
    parser.add_argument("--num_workers", type=int, required=True)
    parser.add_argument("--num_ps", type=int, default=0)
    parser.add_argument("--workers_serve", action="store_true")
    parser.add_argument("--data_service_workers", type=int, default=0)
    parser.add_argument("--bandwidth", default=None)
    parser.add_argument("--max_restarts", type=int, default=0)
    parser.add_argument("--evaluator", action="store_true")
    parser.add_argument("--evaluator_timeout", type=float, default=120.0)
    parser.add_argument("--min_workers", type=int, default=None)
    parser.add_argument("--host_discovery", default=None)
    parser.add_argument("--discovery_interval", type=float, default=5.0)
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
        num_workers=args.num_workers, num_ps=args.num_ps, workers_serve=args.workers_serve,
        max_restarts=args.max_restarts,
        min_workers=args.min_workers, data_service_workers=args.data_service_workers,
        evaluator=args.evaluator, evaluator_timeout=args.evaluator_timeout,
        host_discovery=args.host_discovery, discovery_interval=args.discovery_interval,
        bandwidth=args.bandwidth,
        log_dir=args.log_dir, start_timeout=args.start_timeout,
        grace_period=args.grace_period, hang_timeout=args.hang_timeout, ports=ports,
    )
    return config, command


def parse_emit_args(argv: Sequence[str]) -> Tuple[str, JobSpec]:
    """``argv`` with ``--emit`` -> (kind, job spec)."""
    own, command = _split(argv)
    parser = argparse.ArgumentParser(prog="tfdist-run --emit")
    parser.add_argument("--emit", required=True)
    parser.add_argument("--num_workers", type=int, required=True)
    parser.add_argument("--num_ps", type=int, default=0)
    parser.add_argument("--chief", action="store_true")
    parser.add_argument("--image", default=None)
    parser.add_argument("--name", default="tfdist")
    parser.add_argument("--restart_policy", default="OnFailure")
    parser.add_argument("--cpu", default=None)
    parser.add_argument("--memory", default=None)
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--time", default=None)
    parser.add_argument("--port", type=int, default=2222)
    args = parser.parse_args(own)
    if args.emit not in EMIT_KINDS:
        raise ConfigurationError(
            f"`--emit` ({args.emit!r}) must be one of {', '.join(EMIT_KINDS)}.")
    LaunchConfig(num_workers=args.num_workers, num_ps=args.num_ps)  # validates the counts
    return args.emit, JobSpec(
        command=command, num_workers=args.num_workers, num_ps=args.num_ps, chief=args.chief,
        image=args.image, name=args.name, restart_policy=args.restart_policy,
        cpu=args.cpu, memory=args.memory, gpus=args.gpus, time_limit=args.time,
        port=args.port)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``tfdist-run``; returns the exit code.

    >>> import contextlib, io
    >>> from tfdist.launch import main
    >>> script = io.StringIO()
    >>> with contextlib.redirect_stdout(script):
    ...     code = main(["--emit=slurm", "--num_workers=2", "--", "python", "train.py"])
    >>> code, script.getvalue().splitlines()[-1]
    (0, 'srun --kill-on-bad-exit=1 python -m tfdist.launch.slurm_task -- python train.py')
    """
    argv = sys.argv[1:] if argv is None else argv
    own = argv[:argv.index("--")] if "--" in argv else argv
    if "-h" in own or "--help" in own:
        print(__doc__.strip())
        return 0
    try:
        if any(a == "--emit" or a.startswith("--emit=") for a in _split(argv)[0]):
            kind, spec = parse_emit_args(argv)
            sys.stdout.write(emit(kind, spec))
            return 0
        config, command = parse_args(argv)
        if config.bandwidth and not inside(config.bandwidth):
            exec_limited(config.bandwidth, [sys.executable, "-m", "tfdist.launch", *argv])
        result = launch(config, command)
    except ConfigurationError as error:
        print(f"tfdist-run: {error}", file=sys.stderr)
        return 2
    return result.exit_code


def run() -> None:
    """Console-script wrapper: exits with `main`'s code."""
    sys.exit(main())
