"""Frees finished data iterators on a thread of their own.

Deleting an iterator of a distributed dataset blocks the deleting thread
until the iterator's tf.data autotuning threads end. Those threads sleep
between optimizations for a period that doubles from 10 ms up to 60 s
(``Model::OptimizeLoop``), and the deletion can wait out the period: up
to seconds of wall time with almost no CPU, growing with the iterator's age
(docs/performance.md#the-iterator-teardown-stall). A training loop that
drops its iterator when an epoch (or an evaluation) ends stands still that
long.

`release` takes the iterator from its holder and hands it to a thread of
its own that drops it; the caller goes on at once. Deletions run side by
side (each waits on its own iterator's threads), and each pending iterator
holds its prefetched batches, so at most `MAX_PENDING` are under way: a
further `release` waits for one of them to end. At exit, and when a stopped job frees its memory
(`tfdist.loops.preemption`), `wait` lets the pending ones finish, with a bound.
"""

import atexit
import sys
import threading
from typing import Any

MAX_PENDING = 2
# Exit waits this long for pending deletions, then goes on: a deletion cut
# short by the interpreter's exit was harmless in every run measured
# (docs/performance.md#the-iterator-teardown-stall), and TensorFlow's
# longest autotuning period is 60 s, too long to hold a finished job.
EXIT_WAIT_SECONDS = 10.0

_slots = threading.BoundedSemaphore(MAX_PENDING)
_changed = threading.Condition()
_pending = 0


def release(owner: Any, attribute: str = "iterator") -> None:
    """Takes ``owner.<attribute>`` (setting it to None) and drops it on a
    release thread. Taken here, no frame of the caller holds it; nothing
    else may (else the deletion happens wherever the last reference goes)."""
    global _pending  # pylint: disable=global-statement
    holder = [getattr(owner, attribute)]
    setattr(owner, attribute, None)
    if holder[0] is None:
        return
    _slots.acquire()  # waits while MAX_PENDING deletions are under way
    with _changed:
        _pending += 1
    try:
        threading.Thread(target=_free, args=(holder,), name="tfdist-iterator-release",
                         daemon=True).start()
    except RuntimeError:  # the interpreter is exiting: no new threads
        _free(holder)


def _free(holder: list) -> None:
    global _pending  # pylint: disable=global-statement
    try:
        holder.clear()  # the blocking part: TensorFlow's iterator teardown
    finally:
        with _changed:
            _pending -= 1
            _changed.notify_all()
        _slots.release()


def pending() -> int:
    """Iterators released and not yet freed."""
    return _pending


def wait(timeout_seconds: float) -> bool:
    """Waits until every released iterator is freed, at most
    ``timeout_seconds``; True if they all were."""
    with _changed:
        return _changed.wait_for(lambda: _pending == 0, timeout=timeout_seconds)


@atexit.register
def _free_before_exit() -> None:
    """Lets pending deletions finish before the interpreter does, for a
    bounded time."""
    if pending() and not wait(EXIT_WAIT_SECONDS):
        print(f"tfdist: {pending()} data iterator(s) still being freed by TensorFlow "
              f"after {EXIT_WAIT_SECONDS:g} s; exiting anyway.", file=sys.stderr, flush=True)
