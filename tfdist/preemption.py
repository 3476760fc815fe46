"""Stopping on request: SIGTERM or Ctrl-C stops every worker at one step.

A cluster manager (or ``timeout``, ``kill``, Docker, tfdist-run) stops a job
with SIGTERM, often to one task; a person presses Ctrl-C. While
`Trainer.fit` runs, `PreemptionWatcher` turns either signal into a flag; the
runner passes the flag into each execution, which under a multi-worker
strategy sums it over all workers at its end (`tfdist.runners.synchronous`),
so all workers agree on the step. The Trainer then saves a checkpoint with
the exact data position (when it has a ``checkpoint_dir``) and raises
`Preempted`, a ``SystemExit`` with code 143 (128 + SIGTERM) or 130 (Ctrl-C),
which `tfdist-run --max_restarts` answers with a restart; `fit` then resumes
mid-epoch where it stopped. A second Ctrl-C raises KeyboardInterrupt at once.

Outside `fit`, a multi-worker task still stops on SIGTERM:
TensorFlow's coordination agent installs a SIGTERM handler that only logs
the signal (its preemption notifier), so a task would train on after being
told to stop. `exit_on_stop_signals` (called by ``make_strategy
("multi_worker_mirrored")``) replaces it: SIGTERM raises `Preempted`,
Ctrl-C raises KeyboardInterrupt, as in a plain Python program.
"""

import signal
import threading
from typing import List, Optional

PREEMPTED_EXIT_CODE = 143
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_active: List["PreemptionWatcher"] = []


class Preempted(SystemExit):
    """Training stopped on SIGTERM or Ctrl-C (after saving, with a checkpoint)."""

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
        return f"stopped ({name}) at step {self.step}; no checkpoint_dir, nothing saved"


def _on_stop_signal(signum, frame):
    del frame
    if _active:
        _active[-1].request(signum)
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt
    else:
        raise Preempted(signum=signum)


def exit_on_stop_signals() -> None:
    """Makes SIGTERM / Ctrl-C stop this process (see the module docstring)."""
    if threading.current_thread() is threading.main_thread():
        for signum in _STOP_SIGNALS:
            signal.signal(signum, _on_stop_signal)


class PreemptionWatcher:
    """Catches SIGTERM and Ctrl-C while active (`requested` turns True)."""

    def __init__(self):
        self._flag = threading.Event()
        self.signum = signal.SIGTERM
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in _STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, _on_stop_signal)
        _active.append(self)
        return self

    def __exit__(self, *exc_info):
        _active.remove(self)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def request(self, signum: int) -> None:
        """A stop was asked for; a second Ctrl-C does not wait for the step."""
        if self._flag.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if not self._flag.is_set():
            self.signum = signum
        self._flag.set()

    @property
    def requested(self) -> bool:
        """True once this task got a stop signal."""
        return self._flag.is_set()
