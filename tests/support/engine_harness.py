"""Runs an engine driver (tests/programs/*_driver.py) for engine tests.

The driver starts a real local Ray or Spark and everything under it (a JVM,
Ray's GCS and raylet, Python workers, training processes). It runs in a
session of its own, at a lower CPU priority (`ENGINE_NICENESS`); when it
ends, or the wait times out, every process under it is killed by pid, then
its process group, even if the test fails.
"""

import json
import os
import signal
import subprocess
import sys

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The engine and everything under it run at a lower CPU priority. A
# starting Ray or Spark runs dozens of processes and threads (a JVM, Ray's
# daemons), and the in-process test on CI's other xdist worker, which
# traces a multi-replica step by handing work between MirroredStrategy's
# replica threads, waits for the cores at every hand-off: in a CI run a
# 2-replica sharded-state trace took 54 s beside Spark's start (about 5 s
# alone). Niced, the engine takes the cores the test leaves idle.
ENGINE_NICENESS = 10


def kill_tree(pid: int) -> None:
    """Kills ``pid``, every process under it, then its process group."""
    try:
        root = psutil.Process(pid)
        processes = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        processes = []
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(processes, timeout=10)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_driver(driver: str, output, arguments, *, runs, timeout: float = 900):
    """Runs ``tests/programs/<driver>`` with ``--output=<output>`` and
    ``--runs=<runs as JSON>``; returns (one result per run, the log)."""
    process = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "tests", "programs", driver),
         f"--output={output}", f"--runs={json.dumps(runs)}", *arguments],
        cwd=REPO, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=lambda: os.nice(ENGINE_NICENESS),
    )
    try:
        log, _ = process.communicate(timeout=timeout)
    finally:
        kill_tree(process.pid)
    assert os.path.exists(output), f"{driver} exited {process.returncode}:\n{log[-4000:]}"
    with open(output, encoding="utf-8") as results_file:
        results = json.load(results_file)
    assert len(results) == len(runs), log[-4000:]
    return results, log
