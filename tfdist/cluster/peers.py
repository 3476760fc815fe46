"""Lost tasks: bounded detection and errors that name the task.

Two kinds of task can be lost mid-run, and TensorFlow reports either as a
raw gRPC error from whatever step touched it next:

* a peer under MultiWorkerMirroredStrategy (`explain_lost_peers`);
* a parameter server under ParameterServerStrategy (`explain_lost_servers`).
  A lost *worker* there is not an error: the coordinator retries its steps.

Each turns the raw error into one naming the task, its address and how to
go on, and lets every other error through unchanged.

Peers are found lost by heartbeats, not by per-collective timeouts.
TensorFlow arms each collective's timeout with a timer thread that lives
until the timeout expires, whether or not the collective finished: at fast
step rates that is thousands of live threads, until the workers abort
(docs/reliability.md#memory, "Threads"). So tfdist runs collectives
without a timeout and bounds the wait on a peer with TensorFlow's
coordination service: every task sends heartbeats to the leader (worker 0)
from one thread. A task that stops
sending them (killed, or stopped by SIGSTOP) makes the service abort the
collectives of every other task; a stopped leader makes the others'
heartbeats fail. Either way the pending step raises, within about one
heartbeat timeout of the fault (measured:
docs/reliability.md#faults-a-lost-or-hung-task).
"""

import contextlib
import re
from typing import Optional

import tensorflow as tf

from tfdist import cluster
from tfdist._internal.tensorflow import coordination
from tfdist.errors import ParameterServerLostError, PeerLostError

_COORDINATED_JOBS = ("chief", "worker")
SHUTDOWN_BARRIER_SECONDS = 5
_ABORTED = "Collective ops is aborted"
_HEARTBEAT = "CoordinationService/Heartbeat"
_UNHEALTHY_TASK = re.compile(r"unhealthy[^\n]*\n\s*/job:(\w+)/replica:\d+/task:(\d+)")
_TASK = re.compile(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)")
_PS_TASK = re.compile(r"/job:ps/replica:\d+/task:(\d+)")


def configure_heartbeats(config: cluster.TFConfig, peer_timeout_seconds: float) -> None:
    """Starts TensorFlow's coordination service with our heartbeat timeout.

    Runs before the strategy is created, which otherwise configures the
    service with TensorFlow's defaults. A process that already configured
    it keeps its own settings.
    """
    coordination.configure(
        tf.train.ClusterSpec(config.cluster), _COORDINATED_JOBS,
        heartbeat_timeout_ms=int(peer_timeout_seconds * 1000),
        # At exit every task waits at a shutdown barrier for the others; a
        # task whose peers already left waits this long, then exits.
        shutdown_barrier_timeout_ms=SHUTDOWN_BARRIER_SECONDS * 1000)


def lost_peer(message: str) -> Optional[str]:
    """``worker-1`` for a collective aborted over a lost peer, else None.

    The service names an unhealthy task ("stopped sending heartbeats"); a
    failed heartbeat RPC means the leader itself is gone.
    """
    if _ABORTED not in message:
        return None
    match = _UNHEALTHY_TASK.search(message)
    if match is None and _HEARTBEAT in message:
        config = cluster.parse_tf_config()
        if config is not None:
            match = _TASK.search(
                coordination.coordination_leader(tf.train.ClusterSpec(config.cluster))
            )
    return f"{match.group(1)}-{match.group(2)}" if match else "a peer task"


def _address(job: str, index: int) -> str:
    config = cluster.parse_tf_config()
    addresses = config.cluster.get(job, []) if config else []
    return f" ({addresses[index]})" if index < len(addresses) else ""


def _how_to_resume(checkpoint_dir: Optional[str]) -> str:
    return (
        f"the Trainer resumes from the latest checkpoint in {checkpoint_dir}"
        if checkpoint_dir else ("pass checkpointing=tfdist.CheckpointOptions(directory=...) "
                                "to resume instead of starting over")
    )


@contextlib.contextmanager
def explain_lost_peers(checkpoint_dir: Optional[str] = None):
    """Turns a collective aborted over a lost peer into `PeerLostError`."""
    try:
        yield
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
            tf.errors.AbortedError, tf.errors.InternalError) as error:
        task = lost_peer(str(error))
        if task is None:
            raise
        job, _, index = task.rpartition("-")
        address = _address(job, int(index)) if index.isdigit() else ""
        raise PeerLostError(
            f"Lost {task}{address}: it stopped answering (killed, stopped or "
            "unreachable), so this task's collectives were aborted. Restart "
            "the cluster (tfdist-run --max_restarts=N does it); "
            f"{_how_to_resume(checkpoint_dir)}. "
            f"TensorFlow said: {str(error).splitlines()[0][:300]}"
        ) from error


@contextlib.contextmanager
def explain_lost_servers(checkpoint_dir: Optional[str] = None):
    """Turns a ps task's connection error into `ParameterServerLostError`.

    The coordinator retries a lost *worker*'s steps elsewhere, but a lost ps
    takes its variables with it.
    """
    try:
        yield
    except (tf.errors.UnavailableError, tf.errors.AbortedError) as error:
        match = _PS_TASK.search(str(error))
        if match is None:
            raise
        index = int(match.group(1))
        raise ParameterServerLostError(
            f"Parameter server ps-{index}{_address('ps', index)} is unreachable, "
            "and training can not go on without the variables it holds. Restart "
            "the cluster (tfdist-run --max_restarts=N does it); "
            f"{_how_to_resume(checkpoint_dir)}. "
            f"TensorFlow said: {str(error).splitlines()[0][:300]}"
        ) from error
