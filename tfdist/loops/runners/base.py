"""The runner protocol: what the epoch loop asks of every strategy family.

A runner dispatches replica steps for one strategy family
(`SynchronousRunner`: ``strategy.run`` for one device, mirrored,
multi-worker mirrored and TPU; `CoordinatorRunner`: ``ClusterCoordinator``
for parameter servers). The epoch loop (`tfdist.training.epoch_loop`)
talks to it only through `Runner`, so it never names a strategy family.

One call trains, whatever the plan: ``train(iterator, plan,
stop_requested, advance)`` runs the `ExecutionPlan`'s executions in order
and returns an `Execution`. Between log points, save points and epoch
ends, and when no callback has a training-batch hook, the loop has
nothing to do after an execution but count it and look for a stop request
(yet its full per-execution path costs Python time that a fast step feels:
docs/performance.md#measurements-behind-design-choices), so the plan holds
a stretch of executions and the runner runs them back to back. The
contract, shared by every runner:

- after each execution it calls ``advance(steps run)`` (the position
  stays exact even when a later execution raises) and asks
  ``stop_requested()``;
- it returns as soon as the data ends (an execution ran short) or a stop
  is agreed (on every worker at the same execution), else after all.

`run_each` is that contract over a runner's single execution: what
parameter servers and multi-worker jobs use (each execution agrees on
stops across workers).
"""

from typing import Callable, ContextManager, Optional, Protocol, runtime_checkable

from tfdist.loops.cadence import ExecutionPlan
from tfdist.loops.execution import Execution


@runtime_checkable
class Runner(Protocol):
    """How the epoch loop dispatches steps under one strategy family."""

    def check_fit(self, steps_per_epoch: Optional[int]) -> None:
        """Raises `ConfigurationError` if ``fit`` cannot run this way
        (parameter servers need ``steps_per_epoch``: their data has no end)."""

    def new_pass_each_epoch(self) -> bool:
        """True when every epoch must read a fresh iterator even with
        ``steps_per_epoch`` (the tf.data service's per-epoch jobs)."""

    def predicts_inline(self) -> bool:
        """True when ``predict`` runs on this process, not through
        ``strategy.run`` (the parameter-server coordinator)."""

    def iterator(self, source, *, epoch: int, skip_steps: int, partial_batch: str,
                 global_batch_size: Optional[int] = None):
        """An iterator over ``source``'s batches for ``epoch`` after ``skip_steps``."""

    def train(self, iterator, plan: ExecutionPlan, stop_requested: Callable[[], bool],
              advance: Callable[[int], None]) -> Execution:
        """Runs ``plan`` (module docstring: the contract)."""

    def sync(self) -> None:
        """Waits until the steps dispatched so far are done (before metrics
        are read or a checkpoint is written)."""

    def evaluate(self, source, *, steps: Optional[int], partial_batch: str,
                 global_batch_size: Optional[int] = None) -> None:
        """Runs the evaluation step over ``source`` (or its first ``steps``)."""

    def any_worker(self, flag: bool) -> bool:
        """True on every worker when any worker passed True."""

    def explain_failures(self, checkpoint_dir: Optional[str] = None) -> ContextManager:
        """A context in which a lost task becomes an error naming it."""


def ignore_steps(steps: int) -> None:
    """An ``advance`` for callers that count nothing."""
    del steps


def run_each(execute: Callable[[object, int, bool, bool], tuple], iterator,
             plan: ExecutionPlan, stop_requested: Callable[[], bool],
             advance: Callable[[int], None]) -> Execution:
    """The plan, one ``execute(iterator, num_steps, requested, last)`` per
    execution (``(steps run, stop agreed)``); ``last``: the execution ends
    the epoch (workers agree there)."""
    steps_run = 0
    for index in range(plan.executions):
        last = plan.ends_epoch and index == plan.executions - 1
        ran, stop = execute(iterator, plan.num_steps, stop_requested(), last)
        advance(ran)
        steps_run += ran
        if stop or ran < plan.num_steps:
            return Execution(steps_run, stop=stop, end_of_data=ran < plan.num_steps)
    return Execution(steps_run)
