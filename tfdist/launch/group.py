"""`ProcessGroup`: the tasks of one start of a local cluster.

``start`` spawns one process per task, each in its own session (so a signal
reaches it only through us) with its own ``TF_CONFIG``, and copies its
output line by line to ours, prefixed ``[worker-1] ``, and to its log file.
``wait`` returns when every task exited 0, or at the first failure, or when
a task has not joined the cluster by the start timeout; then ``close`` ends
whatever still runs, by pid: SIGTERM, a grace period, SIGKILL.
"""

import collections
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

TAIL_LINES = 15


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task: its name (``worker-1``) and environment additions.

    ``command`` replaces the group's command for this task. A ``server``
    task (a ps or worker under ParameterServerStrategy) is not expected to
    exit: the group succeeds when every other task exited 0, and a server
    that exits is started again, same port, up to ``max_respawns`` times,
    else it fails the group.
    """

    name: str
    env: Dict[str, str]
    ready_file: Optional[str] = None
    command: Optional[Sequence[str]] = None
    server: bool = False
    max_respawns: int = 0


@dataclasses.dataclass
class GroupResult:
    """How a start ended. ``failed_task`` is the root cause, if any."""

    exit_code: int
    failed_task: Optional[str] = None
    reason: str = ""
    tail: List[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def summary(self) -> str:
        if self.ok:
            return "all tasks finished"
        lines = [f"{self.failed_task}: {self.reason} (exit code {self.exit_code})"]
        if self.tail:
            lines.append(f"last lines of {self.failed_task}:")
            lines += [f"  {line}" for line in self.tail]
        return "\n".join(lines)


def exit_code_of(returncode: int) -> int:
    """A shell-style exit code: 128 + signal for a task killed by a signal."""
    return 128 - returncode if returncode < 0 else returncode


class ProcessGroup:
    """Start / wait / close for a list of tasks running one command."""

    def __init__(
        self,
        tasks: Sequence[TaskSpec],
        command: Sequence[str],
        *,
        log_dir: Optional[str] = None,
        output=None,
    ):
        self._tasks = list(tasks)
        self._command = list(command)
        self._log_dir = log_dir
        self._output = output or sys.stdout
        self._lock = threading.Lock()
        self._processes: Dict[str, subprocess.Popen] = {}
        self._tails: Dict[str, collections.deque] = {}
        self._readers: List[threading.Thread] = []
        self._respawns: Dict[str, int] = {}

    @property
    def pids(self) -> Dict[str, int]:
        return {name: process.pid for name, process in self._processes.items()}

    def _emit(self, line: str) -> None:
        with self._lock:
            self._output.write(line + "\n")
            self._output.flush()

    def start(self) -> None:
        if self._log_dir:
            os.makedirs(self._log_dir, exist_ok=True)
        for task in self._tasks:
            self._start_task(task)

    def _start_task(self, task: TaskSpec) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **task.env)
        process = subprocess.Popen(
            list(task.command or self._command), env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, text=True, errors="replace",
        )
        self._processes[task.name] = process
        self._tails.setdefault(task.name, collections.deque(maxlen=TAIL_LINES))
        self._emit(f"[launcher] started {task.name} (pid {process.pid})")
        reader = threading.Thread(
            target=self._copy_output, args=(task.name, process), daemon=True
        )
        reader.start()
        self._readers.append(reader)

    def _copy_output(self, name: str, process: subprocess.Popen) -> None:
        log = None
        if self._log_dir:
            log = open(os.path.join(self._log_dir, f"{name}.log"), "a", encoding="utf-8")
        try:
            for raw in process.stdout:
                line = raw.rstrip("\n")
                self._tails[name].append(line)
                self._emit(f"[{name}] {line}")
                if log:
                    log.write(line + "\n")
                    log.flush()
        finally:
            if log:
                log.close()

    def signal_all(self, signum: int) -> None:
        """Sends ``signum`` to every running task's process group."""
        for process in self._processes.values():
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signum)
                except ProcessLookupError:
                    pass

    def wait(self, *, start_timeout: float = 0.0, poll_interval: float = 0.1,
             stop_event: Optional[threading.Event] = None) -> GroupResult:
        """Waits for all tasks, or returns at the first failure.

        ``stop_event`` set (the launcher got SIGINT/SIGTERM) means: the
        signal was forwarded, wait for the tasks to exit and report the first
        failure among them without treating a clean stop as success.
        """
        started = time.monotonic()
        joined = set()
        while True:
            for task in self._tasks:
                code = self._processes[task.name].poll()
                if code is None or (code == 0 and not task.server):
                    continue
                stopping = stop_event is not None and stop_event.is_set()
                if task.server and not stopping and self._respawns.get(task.name, 0) < task.max_respawns:
                    self._respawns[task.name] = self._respawns.get(task.name, 0) + 1
                    self._emit(f"[launcher] {task.name} exited (exit code "
                               f"{exit_code_of(code)}); starting it again, same address")
                    self._start_task(task)
                    continue
                return self._failure(task.name, exit_code_of(code), "exited")
            if all(self._processes[t.name].poll() == 0 for t in self._tasks if not t.server):
                return GroupResult(0)
            if start_timeout and not (stop_event and stop_event.is_set()):
                for task in self._tasks:
                    if task.ready_file and os.path.exists(task.ready_file):
                        joined.add(task.name)
                missing = [t.name for t in self._tasks if t.ready_file and t.name not in joined]
                if missing and time.monotonic() - started > start_timeout:
                    still_running = [n for n in missing if self._processes[n].poll() is None]
                    if still_running:
                        return self._failure(
                            still_running[0], 1,
                            f"did not join the cluster within {start_timeout:g} s "
                            f"(not joined: {', '.join(still_running)})",
                        )
            time.sleep(poll_interval)

    def _failure(self, name: str, code: int, reason: str) -> GroupResult:
        return GroupResult(code, name, reason, list(self._tails[name]))

    def close(self, grace_period: float = 15.0) -> None:
        """Ends every task still running (SIGTERM, grace, SIGKILL), by pid."""
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_period
        for process in self._processes.values():
            remaining = max(0.0, deadline - time.monotonic())
            try:
                process.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                pass
        self.signal_all(signal.SIGKILL)
        for process in self._processes.values():
            process.wait()
        for reader in self._readers:
            reader.join(timeout=5)
