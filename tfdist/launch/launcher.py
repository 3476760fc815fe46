"""`launch(config, command)`: run a local cluster to completion, with restarts."""

import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from typing import Optional, Sequence

from tfdist import cluster
from tfdist.data import service
from tfdist.errors import ConfigurationError
from tfdist.launch.network import inside
from tfdist.launch.config import LaunchConfig
from tfdist.launch.decisions import Action, Facts, decide
from tfdist.launch.discovery import SCRIPT_TIMEOUT, HostDiscovery
from tfdist.launch.group import ProcessGroup
from tfdist.launch.tasks import GroupResult, TaskSpec
from tfdist.launch.ports import check_ports_free, free_ports


SERVER_COMMAND = (sys.executable, "-m", "tfdist.server")


def _cluster_layout(config: LaunchConfig, ports: Sequence[int]):
    addresses = iter(f"{config.host}:{port}" for port in ports)
    if not config.has_chief:
        return {"worker": [next(addresses) for _ in range(config.num_workers)]}
    layout = {"chief": [next(addresses)],
              "worker": [next(addresses) for _ in range(config.num_workers)]}
    if config.num_ps:
        layout["ps"] = [next(addresses) for _ in range(config.num_ps)]
    return layout


def _data_service_tasks(config: LaunchConfig, ports: Sequence[int], ready_dir: str):
    """A dispatcher and the tf.data service workers (servers), on the last
    ports. Under parameter servers a dead service worker is started again
    at its address, as a worker server is (dynamic sharding hands it new
    splits only); under synchronous strategies it is not (a respawned
    worker would produce its jobs' data again), nor is the dispatcher
    (it holds the jobs)."""
    if not config.data_service_workers:
        return [], {}
    dispatcher, *workers = ports[-(1 + config.data_service_workers):]
    tasks = []
    for name, arguments in [("data-dispatcher", ["dispatcher"])] + [
            (f"data-worker-{index}", ["data_worker", f"--dispatcher={config.host}:{dispatcher}",
                                      f"--host={config.host}"])
            for index in range(len(workers))]:
        port = dispatcher if name == "data-dispatcher" else workers[int(name.rsplit("-", 1)[1])]
        ready = os.path.join(ready_dir, f"{name}.ready")
        tasks.append(TaskSpec(
            name=name, env={cluster.READY_FILE_ENV: ready},
            ready_file=ready if config.start_timeout else None,
            command=SERVER_COMMAND + (arguments[0], f"--port={port}", *arguments[1:]),
            server=True,
            max_respawns=(config.max_worker_respawns
                          if config.num_ps and name != "data-dispatcher" else 0)))
    return tasks, {service.ADDRESS_ENV: f"grpc://{config.host}:{dispatcher}",
                   service.WORKERS_ENV: str(config.data_service_workers)}


def make_tasks(config: LaunchConfig, ports: Sequence[int], ready_dir: str):
    """One `TaskSpec` per task, with its TF_CONFIG and ready file.

    Without ps tasks every worker runs the command. With them (or with
    ``workers_serve``) the command runs as the chief, and workers and ps
    tasks run `tfdist.server`. With
    ``data_service_workers`` a dispatcher and its workers come last, and
    every training task learns the dispatcher's address. With ``evaluator``
    an ``evaluator-0`` task runs the command beside the cluster.
    """
    data_tasks, data_env = _data_service_tasks(config, ports, ready_dir)
    layout = _cluster_layout(config, ports)
    tasks = []
    for job, addresses in layout.items():
        for index in range(len(addresses)):
            tf_config = cluster.build_tf_config(layout, job, index)
            name = f"{job}-{index}"
            ready = os.path.join(ready_dir, f"{name}.ready")
            server = config.has_chief and job in ("worker", "ps")
            tasks.append(TaskSpec(
                name=name,
                env={"TF_CONFIG": tf_config.to_json(), cluster.READY_FILE_ENV: ready, **data_env},
                ready_file=ready if config.start_timeout else None,
                command=SERVER_COMMAND if server else None,
                server=server,
                # With one worker a respawn would re-run its steps from a fresh
                # iterator (inexact); a group restart resumes from the checkpoint.
                # A pipeline stage's server holds its weights: a group restart.
                max_respawns=(config.max_worker_respawns
                              if job == "worker" and server and config.num_workers > 1
                              and not config.workers_serve else 0),
            ))
    tasks += data_tasks
    if config.evaluator:  # beside the cluster, not in it: no port, no join; last
        evaluator = cluster.build_tf_config(layout, "evaluator", 0)
        tasks.append(TaskSpec(name="evaluator-0",
                              env={"TF_CONFIG": evaluator.to_json(), **data_env}, sidecar=True))
    return tasks


def _lost_worker(result: GroupResult, tasks, restarts: int) -> Optional[str]:
    """The worker to give up on, if the failed task is a worker that died
    before joining the cluster on a restart (it can not come back)."""
    failed = next((t for t in tasks if t.name == result.failed_task), None)
    if (restarts == 0 or failed is None or not failed.name.startswith("worker-")
            or failed.ready_file is None or os.path.exists(failed.ready_file)):
        return None
    return failed.name


def _port_conflict(result: GroupResult) -> bool:
    return any("address already in use" in line.lower() for line in result.tail)


def _facts(result: GroupResult, tasks, config: LaunchConfig, size: LaunchConfig, forwarder,
           resizer, *, restarts: int, port_retries: int) -> Facts:
    """What `decide` needs to know about the start that just ended."""
    return Facts(
        ok=result.ok, stopped=bool(result.stopped_by),
        finished=all(code == 0 for name, code in result.exit_codes.items()
                     if name.startswith(("worker-", "chief-"))),
        signal_seen=forwarder.stop.is_set(),
        resize_requested=resizer.requested.is_set(), resize_to=resizer.new_size,
        port_conflict=_port_conflict(result), fixed_ports=bool(config.ports),
        port_retries=port_retries, restarts=restarts, max_restarts=config.max_restarts,
        lost_worker=_lost_worker(result, tasks, restarts),
        workers=size.num_workers, fewest_workers=config.fewest_workers)


def _resized(size: LaunchConfig, workers: int) -> LaunchConfig:
    """``size`` at ``workers`` workers (the ports and floor were the first
    size's: a resized group takes free ports and is not checked against
    --min_workers again)."""
    if workers == size.num_workers:
        return size
    return dataclasses.replace(size, num_workers=workers, ports=None, min_workers=None)


class _Resizer:
    """While a group runs: asks the host discovery script every interval;
    when its answer differs from the group's size, stops the group (the
    workers save a checkpoint at one step) and records the new size."""

    def __init__(self, discovery: Optional[HostDiscovery], interval: float, group: ProcessGroup,
                 size: int, emit):
        self.new_size: Optional[int] = None
        self.requested = threading.Event()
        self._done = threading.Event()
        self._thread = None
        if discovery is not None:
            self._thread = threading.Thread(
                target=self._poll, args=(discovery, interval, group, size, emit), daemon=True)
            self._thread.start()

    def _poll(self, discovery, interval, group, size, emit):
        while not self._done.wait(interval):
            found = discovery.workers()
            if found is not None and found != size and not self._done.is_set():
                self.new_size = found
                emit(f"[launcher] host discovery: {found} workers can run (now {size}); "
                     "stopping the group at a checkpoint to re-form it")
                self.requested.set()
                group.request_stop()
                return

    def close(self):
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=SCRIPT_TIMEOUT + 5)


class _EitherEvent:
    def __init__(self, *events):
        self._events = events

    def is_set(self) -> bool:
        return any(event.is_set() for event in self._events)


class _SignalForwarder:
    """While active, SIGINT/SIGTERM to the launcher go to every task.

    The first one is forwarded as SIGTERM (tfdist's Trainer then stops every
    task at one step, saving first where it has a checkpoint directory); a
    second one kills every task at once.
    """

    def __init__(self):
        self.stop = threading.Event()
        self.signal_name = ""
        self.exit_code = 0
        self.group: Optional[ProcessGroup] = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._forward)
        return self

    def __exit__(self, *exc_info):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _forward(self, signum, frame):
        del frame
        name = signal.Signals(signum).name
        if self.stop.is_set():
            self.signal_name += f", then {name}: killed at once"
            if self.group is not None:
                self.group.signal_all(signal.SIGKILL)
            return
        self.signal_name = name
        self.exit_code = 128 + signum
        self.stop.set()
        if self.group is not None:
            self.group.request_stop()


def launch(config: LaunchConfig, command: Sequence[str], output=None) -> GroupResult:
    """Runs ``command`` as every task of a local cluster until it finishes.

    A failing task ends its group (the others get SIGTERM, then SIGKILL).
    With ``config.max_restarts`` the group starts again with new ports, and
    training resumes from its latest checkpoint. With ``config.min_workers``
    a worker that dies before joining on a restart is lost: the group
    restarts with one worker fewer (never below ``min_workers``); the
    remaining workers keep the same global batches, so training continues
    exactly. With ``config.host_discovery`` the group also grows (and
    shrinks) to the script's answer, re-formed at a checkpoint (`_Resizer`);
    re-forming is not a restart. After each start, `decisions.decide` picks
    what happens next from what is known then (one `decisions.Action`).
    Returns the last start's result, whose summary names the root-cause task.

    >>> import io, sys
    >>> from tfdist.launch import LaunchConfig, launch
    >>> show_task = "import json, os; print(json.loads(os.environ['TF_CONFIG'])['task'])"
    >>> output = io.StringIO()
    >>> result = launch(LaunchConfig(num_workers=2, start_timeout=0),
    ...                 [sys.executable, "-c", show_task], output=output)
    >>> result.ok
    True
    >>> sorted(line for line in output.getvalue().splitlines() if line.startswith("[worker"))
    ["[worker-0] {'type': 'worker', 'index': 0}", "[worker-1] {'type': 'worker', 'index': 1}"]
    """
    output = output or sys.stdout
    emit = lambda line: (output.write(line + "\n"), output.flush())  # noqa: E731
    if config.bandwidth:
        if not inside(config.bandwidth):
            raise ConfigurationError(
                f"bandwidth={config.bandwidth!r} needs the launcher to run in a limited network "
                "namespace: use `tfdist-run --bandwidth=...`, which makes it.")
        emit(f"[launcher] network: every task shares one loopback limited to "
             f"{config.bandwidth} (tc tbf, in a network namespace of its own)")
    if config.ports:
        check_ports_free(config.ports, config.host)
    ready_dir = tempfile.mkdtemp(prefix="tfdist-launch-")
    restarts = port_retries = 0
    size = config  # the current cluster: shrinks when a worker is lost
    discovery = None
    if config.host_discovery:
        discovery = HostDiscovery(config.host_discovery, fewest=config.fewest_workers,
                                  most=config.num_workers, report=emit)
        size = dataclasses.replace(config, num_workers=discovery.workers() or config.num_workers,
                                   ports=None, min_workers=None)
        emit(f"[launcher] host discovery: starting with {size.num_workers} workers "
             f"(between {config.fewest_workers} and {config.num_workers})")
    try:
        with _SignalForwarder() as forwarder:
            while True:
                for stale in os.listdir(ready_dir):
                    os.remove(os.path.join(ready_dir, stale))
                ports = (config.ports[:size.num_tasks] if config.ports
                         else free_ports(size.num_tasks, config.host))
                tasks = make_tasks(size, ports, ready_dir)
                emit(f"[launcher] cluster: {json.dumps([t.name + '@' + str(p) for t, p in zip(tasks, ports)])}")
                group = ProcessGroup(tasks, command, log_dir=config.log_dir, output=output)
                forwarder.group = group
                group.start()
                resizer = _Resizer(discovery, config.discovery_interval, group,
                                   size.num_workers, emit)
                exit_codes = {}
                try:
                    result = group.wait(
                        start_timeout=config.start_timeout,
                        stop_event=_EitherEvent(forwarder.stop, resizer.requested),
                        stop_timeout=config.grace_period, hang_timeout=config.hang_timeout,
                        sidecar_timeout=config.evaluator_timeout,
                    )
                finally:
                    resizer.close()
                    exit_codes = group.close(config.grace_period)
                    forwarder.group = None
                result = dataclasses.replace(result, exit_codes=exit_codes)
                facts = _facts(result, tasks, config, size, forwarder, resizer,
                               restarts=restarts, port_retries=port_retries)
                decision = decide(facts)
                if decision.action is Action.RESIZE:
                    size = _resized(size, decision.workers)
                    emit(f"[launcher] re-forming the group with {size.num_workers} workers; "
                         "training resumes from the checkpoint")
                    continue
                if result.stopped_by:  # the signal the launcher got, or none (a resize asked)
                    result = dataclasses.replace(result, stopped_by=forwarder.signal_name,
                                                 exit_code=forwarder.exit_code)
                if decision.action.ends:  # FINISHED, STOPPED, GIVE_UP
                    break
                if decision.action is Action.NEW_PORTS:
                    port_retries += 1
                    emit(f"[launcher] a port was taken; starting again with new ports ({result.failed_task})")
                    continue
                restarts += 1  # RESTART or RESTART_SMALLER
                emit(f"[launcher] {result.summary().splitlines()[0]}")
                if decision.action is Action.RESTART_SMALLER:
                    emit(f"[launcher] lost {facts.lost_worker}: it died again before joining the "
                         f"cluster; continuing with {decision.workers} workers "
                         f"(--min_workers={config.fewest_workers})")
                if discovery is not None:  # the workers that can run now
                    decision = decide(dataclasses.replace(facts, discovered=discovery.workers()))
                size = _resized(size, decision.workers)
                emit(f"[launcher] restart {restarts}/{config.max_restarts}: starting all tasks again")
    finally:
        shutil.rmtree(ready_dir, ignore_errors=True)
    verdict = "" if result.stopped_by else ("done: " if result.ok else "FAILED: ")
    emit(f"[launcher] {verdict}{result.summary()}")
    return result
