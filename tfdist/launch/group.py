"""`ProcessGroup`: the tasks of one start of a local cluster.

``start`` spawns one process per task, each in its own session (so a signal
reaches it only through us) with its own ``TF_CONFIG``, and copies its
output line by line to ours, prefixed ``[worker-1] ``, and to its log file.
``wait`` returns when every task exited 0, or at the first failure, or when
a task has not joined the cluster by the start timeout, or has been stopped
(SIGSTOP: hung) for the hang timeout, or, once a stop was asked for, when
every task exited or the stop timeout ran out; then ``close`` ends whatever
still runs, by pid: SIGTERM, a grace period, SIGKILL, and returns every
task's exit code.
"""

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

from tfdist._internal import tf_logs
from tfdist.launch.tasks import GroupResult, TaskSpec, exit_code_of

TAIL_LINES = 15


def is_stopped(pid: int) -> bool:
    """True while ``pid`` is stopped (SIGSTOP / SIGTSTP), from /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")


class ProcessGroup:
    """Start / wait / close for a list of tasks running one command.

    >>> import io, sys
    >>> from tfdist.launch import ProcessGroup, TaskSpec
    >>> output = io.StringIO()
    >>> group = ProcessGroup([TaskSpec("worker-0", {}), TaskSpec("worker-1", {})],
    ...                      [sys.executable, "-c", "print('hello')"], output=output)
    >>> group.start()
    >>> result = group.wait()
    >>> exit_codes = group.close()       # joins the output threads
    >>> result.ok, exit_codes
    (True, {'worker-0': 0, 'worker-1': 0})
    >>> sorted(line for line in output.getvalue().splitlines() if "hello" in line)
    ['[worker-0] hello', '[worker-1] hello']

    Each task leads its own process group (``pids``); `request_stop` sends
    SIGTERM to the tasks that run the command, not to servers, and
    `signal_all` signals every task still running:

    >>> import os, signal, threading
    >>> sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    >>> group = ProcessGroup([TaskSpec("worker-0", {}), TaskSpec("ps-0", {}, server=True)],
    ...                      sleep, output=io.StringIO())
    >>> group.start()
    >>> [os.getpgid(pid) == pid for pid in group.pids.values()]
    [True, True]
    >>> group.request_stop()               # what the launcher does on Ctrl-C / SIGTERM
    >>> stopping = threading.Event(); stopping.set()
    >>> group.wait(stop_event=stopping).stopped_by     # worker-0 has exited; ps-0 still serves
    'SIGTERM'
    >>> group.signal_all(signal.SIGKILL)
    >>> group.close()                      # 128 + the signal that ended each task
    {'worker-0': 143, 'ps-0': 137}
    """

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
        self._sidecars_reported: set = set()

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
        env = tf_logs.quiet_environment(dict(os.environ, PYTHONUNBUFFERED="1", **task.env))
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
            quiet, noise = not tf_logs.shown(), tf_logs.NoiseFilter()
            for raw in process.stdout:
                line = raw.rstrip("\n")
                if not quiet or noise.keep(line):  # the log file keeps it
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

    def request_stop(self) -> None:
        """SIGTERM to the tasks that run the command (servers keep serving
        until those have stopped: a chief saving its checkpoint still needs
        its parameter servers); `close` ends the servers."""
        for task in self._tasks:
            process = self._processes[task.name]
            if not task.server and process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def wait(self, *, start_timeout: float = 0.0, poll_interval: float = 0.1,
             stop_event: Optional[threading.Event] = None,
             stop_timeout: float = 15.0, hang_timeout: float = 0.0,
             stop_signal: str = "SIGTERM", sidecar_timeout: float = 120.0) -> GroupResult:
        """Waits for all tasks, or returns at the first failure.

        ``stop_event`` set (the launcher got SIGINT/SIGTERM and forwarded
        it) means: wait up to ``stop_timeout`` seconds for every task to
        exit, then return a result naming ``stop_signal`` (close kills the
        rest). A task stopped (SIGSTOP) for ``hang_timeout`` seconds is a
        failure naming it (0: never). Once the training tasks exited 0,
        sidecar tasks get up to ``sidecar_timeout`` seconds to end.
        """
        started = time.monotonic()
        joined = set()
        stopped_since: Dict[str, float] = {}
        stop_started = None
        while True:
            now = time.monotonic()
            if stop_event is not None and stop_event.is_set():
                stop_started = stop_started or now
                if all(self._processes[t.name].poll() is not None
                       for t in self._tasks if not t.server):
                    return GroupResult(128 + signal.SIGTERM, stopped_by=stop_signal)
                if now - stop_started > stop_timeout:
                    return GroupResult(128 + signal.SIGTERM, stopped_by=stop_signal, reason=(
                        f"; tasks still running after {stop_timeout:g} s were killed"))
                time.sleep(poll_interval)
                continue
            for task in self._tasks:
                code = self._processes[task.name].poll()
                if code is None or (code == 0 and not task.server):
                    continue
                if task.sidecar:
                    self._report_sidecar(task.name, code)
                    continue
                if task.server and self._respawns.get(task.name, 0) < task.max_respawns:
                    self._respawns[task.name] = self._respawns.get(task.name, 0) + 1
                    self._emit(f"[launcher] {task.name} exited (exit code "
                               f"{exit_code_of(code)}); starting it again, same address")
                    self._start_task(task)
                    continue
                hung = self._hung(stopped_since, now, 0.0)
                if hung is not None:  # the root cause, not the peer that noticed it
                    return hung
                return self._failure(task.name, exit_code_of(code), "exited")
            if all(self._processes[t.name].poll() == 0 for t in self._tasks
                   if not t.server and not t.sidecar):
                self._wait_for_sidecars(sidecar_timeout, poll_interval)
                return GroupResult(0)
            if hang_timeout:
                hung = self._hung(stopped_since, now, hang_timeout)
                if hung is not None and not self._respawn_hung(hung, stopped_since):
                    return hung
            if start_timeout:
                for task in self._tasks:
                    if task.ready_file and os.path.exists(task.ready_file):
                        joined.add(task.name)
                missing = [t.name for t in self._tasks if t.ready_file and t.name not in joined]
                if missing and now - started > start_timeout:
                    still_running = [n for n in missing if self._processes[n].poll() is None]
                    if still_running:
                        return self._failure(
                            still_running[0], 1,
                            f"did not join the cluster within {start_timeout:g} s "
                            f"(not joined: {', '.join(still_running)})",
                        )
            time.sleep(poll_interval)

    def _report_sidecar(self, name: str, code: int) -> None:
        if name not in self._sidecars_reported:
            self._sidecars_reported.add(name)
            self._emit(f"[launcher] {name} exited (exit code {exit_code_of(code)}); it runs "
                       "beside training, which goes on")

    def _wait_for_sidecars(self, timeout: float, poll_interval: float) -> None:
        """Training is done: sidecars (evaluating the last checkpoint) may
        end on their own for ``timeout`` s; `close` ends any still running."""
        deadline = time.monotonic() + timeout
        sidecars = [t.name for t in self._tasks if t.sidecar]
        while time.monotonic() < deadline and any(
                self._processes[name].poll() is None and not is_stopped(self._processes[name].pid)
                for name in sidecars):
            time.sleep(poll_interval)
        for name in sidecars:
            code = self._processes[name].poll()
            if code is None and is_stopped(self._processes[name].pid):
                self._emit(f"[launcher] training is done; ending {name}, stopped (SIGSTOP)")
            elif code is None:
                self._emit(f"[launcher] training is done; ending {name}, still running after "
                           f"{timeout:g} s")
            elif code != 0:
                self._report_sidecar(name, code)

    def _hung(self, stopped_since: Dict[str, float], now: float,
              hang_timeout: float) -> Optional[GroupResult]:
        """A failure naming a task stopped for ``hang_timeout`` s, if any
        (sidecars never fail the group)."""
        sidecars = {t.name for t in self._tasks if t.sidecar}
        for name, process in self._processes.items():
            if name in sidecars:
                continue
            if process.poll() is None and is_stopped(process.pid):
                stopped_since.setdefault(name, now)
            else:
                stopped_since.pop(name, None)
        for name, since in stopped_since.items():
            if now - since >= hang_timeout:
                return self._failure(
                    name, 128 + signal.SIGSTOP,
                    f"hung: stopped (SIGSTOP) for {now - since:.0f} s",
                )
        return None

    def _respawn_hung(self, hung: GroupResult, stopped_since: Dict[str, float]) -> bool:
        """A hung worker server with respawns left is killed and started
        again at its address (the coordinator moves its steps to the other
        workers meanwhile); returns False for any other hung task."""
        task = next(t for t in self._tasks if t.name == hung.failed_task)
        if not task.server or self._respawns.get(task.name, 0) >= task.max_respawns:
            return False
        self._respawns[task.name] = self._respawns.get(task.name, 0) + 1
        process = self._processes[task.name]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        stopped_since.pop(task.name, None)
        self._emit(f"[launcher] {task.name} {hung.reason}; killed it, starting it "
                   "again, same address")
        self._start_task(task)
        return True

    def _failure(self, name: str, code: int, reason: str) -> GroupResult:
        return GroupResult(code, name, reason, list(self._tails[name]))

    def close(self, grace_period: float = 15.0) -> Dict[str, int]:
        """Ends every task still running (SIGTERM, grace, SIGKILL), by pid.

        Returns each task's exit code (128 + N when signal N ended it).
        """
        for process in self._processes.values():
            if process.poll() is None and is_stopped(process.pid):
                os.killpg(process.pid, signal.SIGKILL)  # a stopped task can not exit
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
        return {name: exit_code_of(process.returncode)
                for name, process in self._processes.items()}
