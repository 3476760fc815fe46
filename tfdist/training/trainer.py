"""The loop: `Trainer.fit` / `evaluate` / `predict` for compiled Keras 3 models
(an example: `Trainer`). Data is Keras': datasets of GLOBAL batches, arrays
with ``batch_size``, ... N replicas give the same weights, losses and
metrics as Keras ``fit`` on one device over the same batches (float32
round-off), partial and empty replica batches included. The outer loop runs
the effects (executions, metric reads, saves, callbacks, validation);
`tfdist.loops.cadence` decides when, `tfdist.data.epochs` what data each
epoch reads, `tfdist.loops.runners` how a step is dispatched,
`tfdist.replica.step` the replica math."""

import contextlib
import dataclasses
import functools
import warnings
from typing import Dict, Optional

import keras
import tensorflow as tf

from tfdist import cluster
from tfdist._internal import validation
from tfdist._internal.keras import callbacks as keras_callbacks, model_state as keras_model_state
from tfdist._internal.keras.callback_files import ChiefOnlyFiles
from tfdist.checkpoint import Position, TrainingCheckpoint
from tfdist.communication.plan import Communication
from tfdist.data import epochs as epochs_lib, iterator_release, keras_inputs
from tfdist.loops import runners
from tfdist.loops.cadence import Cadence, ExecutionPlan
from tfdist.loops.runners.base import ignore_steps
from tfdist.loops.preemption import free_iterators_or_exit, Preempted, PreemptionWatcher
from tfdist.parallel.plan import ModelPlan
from tfdist.replica import accumulation, keras_steps, static_shapes as static_shapes_lib
from tfdist.training.epoch_loop import BatchReporting, EpochLoop, TrainerActions
from tfdist.training import compile_settings
from tfdist.training.options import (CheckpointOptions, DataOptions, ReportingOptions,
                                     check_records, refuse_moved_keywords, summary_dir)
from tfdist.training.predict import Predictor
from tfdist.training import sidecar, step_count
from tfdist.training.progress import ProgressReporter


class Trainer:
    """Trains a compiled Keras model under any synchronous tf.distribute strategy.

    >>> import keras, numpy as np, tensorflow as tf, tfdist
    >>> strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    >>> with strategy.scope():
    ...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, "softmax")])
    ...     model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    >>> trainer = tfdist.Trainer(model, strategy)  # checkpointing=...: saves, resumes
    >>> x, y = np.ones((10, 3), "float32"), np.zeros((10,), "int64")
    >>> history = trainer.fit(x, y, batch_size=4, epochs=2, verbose=0)
    >>> len(history.history["loss"]), trainer.step     # 3 global batches per epoch
    (2, 6)
    >>> probabilities = trainer.predict(x, batch_size=4)     # every example, in order
    >>> loss = trainer.evaluate(x, y, batch_size=4)["loss"]  # all 10 examples, each once
    >>> probabilities.shape, bool(np.isclose(loss, -np.log(probabilities[:, 0]).mean()))
    ((10, 2), True)
    >>> batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    >>> logs = trainer.run_one_batch(batches, training=True)  # train_on_batch on the 1st batch
    >>> bool(np.isclose(logs["loss"], loss)), trainer.step    # (its loss: before the update)
    (True, 7)

    Args:
      model: a compiled ``keras.Model`` built inside ``strategy.scope()``.
      strategy: from `tfdist.make_strategy` or any ``tf.distribute.Strategy``.
      checkpointing: a `tfdist.CheckpointOptions`: where and when to save;
        ``fit`` resumes from the newest checkpoint in its directory. None:
        no checkpoints.
      input_pipeline: a `tfdist.DataOptions`: the partial-batch policy,
        sharding, the tf.data service and the shuffle seed.
      reporting: a `tfdist.ReportingOptions`: TensorBoard directory and log cadence.
      static_shapes: the whole TPU path (`tfdist.replica.static_shapes`, which says
        when to use which): None: on for a TPUStrategy only; True rehearses it.
      communication: `Compression`, `LocalSGD` or `ShardedOptimizerState`
        (`tfdist.communication`), or a tuple.
      parallel: how the model is split (`tfdist.parallel.plan`): a
        `tfdist.parallel.Pipeline`, a ``keras.distribution.ModelParallel``
        (None: the one set with ``set_distribution``, if any), or both.

    What ``model.compile`` owns is read from it: ``steps_per_execution``
    (steps run per host call in a device-side loop) and ``jit_compile``
    (XLA for the forward and backward pass; with
    ``DataOptions(partial_batch="pad")`` for one shape on GPUs and CPUs).
    """

    @refuse_moved_keywords("tfdist.Trainer")
    def __init__(
        self, model: keras.Model, strategy: tf.distribute.Strategy, *,
        checkpointing: Optional[CheckpointOptions] = None,
        input_pipeline: Optional[DataOptions] = None,
        reporting: Optional[ReportingOptions] = None,
        static_shapes: Optional[bool] = None,
        communication=None,
        parallel=None,
    ):
        validation.check_compiled(model)
        validation.check_created_in_scope(model, strategy)
        check_records(checkpointing=checkpointing, input_pipeline=input_pipeline,
                      reporting=reporting)
        compiled = compile_settings.read(model)
        checkpointing = checkpointing or CheckpointOptions()
        data = input_pipeline or DataOptions()
        reporting = reporting or ReportingOptions()
        self._plan = ModelPlan.asked(parallel, strategy)  # how the model is split
        options = static_shapes_lib.resolve(
            strategy, static_shapes=static_shapes, partial_batch=data.partial_batch,
            jit_compile=self._plan.jit_compile(Communication.jit_compile(
                communication, compiled.jit_compile)),
        )
        self._plan.attach(model, strategy, communication=communication,
                          static_shapes=options.static_shapes)
        self._communication = Communication.attach(communication, model, strategy)
        self.model = model
        self.strategy = strategy
        self.steps_per_execution = compiled.steps_per_execution
        self.static_shapes = options.static_shapes
        self._data = dataclasses.replace(data, partial_batch=options.partial_batch)
        self._reporting = dataclasses.replace(
            reporting, log_dir=summary_dir(strategy, reporting.log_dir, checkpointing.directory))
        self._checkpointing = checkpointing
        self._built_spec = None  # the element spec the model's state was built for
        # Only the chief writes summaries and prints progress (all compute the history).
        self._is_chief = getattr(strategy.extended, "should_checkpoint", True)
        self._metrics, steps = self._plan.steps_for(
            model, strategy, jit_compile=options.jit_compile,
            static_shapes=options.static_shapes)
        self._steps = steps
        # A model with its own step may take data without y (as Keras allows).
        self._data_needs_y = not keras_steps.overridden(model)
        self._runner = runners.make_runner(
            strategy, steps.train, steps.evaluate,
            after_train_step=self._communication.after_train_step(steps.after_train_step),
            avoid_empty_replicas=steps.avoid_empty_replicas,
            shard_policy=self._data.shard_policy, data_service=self._data.data_service)
        self._checkpoint = _checkpoint_for(model, self._checkpointing, is_chief=self._is_chief)
        self._position = Position()
        self._predictor = None  # made by the first predict

    # -- set-up ------------------------------------------------------------

    def _explain_failures(self):
        """A lost peer or parameter server becomes an error naming it."""
        return self._runner.explain_failures(self._checkpointing.directory or None)

    @property
    def step(self) -> int:
        """Training steps taken so far, checkpointed runs included."""
        return self._position.step

    def _source(self, data, what: str) -> epochs_lib.Source:
        """Classifies and validates ``data``; builds the model's state on first use."""
        source = epochs_lib.as_source(data, what)
        spec = source.element_spec(self.strategy.num_replicas_in_sync)
        keras_steps.check_data(self.model, spec)
        if self._built_spec is None:
            self._plan.when_built(spec)  # (a model Keras builds on its first batch)
            with self.strategy.scope():
                keras_model_state.build_model_state(self.model, spec)
                accumulator = accumulation.accumulator_for(
                    self.model, self.strategy, self._plan.trainable_variables(self.model))
                self._steps.use_accumulator(accumulator)
                communication_state = self._communication.prepare(self.model)
            self._built_spec = spec
            if self._checkpoint is not None:
                self._checkpoint.track_state(self._metrics.variables(), accumulator,
                                             communication_state)
        return source

    def _fit_sources(self, x, y, sample_weight, **options):
        """Keras fit's data arguments as (training, validation or None) sources."""
        data, validation_data = keras_inputs.fit_data(
            x, y, sample_weight, seed=self._data.seed, targets=self._data_needs_y, **options)
        return self._source(data, "dataset"), (
            None if validation_data is None else self._source(validation_data, "validation_data"))

    def _restore(self, verbose=0, initial_epoch: int = 0) -> Optional[str]:
        """Restores the newest checkpoint (returns its path); else starts at
        ``initial_epoch`` (as Keras: each fit counts epochs from 0, steps go on)."""
        path = None if self._checkpoint is None else self._checkpoint.restore_latest()
        if path is None:
            self._position = Position(step=self._position.step, epoch=initial_epoch)
            return None
        position = self._position = self._checkpoint.position()
        if verbose:
            print(f"restored {path}: epoch {position.epoch + 1}, step "
                  f"{position.step_in_epoch} of the epoch, {position.step} in all", flush=True)
        return path

    def _save(self, synchronous: bool = False) -> None:
        self._communication.average_now()  # (also at epoch ends: identical weights)
        if self._checkpoint is not None:
            self._checkpoint.save_position(self._position, synchronous=synchronous)

    def _iterator(self, source, epoch: int, skip_steps: int):
        return self._runner.iterator(
            source, epoch=epoch, skip_steps=skip_steps, partial_batch=self._data.partial_batch,
            global_batch_size=self._data.global_batch_size)

    # -- training ----------------------------------------------------------

    @iterator_release.releases_on_error
    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None,
            validation_split=0.0, validation_data=None, shuffle=True, class_weight=None,
            sample_weight=None, initial_epoch=0, steps_per_epoch=None, validation_steps=None,
            validation_batch_size=None, validation_freq=1) -> keras.callbacks.History:
        """Trains for ``epochs`` epochs; returns a Keras ``History``.

        Without a checkpoint directory (``CheckpointOptions(directory)``)
        every call trains ``epochs`` epochs, as Keras ``fit`` does. With
        one, ``epochs`` is the total the run should
        reach: training resumes from the newest checkpoint there, so a
        restarted job finishes the same run. With ``steps_per_epoch``, one
        iterator runs on across the epochs of a call (as in Keras); without
        it, every epoch is one full pass over the data. The arguments are
        Keras ``fit``'s: ``x`` a dataset of global batches, a ``dataset_fn``,
        an `EpochDataset`, or arrays with ``y`` (`tfdist.data.keras_inputs`).
        """
        validation.check_fit_arguments(epochs, steps_per_epoch, initial_epoch, validation_freq)
        self._runner.check_fit(steps_per_epoch)
        verbose = validation.verbosity(verbose) if self._is_chief else 0
        source, validation_source = self._fit_sources(
            x, y, sample_weight, batch_size=batch_size, shuffle=shuffle, class_weight=class_weight,
            validation_split=validation_split, validation_data=validation_data,
            validation_batch_size=validation_batch_size)
        if cluster.task_type() == "evaluator":  # evaluates checkpoints beside training
            return sidecar.evaluate_checkpoints(
                checkpoint=self._checkpoint, has_validation_data=validation_source is not None,
                evaluate=lambda: self._evaluate(validation_source, validation_steps),
                epochs=epochs, log_dir=self._reporting.log_dir)
        step_count.warn_where_keras_counts_more(source, self.model,
                                                epochs - initial_epoch, steps_per_epoch)
        reporter = ProgressReporter(verbose=0 if self._reporting.keras_progress_bar else verbose,
                                    log_dir=self._reporting.log_dir)
        # Keras callbacks that write files: the chief writes to the paths given,
        # the other workers to private temporary paths removed at the end.
        with ChiefOnlyFiles(callbacks, is_chief=self._is_chief):
            callback_list = self._callback_list(
                callbacks, verbose, epochs, steps_per_epoch or source.known_steps(initial_epoch))
            reporting = self._batch_reporting(callback_list)
            # SIGTERM / Ctrl-C -> every worker stops at one step (saving first).
            watcher = PreemptionWatcher()
            initial_epoch = keras_callbacks.begin_training(self.model, callback_list, initial_epoch)
            self._restore(verbose, initial_epoch)
            epoch_loop = self._epoch_loop(  # (after the restore: it advances the restored position)
                steps_per_epoch, reporter, callback_list, reporting, watcher)
            written = (self._checkpoint.writes_finished() if self._checkpoint
                       else contextlib.nullcontext())
            with self._explain_failures(), watcher, contextlib.closing(reporter), written:
                try:
                    for epoch_data in epochs_lib.epoch_iterators(
                            source, functools.partial(self._iterator, source), self._position,
                            epochs=epochs, steps_per_epoch=steps_per_epoch,
                            first_epoch=initial_epoch,
                            fresh_each_epoch=self._runner.new_pass_each_epoch()):
                        epoch = epoch_data.epoch
                        callback_list.on_epoch_begin(epoch)
                        ran_out = epoch_loop.run(epoch_data.iterator, epoch_data.total_steps)
                        self._end_epoch_steps(ran_out=ran_out and epoch_data.outlives_epoch)
                        validates = (epoch + 1) % validation_freq == 0
                        logs = self._epoch_logs(validation_source if validates else None,
                                                validation_steps, callback_list)
                        steps_done = self._end_epoch()
                        reporter.epoch_end(epoch=epoch, steps=steps_done, logs=logs)
                        callback_list.on_epoch_end(epoch, logs)
                        if self.model.stop_training:
                            break
                except Preempted as stop:
                    epoch_data = None  # (its iterator is freed before the exit)
                    raise free_iterators_or_exit(stop) from None
            keras_callbacks.end_training(self.model, callback_list, epochs)
            return self.model.history

    def _epoch_loop(self, steps_per_epoch, reporter, callback_list, reporting,
                    watcher) -> EpochLoop:
        cadence = Cadence(self.steps_per_execution, self._reporting.log_every_steps,
                          self._checkpointing.every_steps, steps_per_epoch)
        actions = TrainerActions(save=self._save, stop=functools.partial(self._stop, watcher),
                                 check_writes=self._check_writes)
        return EpochLoop(self.model, self._runner, cadence, self._position,
                         metrics=self._metrics, reporter=reporter, callbacks=callback_list,
                         reporting=reporting, stop_requested=lambda: watcher.requested,
                         actions=actions)

    def _callback_list(self, callbacks, verbose, epochs, steps):
        return keras_callbacks.callback_list(
            callbacks, self.model, add_progbar=self._reporting.keras_progress_bar and verbose != 0,
            verbose=verbose, epochs=epochs, steps=steps)

    def _batch_reporting(self, callback_list) -> BatchReporting:
        # Metrics are read at every batch only if a callback reads them (on any worker).
        reads_metrics = self._runner.any_worker(keras_callbacks.wants_batch_logs(callback_list))
        # One at a time for a batch hook here or batch logs anywhere (reads: collectives).
        return BatchReporting(reads_metrics=reads_metrics, report_each=(
            reads_metrics or keras_callbacks.has_train_batch_hooks(callback_list)))

    def _check_writes(self) -> None:
        if self._checkpoint is not None:  # a failed background write stops here
            self._checkpoint.raise_write_error()

    def _end_epoch_steps(self, ran_out: bool) -> None:
        """Applies a partial accumulation, averages local SGD; stops if out of data."""
        self._communication.average_now()
        if self._steps.accumulator is not None:
            self._steps.accumulator.flush()
        if ran_out:  # as Keras: a warning, and training stops
            warnings.warn("The input ran out of data; interrupting training. Make sure the "
                          "dataset yields at least steps_per_epoch * epochs batches (e.g. "
                          "with `.repeat()`).")
            self.model.stop_training = True

    def _epoch_logs(self, validation_source, validation_steps, callbacks) -> Dict[str, float]:
        """The epoch's results, plus ``val_`` ones (between ``on_test_begin`` / ``_end``)."""
        self._runner.sync()
        logs = self._metrics.results()
        if validation_source is not None:
            callbacks.on_test_begin()
            val_logs = self._evaluate(validation_source, validation_steps)
            callbacks.on_test_end(val_logs)
            logs.update({f"val_{k}": v for k, v in val_logs.items()})
        return logs

    def _end_epoch(self) -> int:
        """Moves to the next epoch (saving when asked); returns the epoch's steps."""
        steps_done = self._position.step_in_epoch
        self._position.next_epoch()
        if self._checkpointing.every_epoch:
            self._save()
        return steps_done

    def _stop(self, watcher) -> None:
        """Every worker agreed to stop at this step: save, then exit."""
        self._runner.sync()
        self._save(synchronous=True)
        stop = Preempted(self._position.step, watcher.signum, saved=self._checkpoint is not None)
        print(f"{cluster.task_name()}: {stop}", flush=True)
        raise stop

    @iterator_release.releases_on_error
    def evaluate(self, x=None, y=None, batch_size=None, sample_weight=None,
                 steps: Optional[int] = None) -> Dict[str, float]:
        """Loss and metrics (a dict) over ``x`` (Keras' data arguments) or
        its first ``steps`` batches.

        Every example counts once; the result equals Keras ``evaluate`` on one
        device. Uses "pad" when training does, else "exact" (never drops).
        """
        validation.positive_int("steps", steps, True)
        data = keras_inputs.to_training_data(x, y, sample_weight, batch_size=batch_size,
                                             targets=self._data_needs_y)
        return self._evaluate(self._source(data, "evaluation dataset"), steps)

    @iterator_release.releases_on_error
    def predict(self, x, batch_size=None, steps: Optional[int] = None):
        """The model's outputs for every example of ``x`` (arrays, or a
        dataset of global batches of ``x``, ``(x,)`` or ``(x, y[, w])``), in
        order, as NumPy arrays in the model's output structure; every
        worker of a multi-worker job gets the whole result."""
        validation.positive_int("steps", steps, True)
        data = keras_inputs.prediction_batches(x, batch_size)
        if self._predictor is None:
            self._predictor = Predictor(self.model, self.strategy,
                                        coordinator_inline=self._runner.predicts_inline(),
                                        static_shapes=self.static_shapes)
        with self._explain_failures():
            return self._predictor.predict(data, steps)

    def run_one_batch(self, data, *, training: bool) -> Dict[str, float]:
        """Keras' ``train_on_batch`` / ``test_on_batch``: one step on the
        first global batch of ``data``; returns the metrics of that batch
        (reset first, as Keras 3 does)."""
        source = self._source(data, "batch")
        if not training:
            return self._evaluate(source, steps=1)
        with self._explain_failures():
            self._metrics.reset()
            execution = self._runner.train(self._iterator(source, 0, 0), ExecutionPlan(1),
                                           stop_requested=lambda: False, advance=ignore_steps)
            self._position.step += execution.steps
            self._runner.sync()
            return self._metrics.results()

    def _evaluate(self, source, steps: Optional[int]) -> Dict[str, float]:
        # Static shapes (TPU) pad the last batch; otherwise nothing is dropped.
        policy = self._data.evaluation_policy(self.static_shapes)
        with self._explain_failures():
            self._metrics.reset()
            self._runner.evaluate(source, steps=steps, partial_batch=policy,
                                  global_batch_size=self._data.global_batch_size)
            self._runner.sync()
            return self._metrics.results()


def _checkpoint_for(model, options: CheckpointOptions, *, is_chief: bool):
    """The run's `TrainingCheckpoint` (None without a directory)."""
    if not options.directory:
        return None
    return TrainingCheckpoint(model, options.directory, max_to_keep=options.max_to_keep,
                              is_chief=is_chief, task_name=cluster.task_name(),
                              async_write=options.async_write)
