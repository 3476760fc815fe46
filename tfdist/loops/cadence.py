"""When things happen in a training run: pure arithmetic, no TensorFlow.

The Trainer asks `Cadence` how many steps the next execution runs, whether
the steps just taken reached a log point or a save point, and whether the
epoch is over. Keeping this apart from the effects (running steps, reading
metrics, writing checkpoints) lets it be tested on its own, resumes and
executions that do not divide the epoch included.

Positions are counted in steps: ``step`` over the whole run (what
checkpoints count), ``step_in_epoch`` within the current epoch.

>>> cadence = Cadence(steps_per_execution=8, log_every_steps=10,
...                   checkpoint_every_steps=12, steps_per_epoch=30)
>>> cadence.next_execution(step=0, step_in_epoch=0)
8
>>> cadence.next_execution(step=8, step_in_epoch=8)   # stops at the save point
4
>>> cadence.is_log_point(before=8, after=12), cadence.is_save_point(before=8, after=12)
(True, True)
"""

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class ExecutionPlan:
    """What the runner runs next (`tfdist.loops.runners.base.Runner.train`).

    Attributes:
      num_steps: steps per execution (one host call).
      executions: executions back to back with nothing for the host to do
        between them (no log point, save point or epoch end inside).
      reported: the execution is the one reaching a point: the loop calls
        the batch callbacks, logs and saves after it (then ``executions`` is 1).
      ends_epoch: the last execution ends the epoch (workers agree on stop
        requests there: `tfdist.loops.agreement`).
    """

    num_steps: int
    executions: int = 1
    reported: bool = True
    ends_epoch: bool = False

    @property
    def total_steps(self) -> int:
        """Steps of all the plan's executions."""
        return self.num_steps * self.executions


@dataclasses.dataclass(frozen=True)
class Cadence:
    """Execution sizes, log points and save points of one ``fit`` call.

    Args:
      steps_per_execution: steps per host call.
      log_every_steps: a log point every this many steps of an epoch.
      checkpoint_every_steps: a save point every this many steps of the run
        (None: only at epoch ends).
      steps_per_epoch: the epoch's length when the caller fixed it (None:
        an epoch ends when its data does).
    """

    steps_per_execution: int
    log_every_steps: int
    checkpoint_every_steps: Optional[int] = None
    steps_per_epoch: Optional[int] = None

    def next_execution(self, step: int, step_in_epoch: int) -> int:
        """Steps the next execution runs: ``steps_per_execution``, cut at
        the end of the epoch and at the next save point, so saves land on
        their step exactly."""
        size = self.steps_per_execution
        if self.steps_per_epoch is not None:
            size = min(size, self.steps_per_epoch - step_in_epoch)
        if self.checkpoint_every_steps:
            every = self.checkpoint_every_steps
            size = min(size, every - step % every)
        return size

    def quiet_executions(self, step: int, step_in_epoch: int) -> int:
        """How many executions from here run back to back with nothing for
        the host to do between them: each of ``steps_per_execution`` steps,
        none reaching a log point, a save point or the epoch's end (the
        Trainer runs them in one tight loop when no callback has a batch
        hook; the execution that reaches the point runs on its own).

        >>> Cadence(steps_per_execution=1, log_every_steps=100).quiet_executions(0, 0)
        99
        """
        room = self.log_every_steps - step_in_epoch % self.log_every_steps
        if self.steps_per_epoch is not None:
            room = min(room, self.steps_per_epoch - step_in_epoch)
        if self.checkpoint_every_steps:
            room = min(room, self.checkpoint_every_steps - step % self.checkpoint_every_steps)
        return max(0, (room - 1) // self.steps_per_execution)

    def plan(self, step: int, step_in_epoch: int, *, report_each: bool = False) -> ExecutionPlan:
        """The next executions from here: a stretch of quiet executions
        (`quiet_executions`) run back to back, else one reported execution
        of `next_execution` steps. ``report_each``: every execution is
        reported (a callback has a batch hook or reads batch logs).

        >>> cadence = Cadence(steps_per_execution=4, log_every_steps=10, steps_per_epoch=12)
        >>> cadence.plan(step=0, step_in_epoch=0)      # 0-4, 4-8 quiet; 8-12 logs
        ExecutionPlan(num_steps=4, executions=2, reported=False, ends_epoch=False)
        >>> cadence.plan(step=8, step_in_epoch=8)
        ExecutionPlan(num_steps=4, executions=1, reported=True, ends_epoch=True)
        """
        quiet = 0 if report_each else self.quiet_executions(step, step_in_epoch)
        if quiet:
            return ExecutionPlan(self.steps_per_execution, executions=quiet, reported=False)
        num_steps = self.next_execution(step, step_in_epoch)
        return ExecutionPlan(num_steps, ends_epoch=self.epoch_done(step_in_epoch + num_steps))

    def is_log_point(self, before: int, after: int) -> bool:
        """True when an execution from ``step_in_epoch`` ``before`` to
        ``after`` crossed (or reached) a multiple of ``log_every_steps``."""
        every = self.log_every_steps
        return after > before and after // every > before // every

    def is_save_point(self, before: int, after: int) -> bool:
        """True when an execution from run ``step`` ``before`` to ``after``
        reached a multiple of ``checkpoint_every_steps`` (executions are cut
        there, so ``after`` is that multiple)."""
        every = self.checkpoint_every_steps
        return bool(every) and after > before and after // every > before // every

    def epoch_done(self, step_in_epoch: int) -> bool:
        """True when a fixed-length epoch has run all its steps (an epoch of
        unknown length ends when an execution runs short)."""
        return self.steps_per_epoch is not None and step_in_epoch >= self.steps_per_epoch
