"""Python programs run in processes that start with TensorFlow, Keras and
tfdist imported: what a fresh ``python -c`` does, without paying the
imports (about 4.5 s of CPU on this machine) once per program.

A `Preloaded` keeps one process that has imported the three and run
nothing (TensorFlow's runtime starts in each program, as in a fresh
process: a program still configures its devices before TensorFlow
starts). Each `run` forks it: the child starts a session of its own,
moves to the program's directory, sends its output to a file, runs the
program as ``__main__`` and exits as the interpreter exits (``atexit``,
threads joined); an uncaught exception prints its traceback and exits
with 1, as ``python -c`` does. Forking after the imports is safe because
importing TensorFlow starts no thread (the test suite's docs examples
pin it: `tests/test_docs.py`).
"""

import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Optional, Tuple

_ZYGOTE = r"""
import json, os, sys, threading
import tensorflow, keras, tfdist  # (nothing runs: TensorFlow starts in each program)
assert threading.active_count() == 1, threading.enumerate()
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.chdir(request["cwd"])
        output = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(output, 1)
        os.dup2(output, 2)
        sys.stdin = open(os.devnull, encoding="utf-8")
        sys.argv = ["-c"]
        exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__"})
        sys.exit(0)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class Preloaded:
    """One preloaded process (module doc), started with ``env``; `close` ends it."""

    def __init__(self, env: dict):
        self._process = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=env)
        self._received = b""  # (read from its output, not yet a whole line)

    def run(self, code: str, cwd: str, timeout: float) -> Tuple[Optional[int], str]:
        """Runs ``code`` in ``cwd``: (its exit code, or None when it ran over
        ``timeout`` seconds and was killed with its session; its output)."""
        output = os.path.join(cwd, ".program-output")
        self._process.stdin.write((json.dumps({"code": code, "cwd": str(cwd),
                                               "output": output}) + "\n").encode())
        self._process.stdin.flush()
        pid = json.loads(self._reply(60.0))["pid"]
        try:
            code_line = self._reply(timeout)
        except TimeoutError:
            os.killpg(pid, signal.SIGKILL)  # its own session: the program and its children
            self._reply(60.0)
            code_line = None
        with open(output, encoding="utf-8", errors="replace") as written:
            text = written.read()
        os.remove(output)
        return (None if code_line is None else json.loads(code_line)["code"]), text

    def _reply(self, timeout: float) -> str:
        """Its next line of output, waiting at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._received:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply from the preloaded process in {timeout} s")
            ready, _, _ = select.select([self._process.stdout], [], [], left)
            if ready:
                chunk = os.read(self._process.stdout.fileno(), 4096)
                if not chunk:
                    raise RuntimeError("the preloaded process ended "
                                       f"(exit code {self._process.poll()})")
                self._received += chunk
        line, self._received = self._received.split(b"\n", 1)
        return line.decode()

    def close(self) -> None:
        self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
