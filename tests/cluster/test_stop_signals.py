"""Stop signals in processes forked during training (`tfdist.cluster.stop_signals`).

A ``PyDataset(use_multiprocessing=True)`` forks its pool workers while
training listens for SIGTERM. The workers inherit the handler; at exit
``multiprocessing`` ends them with SIGTERM and joins them, so a worker that
swallowed it made the exit wait forever (the conformance suite's PyDataset
program hung there). No TensorFlow here: plain forks, the same handler.
"""

import multiprocessing
import os
import signal
import time

import pytest

from tfdist.cluster import stop_signals


class _Flag:
    def __init__(self):
        self.signals = []

    def request(self, signum):
        self.signals.append(signum)


@pytest.fixture
def listening():
    flag = _Flag()
    previous = stop_signals.listen(flag)
    try:
        yield flag
    finally:
        stop_signals.stop_listening(flag, previous)


def _wait_forever(ready):
    ready.set()
    while True:
        time.sleep(0.05)


def _forked_child(ready):
    process = multiprocessing.get_context("fork").Process(target=_wait_forever, args=(ready,),
                                                          daemon=True)
    process.start()
    assert ready.wait(30), "the forked child did not start within 30 s"
    return process


def test_sigterm_ends_a_child_forked_while_training_listens(listening):
    ready = multiprocessing.get_context("fork").Event()
    child = _forked_child(ready)
    try:
        child.terminate()  # what multiprocessing's exit does to a daemon pool worker
        child.join(30)
        assert child.exitcode == -signal.SIGTERM, (
            f"the forked child did not end on SIGTERM (exit code {child.exitcode})")
    finally:
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)
            child.join(10)
    assert listening.signals == [], "the child's signal reached the parent's listener"


def test_the_training_process_still_turns_sigterm_into_a_request(listening):
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not listening.signals and time.monotonic() < deadline:
        time.sleep(0.01)
    assert listening.signals == [signal.SIGTERM]


def _interrupted(result):
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        result.put("no KeyboardInterrupt")
    except KeyboardInterrupt:
        result.put("KeyboardInterrupt")


def test_ctrl_c_in_a_forked_child_is_a_keyboard_interrupt(listening):
    del listening
    context = multiprocessing.get_context("fork")
    result = context.Queue()
    child = context.Process(target=_interrupted, args=(result,))
    child.start()
    try:
        assert result.get(timeout=30) == "KeyboardInterrupt"
        child.join(30)
    finally:
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)
            child.join(10)
