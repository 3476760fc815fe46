"""Runs tfdist-run as a real process for tests, and always cleans up.

`LauncherRun` starts ``python -m tfdist.launch ...``, collects its output in
a thread, lets a test wait for a line and find task pids, and on exit ends
the launcher and every task it started, by pid, even if the test failed.
"""

import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
_STARTED = re.compile(r"\[launcher\] started (\S+) \(pid (\d+)\)")


class LauncherRun:
    def __init__(self, launcher_args, command):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tfdist.launch", *launcher_args, "--", *command],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
            env=env, start_new_session=True,
        )
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def pids(self) -> dict:
        """Latest pid of each task (a restart starts new ones)."""
        found = {}
        for line in list(self.lines):
            match = _STARTED.search(line)
            if match:
                found[match.group(1)] = int(match.group(2))
        return found

    def all_pids(self):
        return [int(m.group(2)) for m in map(_STARTED.search, list(self.lines)) if m]

    def wait_for(self, pattern: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if regex.search(line):
                    return line
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r} in {timeout}s:\n{self.output[-4000:]}")

    def interrupt_and_wait_for_restart(self, task: str, *, after: str,
                                       signal_number=signal.SIGKILL) -> None:
        """Once a line matches ``after``, sends ``signal_number`` to
        ``task``'s process; asserts the launcher restarts the group within a
        minute and the restarted run ends with exit code 0."""
        self.wait_for(after, timeout=240)
        os.kill(self.pids()[task], signal_number)
        interrupted = time.monotonic()
        self.wait_for(r"restart 1/1", timeout=90)
        assert time.monotonic() - interrupted < 60
        assert self.wait(timeout=300) == 0, self.output[-4000:]

    def wait(self, timeout: float) -> int:
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid in self.all_pids():
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
