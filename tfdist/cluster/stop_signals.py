"""Stop signals to this task: SIGTERM and Ctrl-C, outside and inside training.

The process-level half of `tfdist.loops.preemption`, kept at the cluster
layer because a strategy factory needs it: TensorFlow's coordination agent
installs a SIGTERM handler that only logs the signal, so a multi-worker
task would train on after being told to stop. `exit_outside_training`
(called by ``make_strategy("multi_worker_mirrored")``) replaces it: SIGTERM
raises `Preempted`, Ctrl-C raises KeyboardInterrupt, as in a plain Python
program. While a listener is active (`listen`: a
`tfdist.loops.preemption.PreemptionWatcher` around training), a signal is
handed to the newest one instead, which turns it into a flag.

A process forked while these handlers are installed (a
``keras.utils.PyDataset(use_multiprocessing=True)`` pool worker) inherits
them, but not the training they belong to: in it, a stop signal does what
it does in a plain Python program. Otherwise a pool worker would swallow the
SIGTERM with which ``multiprocessing`` ends it at exit, and the exit would
wait on it forever.
"""

import os
import signal
import threading
from typing import Dict, List, Optional

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_listeners: List = []  # objects with request(signum), newest last
_installed_by_pid = os.getpid()  # the process whose training the handlers serve


class Preempted(SystemExit):
    """Training stopped on SIGTERM or Ctrl-C (after saving, with a checkpoint).

    A ``SystemExit`` whose code is 128 + the signal: 143 for SIGTERM, 130
    for Ctrl-C, which ``tfdist-run --max_restarts`` answers with a restart.
    A hand-written loop raises it after saving, as `Trainer.fit` does:

    >>> import tfdist
    >>> stop = tfdist.Preempted(step=120)
    >>> stop.code, str(stop)
    (143, 'preempted (SIGTERM): checkpoint saved at step 120')
    """

    def __init__(self, step: Optional[int] = None, signum: int = signal.SIGTERM,
                 saved: bool = True):
        super().__init__(128 + signum)
        self.step = step
        self.signum = signum
        self.saved = saved

    def __str__(self):
        name = "SIGTERM" if self.signum == signal.SIGTERM else "Ctrl-C"
        if self.step is None:
            return f"stopped ({name}) outside training; nothing saved"
        if self.saved:
            return f"preempted ({name}): checkpoint saved at step {self.step}"
        return f"stopped ({name}) at step {self.step}; no checkpoint directory, nothing saved"


def _on_stop_signal(signum, frame):
    del frame
    if os.getpid() != _installed_by_pid:
        _as_a_plain_program(signum)
    elif _listeners:
        _listeners[-1].request(signum)
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt
    else:
        raise Preempted(signum=signum)


def _as_a_plain_program(signum) -> None:
    """A forked child's answer: Ctrl-C raises KeyboardInterrupt, SIGTERM
    ends the process, as without tfdist."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _installing() -> None:
    global _installed_by_pid
    _installed_by_pid = os.getpid()


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def exit_outside_training() -> None:
    """Makes SIGTERM raise `Preempted` and Ctrl-C KeyboardInterrupt in this
    process while no listener is active. Only the main thread can install
    signal handlers; elsewhere it does nothing."""
    if _in_main_thread():
        _installing()
        for signum in STOP_SIGNALS:
            signal.signal(signum, _on_stop_signal)


def listen(listener) -> Dict[int, object]:
    """Hands stop signals to ``listener.request(signum)`` until
    `stop_listening`; returns the handlers it replaced (to restore)."""
    previous = {}
    if _in_main_thread():
        _installing()
        for signum in STOP_SIGNALS:
            previous[signum] = signal.signal(signum, _on_stop_signal)
    _listeners.append(listener)
    return previous


def stop_listening(listener, previous: Dict[int, object]) -> None:
    """Ends `listen` for ``listener`` and restores ``previous`` handlers."""
    _listeners.remove(listener)
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def handles_stop_signals() -> bool:
    """True when SIGTERM and Ctrl-C go to this module's handler."""
    return all(signal.getsignal(signum) is _on_stop_signal for signum in STOP_SIGNALS)
