"""Stopping on request: SIGTERM or Ctrl-C stops every worker at one step.

A cluster manager (or ``timeout``, ``kill``, Docker, tfdist-run) stops a job
with SIGTERM, often to one task; a person presses Ctrl-C. While
`Trainer.fit` runs, `PreemptionWatcher` turns either signal into a flag; the
runner hands it to `tfdist.loops.agreement`, which under a multi-worker strategy
sums it over all workers about once a second, so all workers agree on the
step. The Trainer then saves a checkpoint with
the exact data position (when it has a checkpoint directory:
``checkpointing=tfdist.CheckpointOptions(directory=...)``) and raises
`Preempted`, a ``SystemExit`` with code 143 (128 + SIGTERM) or 130 (Ctrl-C),
which `tfdist-run --max_restarts` answers with a restart; `fit` then resumes
mid-epoch where it stopped. A second Ctrl-C raises KeyboardInterrupt at once.

A hand-written loop does the same with a `PreemptionWatcher` of its own
(docs/guides/custom-loops.md): the one public way to act on these signals.

Outside `fit`, a multi-worker task still stops on SIGTERM:
TensorFlow's coordination agent installs a SIGTERM handler that only logs
the signal (its preemption notifier), so a task would train on after being
told to stop. `PreemptionWatcher.exit_outside_training` (what
``make_strategy("multi_worker_mirrored")`` does, through
`tfdist.cluster.stop_signals`) replaces it: SIGTERM raises `Preempted`,
Ctrl-C raises KeyboardInterrupt, as in a plain Python program.
"""

import gc
import os
import signal
import sys
import threading

from tfdist.cluster import stop_signals
from tfdist.cluster.stop_signals import Preempted
from tfdist.data import iterator_release

# After a stop, how long freeing the data iterators may take
# (`free_iterators_or_exit`).
RELEASE_SECONDS = 5.0


class PreemptionWatcher:
    """Catches SIGTERM and Ctrl-C while active (`requested` turns True).

    A hand-written loop passes ``requested`` to ``HostLoop.run`` (under a
    multi-worker strategy every worker then stops after the same step),
    saves, and raises `tfdist.Preempted` with ``signum``:

    >>> import os, signal, tfdist
    >>> with tfdist.loops.preemption.PreemptionWatcher() as stop_signal:
    ...     os.kill(os.getpid(), signal.SIGTERM)      # what a cluster manager sends
    ...     stopped = stop_signal.requested
    >>> stopped, stop_signal.signum == signal.SIGTERM
    (True, True)
    """

    @staticmethod
    def exit_outside_training() -> None:
        """Makes SIGTERM raise `Preempted` and Ctrl-C KeyboardInterrupt in
        this process while no watcher is active (see the module docstring).
        ``make_strategy("multi_worker_mirrored")`` calls it; call it for a
        MultiWorkerMirroredStrategy made without `tfdist.make_strategy`.
        Only the main thread can install signal handlers; elsewhere it does
        nothing."""
        stop_signals.exit_outside_training()

    def __init__(self):
        self._flag = threading.Event()
        self.signum = signal.SIGTERM
        self._previous = {}

    def __enter__(self):
        self._previous = stop_signals.listen(self)
        return self

    def __exit__(self, *exc_info):
        stop_signals.stop_listening(self, self._previous)
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


def free_iterators_or_exit(stop: Preempted) -> Preempted:
    """``stop`` without its traceback, after freeing what it held (call it
    where ``stop`` is caught, with the caller's own iterators dropped).

    The traceback holds `fit`'s frames, and with them the distributed data
    iterators, until the process exits. Freeing a distributed iterator
    waits for TensorFlow's input threads (the main thread in
    ``MultiDeviceIterator::~MultiDeviceIterator``), longer the longer the
    run, and a stopped worker that waited for it at the interpreter's exit
    could outlast a cluster manager's grace period (figures:
    docs/reliability.md#stopped-workers-exit-in-seconds). So they are freed
    here, and if that takes longer than `RELEASE_SECONDS` the process exits
    at once with the stop's exit code: the checkpoint is already saved.
    """
    freed = threading.Event()

    def exit_now(what: str):
        print(f"tfdist: TensorFlow did not free {what} within {RELEASE_SECONDS:g} s; "
              f"exiting now ({stop.code})", flush=True)
        sys.stderr.flush()
        # Skips the interpreter's exit: a deletion that ended during it
        # would abort the process (`tfdist.data.iterator_release`).
        os._exit(stop.code)  # pylint: disable=protected-access

    def exit_if_stuck():
        if not freed.wait(RELEASE_SECONDS):
            exit_now("the data iterators")

    threading.Thread(target=exit_if_stuck, name="tfdist-exit-if-stuck", daemon=True).start()
    stop.__traceback__ = None
    gc.collect()  # frames in reference cycles (generators) too
    if not iterator_release.wait(RELEASE_SECONDS):  # what they handed to the release thread
        exit_now(f"{iterator_release.pending()} released data iterator(s)")
    freed.set()
    return stop


__all__ = ["PreemptionWatcher", "free_iterators_or_exit"]
