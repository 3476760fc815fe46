"""Stretches of executions with nothing for the host to do between them.

Between two log points, save points or the epoch's end, and when no
callback has a training-batch hook, `Trainer.fit` has nothing to do after
an execution but count it and look for a stop request. Its full
per-execution path (callbacks, cadence, position, log and save checks) is
~15 us of Python, 1.5-2% of a ~1 ms step on one device, so it hands such a
stretch to the runner's ``train_many`` instead. The contract, shared by
every runner:

- ``train_many(iterator, executions, num_steps, stop_requested, advance)``
  runs ``executions`` executions of ``num_steps`` steps each, in order;
- after each, it calls ``advance(steps run)`` (the position stays exact
  even when an execution raises) and asks ``stop_requested()``;
- it returns ``(ran_out, stop)`` as soon as the data ends (an execution ran
  short) or a stop is agreed (``stop``, as ``train`` returns it: on every
  worker at the same execution), else ``(False, False)`` after all.

`run_each` is that contract over the runner's own ``train``: what
parameter servers and multi-worker jobs use (``train`` agrees on stops
across workers); `SynchronousRunner.train_many` has a bare loop for data
that certainly lasts on one worker.
"""

from typing import Callable


def run_each(runner, iterator, executions: int, num_steps: int,
             stop_requested: Callable[[], bool], advance: Callable[[int], None]):
    """``executions`` calls of ``runner.train``; returns ``(ran_out, stop)``."""
    for _ in range(executions):
        ran, stop = runner.train(iterator, num_steps, stop_requested())
        advance(ran)
        if stop or ran < num_steps:
            return ran < num_steps, stop
    return False, False
