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
further `release` waits for one of them to end. At exit, and when a stopped
job frees its memory (`tfdist.loops.preemption`), `wait` lets the pending
ones finish, with a bound.

A call that fails (an error in a callback, a model that cannot trace, a
Ctrl-C) leaves its iterator in the frames of the exception's traceback, and
a traceback is a reference cycle: the iterator then dies whenever Python's
garbage collector next runs, on whichever thread allocates, in a later
step or test, and that thread stands still for TensorFlow's teardown
(docs/performance.md#the-iterator-teardown-stall). `releases_on_error` wraps the Trainer's ``fit``,
``evaluate`` and ``predict``: on the way out of a failure it clears the
local variables of tfdist's and TensorFlow's own frames the traceback
keeps alive, on the release thread, so the iterator is freed there, as
after a normal end. The user's frames keep their locals for a post-mortem.
"""

import atexit
import functools
import sys
import threading
import types
from typing import Any, Callable

MAX_PENDING = 2
# Exit waits this long for pending deletions: longer than TensorFlow's
# longest autotuning period (60 s), so a deletion under way always ends
# before the interpreter does. One that ends while the interpreter is
# finalizing aborts the process: its thread, back from TensorFlow, is ended
# by Python inside TensorFlow's C++ frames ("FATAL: exception not
# rethrown", exit code 134).
EXIT_WAIT_SECONDS = 75.0
# After this long, exit says what it is waiting for.
EXIT_NOTICE_SECONDS = 5.0

_slots = threading.BoundedSemaphore(MAX_PENDING)
_changed = threading.Condition()
_pending = 0


def release(owner: Any, attribute: str = "iterator") -> None:
    """Takes ``owner.<attribute>`` (setting it to None) and drops it on a
    release thread. Taken here, no frame of the caller holds it; nothing
    else may (else the deletion happens wherever the last reference goes)."""
    holder = [getattr(owner, attribute)]
    setattr(owner, attribute, None)
    if holder[0] is not None:
        _on_release_thread(holder.clear)  # the blocking part: TensorFlow's teardown


def _on_release_thread(work: Callable[[], None]) -> None:
    """Runs ``work`` on a release thread of its own, counted as pending
    until it ends; waits first while `MAX_PENDING` are under way."""
    global _pending  # pylint: disable=global-statement
    _slots.acquire()
    with _changed:
        _pending += 1
    try:
        threading.Thread(target=_run, args=(work,), name="tfdist-iterator-release",
                         daemon=True).start()
    except RuntimeError:  # the interpreter is exiting: no new threads
        _run(work)


def _run(work: Callable[[], None]) -> None:
    global _pending  # pylint: disable=global-statement
    try:
        work()
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


def _is_internal(frame: types.FrameType) -> bool:
    """A frame of tfdist's or TensorFlow's own code (not the user's), or of
    code AutoGraph generated from a function it traced."""
    module = frame.f_globals.get("__name__", "")
    return (module.split(".")[0] in ("tfdist", "tensorflow")
            or module.startswith("__autograph_generated_file"))


def forget_internal_frames(error: BaseException) -> None:
    """Clears, on a release thread, the local variables of tfdist's and
    TensorFlow's finished frames that ``error``'s tracebacks keep alive
    (module docstring). Frames still running (the caller's) are left alone."""
    frames = [frame for frame in _frames_of(error) if _is_internal(frame)]

    def clear():  # the last references to the iterator may go here
        for frame in frames:
            try:
                frame.clear()
            except RuntimeError:  # still executing (the caller and its callers)
                pass
        frames.clear()

    _on_release_thread(clear)


def _frames_of(error: BaseException):
    """Every frame ``error``'s tracebacks (its own, its causes' and
    contexts') keep alive: those listed, and their callers through
    ``f_back`` (TensorFlow filters its own frames out of a traceback, but
    the user's frame it keeps still links to them)."""
    errors, seen_errors, seen_frames = [error], set(), set()
    while errors:
        current = errors.pop()
        if current is None or id(current) in seen_errors:
            continue
        seen_errors.add(id(current))
        traceback = current.__traceback__
        while traceback is not None:
            frame = traceback.tb_frame
            while frame is not None and id(frame) not in seen_frames:
                seen_frames.add(id(frame))
                yield frame
                frame = frame.f_back
            traceback = traceback.tb_next
        errors += [current.__cause__, current.__context__]


def releases_on_error(method: Callable) -> Callable:
    """``method``, whose failures leave no data iterator in their
    traceback's internal frames (`forget_internal_frames`): its epoch
    generators close, their iterators go to the release thread."""

    @functools.wraps(method)
    def calling(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except BaseException as error:
            forget_internal_frames(error)
            raise

    return calling


@atexit.register
def _free_before_exit() -> None:
    """Lets pending deletions finish before the interpreter does
    (`EXIT_WAIT_SECONDS`), saying so if that takes a while."""
    if not pending() or wait(min(EXIT_NOTICE_SECONDS, EXIT_WAIT_SECONDS)):
        return
    print(f"tfdist: waiting for TensorFlow to free {pending()} data iterator(s) before "
          f"exiting (up to {EXIT_WAIT_SECONDS:g} s)", file=sys.stderr, flush=True)
    if not wait(max(EXIT_WAIT_SECONDS - EXIT_NOTICE_SECONDS, 0.0)):
        print(f"tfdist: {pending()} data iterator(s) still being freed by TensorFlow "
              f"after {EXIT_WAIT_SECONDS:g} s; exiting anyway.", file=sys.stderr, flush=True)
