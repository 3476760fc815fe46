"""One epoch of ``fit``, in the shape of Orbit's ``Controller.train``: one
loop over the cadence's plans (`tfdist.loops.cadence.Cadence.plan`), one
runner call per plan (`tfdist.loops.runners.base.Runner.train`).

A plan is either a stretch of quiet executions, run back to back (nothing
for the host to do between them), or one reported execution, after which
the loop does what that point asks: batch callbacks, a log line (metrics
read), a save. A stop agreed by every worker saves and ends the run; the
data running out or a callback setting ``model.stop_training`` ends the
epoch. `Trainer.fit` owns the epochs around it (validation, epoch saves,
epoch callbacks).
"""

import dataclasses
from typing import Callable, Dict, Optional

import keras

from tfdist.checkpoint import Position
from tfdist.loops.cadence import Cadence
from tfdist.loops.runners import Execution, Runner
from tfdist.training.progress import ProgressReporter


@dataclasses.dataclass(frozen=True)
class BatchReporting:
    """What ``fit``'s callbacks ask of each execution.

    Attributes:
      reads_metrics: a callback reads the batch logs (on any worker of the
        job): metrics are read after every execution.
      report_each: every execution is reported on its own (batch logs
        anywhere, or a training-batch hook here), none run in stretches.
    """

    reads_metrics: bool = False
    report_each: bool = False


@dataclasses.dataclass(frozen=True)
class TrainerActions:
    """What the epoch loop asks of the Trainer at its points.

    Attributes:
      save: saves a checkpoint at a save point.
      stop: every worker agreed to stop: saves and raises `Preempted`.
      check_writes: raises a failed background checkpoint write.
    """

    save: Callable[[], None]
    stop: Callable[[], None]
    check_writes: Callable[[], None]


class EpochLoop:
    """Runs the executions of ``fit``'s epochs (`run`, one call per epoch).

    Args:
      model: the Keras model (its ``stop_training`` ends an epoch early).
      runner: dispatches the steps.
      cadence: execution sizes, log points and save points of the ``fit`` call.
      position: the run's position, advanced as steps run.
      metrics: the metric state (`tfdist.replica.metrics`).
      reporter: progress lines and batch summaries.
      callbacks: the ``fit`` call's Keras ``CallbackList``.
      reporting: what the callbacks read per batch.
      stop_requested: True once this process was asked to stop (a signal).
      actions: the Trainer's saves and stops.
    """

    def __init__(self, model: keras.Model, runner: Runner, cadence: Cadence, position: Position,
                 *, metrics, reporter: ProgressReporter, callbacks, reporting: BatchReporting,
                 stop_requested: Callable[[], bool], actions: TrainerActions):
        self._model = model
        self._runner = runner
        self._cadence = cadence
        self._position = position
        self._metrics = metrics
        self._reporter = reporter
        self._callbacks = callbacks
        self._reporting = reporting
        self._stop_requested = stop_requested
        self._actions = actions

    def run(self, iterator, total_steps: Optional[int]) -> bool:
        """Runs one epoch's executions (``total_steps``: its length when
        known); returns True if the data ran out."""
        position = self._position
        if position.step_in_epoch == 0:  # (resumed mid-epoch: the checkpoint has them)
            self._metrics.reset()
        self._reporter.start_epoch()
        cadence = self._cadence
        if total_steps is not None:  # a known length: no execution past the end
            cadence = dataclasses.replace(cadence, steps_per_epoch=total_steps)
        while not cadence.epoch_done(position.step_in_epoch):
            self._actions.check_writes()
            plan = cadence.plan(position.step, position.step_in_epoch,
                                report_each=self._reporting.report_each)
            step_before, step_in_epoch_before = position.step, position.step_in_epoch
            if plan.reported:
                self._callbacks.on_train_batch_begin(position.step_in_epoch)
            execution = self._runner.train(iterator, plan, self._stop_requested, position.advance)
            if plan.reported:
                if execution.steps == 0 and not execution.stop:
                    return True  # out of data (as Keras: no batch end)
                self._report(cadence, execution, step_before, step_in_epoch_before, total_steps)
            if execution.stop:
                self._actions.stop()
            if execution.end_of_data:
                return True
            if self._model.stop_training:  # a callback ended training (as in Keras)
                return False
        return False

    def _report(self, cadence: Cadence, execution: Execution, step_before: int,
                step_in_epoch_before: int, total_steps: Optional[int]) -> None:
        """After a reported execution: sync, log, batch callbacks, save."""
        position = self._position
        log_point = cadence.is_log_point(step_in_epoch_before, position.step_in_epoch)
        save_point = cadence.is_save_point(step_before, position.step)
        if log_point or save_point or execution.stop or self._reporting.reads_metrics:
            self._runner.sync()
        logs = {}
        if log_point:
            logs = self._log(total_steps)
        elif self._reporting.reads_metrics:
            logs = self._metrics.results()
        self._callbacks.on_train_batch_end(position.step_in_epoch - 1, logs)
        if save_point:
            self._actions.save()

    def _log(self, total_steps: Optional[int]) -> Dict[str, float]:
        """Reads the metrics and reports a log point; returns the logs."""
        position = self._position
        logs, examples_seen = self._metrics.results_and_examples()
        self._reporter.log_point(epoch=position.epoch, step_in_epoch=position.step_in_epoch,
                                 total_steps=total_steps, global_step=position.step,
                                 values=logs, examples_seen=examples_seen)
        return logs
