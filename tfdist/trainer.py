"""The loop: `Trainer.fit` / `Trainer.evaluate` for compiled Keras 3 models.

>>> strategy = tfdist.make_strategy("mirrored", num_replicas=4)
>>> with strategy.scope():
...     model = build_model()
...     model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
...                   metrics=["accuracy"])
>>> trainer = tfdist.Trainer(model, strategy, checkpoint_dir="/tmp/run1")
>>> history = trainer.fit(train_ds, epochs=3, validation_data=val_ds)
>>> history.history["loss"], trainer.evaluate(val_ds)

Datasets yield GLOBAL batches. Training on N replicas gives the same weights,
losses and metrics as Keras ``model.fit`` on one device over the same batches
(to float32 round-off), partial and empty replica batches included.

The outer loop here handles cadence (log points, checkpoints, validation,
callbacks); the compiled inner loop lives in `tfdist.runners`, the replica
math in `tfdist.step`.
"""

import contextlib
import dataclasses
import warnings
from typing import Dict, List, Optional

import keras
import tensorflow as tf

from tfdist import _keras, cluster
from tfdist import data as data_lib
from tfdist.checkpoint import TrainingCheckpoint
from tfdist.errors import ConfigurationError
from tfdist.metrics import MetricState
from tfdist.preemption import Preempted, PreemptionWatcher
from tfdist.progress import ProgressReporter
from tfdist import runners
from tfdist.step import ReplicaSteps


def _positive_int(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"`{name}` ({value!r}) must be a positive integer.")


def _check_compiled(model) -> None:
    if not isinstance(model, keras.Model):
        raise ConfigurationError(
            f"`model` must be a keras.Model; got {type(model).__name__}."
        )
    if not getattr(model, "compiled", False) or model.optimizer is None:
        raise ConfigurationError(
            f"Model {model.name!r} is not compiled. Call `model.compile("
            "optimizer=..., loss=..., metrics=[...])` inside strategy.scope() "
            "before creating the Trainer."
        )


def _check_created_in_scope(model, strategy) -> None:
    variables = list(model.variables)
    if model.optimizer.built:
        variables += list(model.optimizer.variables)
    for variable in variables:
        tf_variable = getattr(variable, "value", variable)
        if not strategy.extended.variable_created_in_scope(tf_variable):
            raise ConfigurationError(
                f"Variable {variable.path!r} of model {model.name!r} was "
                "created outside strategy.scope(). Build and compile the "
                "model inside `with strategy.scope():` so its variables are "
                "placed on every replica."
            )


def _element_spec(data, strategy, what: str):
    if isinstance(data, data_lib.EpochDataset):
        data = data.make_dataset(0)
    if isinstance(data, tf.data.Dataset):
        return data.element_spec
    if callable(data):
        context = tf.distribute.InputContext(
            num_input_pipelines=1,
            input_pipeline_id=0,
            num_replicas_in_sync=strategy.num_replicas_in_sync,
        )
        return data(context).element_spec
    raise ConfigurationError(
        f"The {what} must be a tf.data.Dataset of global batches "
        f"(x, y[, sample_weight]), a tfdist.data.EpochDataset or a "
        f"dataset_fn(input_context); got {type(data).__name__}. For arrays, "
        "use tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size)."
    )


def _known_steps(data, epoch) -> Optional[int]:
    """Batches per epoch when the dataset knows its cardinality, else None."""
    if isinstance(data, data_lib.EpochDataset):
        data = data.make_dataset(epoch)
    if isinstance(data, tf.data.Dataset):
        cardinality = int(data.cardinality())
        return cardinality if cardinality >= 0 else None
    return None


@dataclasses.dataclass
class _Position:
    """Where training stands: the checkpointed data position."""

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0


class Trainer:
    """Trains a compiled Keras model under any synchronous tf.distribute strategy.

    Args:
      model: a compiled ``keras.Model`` built inside ``strategy.scope()``.
      strategy: from `tfdist.make_strategy` or any ``tf.distribute.Strategy``.
      checkpoint_dir: where checkpoints (and, by default, summaries) go;
        ``fit`` resumes from the newest checkpoint found there.
      log_dir: TensorBoard directory; default ``<checkpoint_dir>/logs``.
      steps_per_execution: steps run per host call in a device-side loop.
      jit_compile: compile the forward/backward pass with XLA (use with
        ``partial_batch="pad"`` so shapes stay static).
      partial_batch: "exact", "drop" or "pad" (see `tfdist.data`).
      global_batch_size: only needed by "drop"/"pad" when the batch size can
        not be read from the dataset.
      shard_policy: how workers split global-batch datasets (`tfdist.data`).
      log_every_steps: steps between progress lines and batch summaries.
      checkpoint_every_steps: also save every this many steps.
      checkpoint_every_epoch: save at the end of every epoch (default).
      max_to_keep: checkpoints kept.
    """

    def __init__(
        self,
        model: keras.Model,
        strategy: tf.distribute.Strategy,
        *,
        checkpoint_dir: Optional[str] = None,
        log_dir: Optional[str] = None,
        steps_per_execution: int = 1,
        jit_compile: bool = False,
        partial_batch: str = "exact",
        global_batch_size: Optional[int] = None,
        shard_policy: str = "auto",
        log_every_steps: int = 100,
        checkpoint_every_steps: Optional[int] = None,
        checkpoint_every_epoch: bool = True,
        max_to_keep: int = 3,
    ):
        _check_compiled(model)
        _check_created_in_scope(model, strategy)
        _positive_int("steps_per_execution", steps_per_execution)
        _positive_int("log_every_steps", log_every_steps)
        _positive_int("checkpoint_every_steps", checkpoint_every_steps, True)
        if partial_batch not in data_lib.PARTIAL_BATCH_POLICIES:
            raise ConfigurationError(
                f"`partial_batch` ({partial_batch!r}) must be one of "
                f"{data_lib.PARTIAL_BATCH_POLICIES}."
            )
        self.model = model
        self.strategy = strategy
        self.steps_per_execution = steps_per_execution
        self._partial_batch = partial_batch
        self._global_batch_size = global_batch_size
        self._log_every_steps = log_every_steps
        self._checkpoint_every_steps = checkpoint_every_steps
        self._checkpoint_every_epoch = checkpoint_every_epoch
        # Under multi-worker strategies only the chief writes summaries and
        # prints progress; every worker computes the same history.
        self._is_chief = getattr(strategy.extended, "should_checkpoint", True)
        self._log_dir = (log_dir or (
            f"{checkpoint_dir}/logs" if checkpoint_dir else None
        )) if getattr(strategy.extended, "should_save_summary", True) else None
        with strategy.scope():
            self._metrics = MetricState(model)
        steps = ReplicaSteps(model, self._metrics, jit_compile=jit_compile)
        runner = runners.for_strategy(strategy)
        self._runner = runner(strategy, steps.train, steps.evaluate, shard_policy=shard_policy)
        self._checkpoint = (
            TrainingCheckpoint(
                model, checkpoint_dir, max_to_keep=max_to_keep,
                is_chief=self._is_chief,
                task_name=f"{cluster.task_type() or 'worker'}-{cluster.task_id()}",
            )
            if checkpoint_dir
            else None
        )
        self._position = _Position()
        self._built_spec = None

    # -- set-up ------------------------------------------------------------

    def _explain_failures(self):
        """A lost peer or parameter server becomes an error naming it."""
        directory = self._checkpoint.directory if self._checkpoint else None
        return self._runner.explain_failures(directory)

    @property
    def step(self) -> int:
        """Training steps taken so far, checkpointed runs included."""
        return self._position.step

    def _build(self, data, what: str = "dataset") -> None:
        spec = _element_spec(data, self.strategy, what)
        data_lib.validate_element_spec(spec, what)
        if self._built_spec is None:
            with self.strategy.scope():
                _keras.build_model_state(self.model, spec)
            self._built_spec = spec
            if self._checkpoint is not None:
                self._checkpoint.track_metrics(self._metrics.variables())

    def _restore(self) -> Optional[str]:
        if self._checkpoint is None:
            # Like Keras: each fit call counts epochs from 0 (steps go on).
            self._position = _Position(step=self._position.step)
            return
        path = self._checkpoint.restore_latest()
        if path is not None:
            self._position = _Position(
                step=int(self._checkpoint.step.numpy()),
                epoch=int(self._checkpoint.epoch.numpy()),
                step_in_epoch=int(self._checkpoint.step_in_epoch.numpy()),
            )
        return path

    def _save(self) -> None:
        if self._checkpoint is not None:
            position = self._position
            self._checkpoint.save(
                position.step, position.epoch, position.step_in_epoch
            )

    # -- training ----------------------------------------------------------

    def fit(
        self,
        data,
        epochs: int = 1,
        steps_per_epoch: Optional[int] = None,
        validation_data=None,
        validation_steps: Optional[int] = None,
        callbacks: Optional[List[keras.callbacks.Callback]] = None,
        verbose="auto",
    ) -> keras.callbacks.History:
        """Trains for ``epochs`` epochs; returns a Keras ``History``.

        Without ``checkpoint_dir`` every call trains ``epochs`` epochs, as
        Keras ``fit`` does. With it, ``epochs`` is the total the run should
        reach: training resumes from the newest checkpoint there, so a
        restarted job finishes the same run. With ``steps_per_epoch``, one
        iterator runs on across the epochs of a call (as in Keras); without
        it, every epoch is one full pass over the data.
        """
        _positive_int("epochs", epochs)
        _positive_int("steps_per_epoch", steps_per_epoch, True)
        if steps_per_epoch is None and self._runner.needs_steps_per_epoch:
            raise ConfigurationError(
                "Parameter-server training needs `steps_per_epoch`: workers read "
                "repeated shards of the data, so an epoch has no natural end."
            )
        verbose = 1 if verbose == "auto" else verbose
        verbose = verbose if self._is_chief else 0
        self._build(data)
        if validation_data is not None:
            self._build(validation_data, "validation_data")
        restored = self._restore()
        if restored and verbose:
            position = self._position
            print(f"restored {restored}: epoch {position.epoch + 1}, step "
                  f"{position.step_in_epoch} of the epoch, {position.step} in all",
                  flush=True)
        reporter = ProgressReporter(verbose=verbose, log_dir=self._log_dir)
        callback_list = keras.callbacks.CallbackList(
            callbacks, add_history=True, model=self.model, verbose=verbose,
            epochs=epochs, steps=steps_per_epoch,
        )
        self.model.stop_training = False
        persistent = steps_per_epoch is not None and not isinstance(
            data, data_lib.EpochDataset
        )
        iterator = None
        # SIGTERM / Ctrl-C -> every worker stops at one step (saving first,
        # where there is a checkpoint to save to).
        watcher = PreemptionWatcher()
        callback_list.on_train_begin()
        with self._explain_failures(), watcher, contextlib.closing(reporter):
            while self._position.epoch < epochs and not self.model.stop_training:
                epoch = self._position.epoch
                if iterator is None or not persistent:
                    # Batches of this run's data already trained on.
                    skip = self._position.step_in_epoch + (
                        epoch * steps_per_epoch if persistent else 0
                    )
                    iterator = self._runner.iterator(
                        data, epoch=epoch, skip_steps=skip,
                        partial_batch=self._partial_batch,
                        global_batch_size=self._global_batch_size,
                    )
                callback_list.on_epoch_begin(epoch)
                exhausted = self._train_epoch(
                    iterator, epoch, steps_per_epoch, reporter, callback_list,
                    total_steps=steps_per_epoch or _known_steps(data, epoch),
                    watcher=watcher,
                )
                if exhausted and persistent:
                    warnings.warn(
                        "The input ran out of data; interrupting training. "
                        "Make sure the dataset yields at least steps_per_epoch "
                        "* epochs batches (e.g. with `.repeat()`)."
                    )
                    self.model.stop_training = True
                self._runner.sync()
                logs = self._metrics.results()
                if validation_data is not None:
                    val_logs = self.evaluate(validation_data, steps=validation_steps)
                    logs.update({f"val_{k}": v for k, v in val_logs.items()})
                steps_done = self._position.step_in_epoch
                self._position.epoch += 1
                self._position.step_in_epoch = 0
                if self._checkpoint_every_epoch:
                    self._save()
                reporter.epoch_end(epoch=epoch, steps=steps_done, logs=logs)
                callback_list.on_epoch_end(epoch, logs)
        callback_list.on_train_end()
        return self.model.history

    def _train_epoch(
        self, iterator, epoch, steps_per_epoch, reporter, callbacks, total_steps,
        watcher,
    ) -> bool:
        """Runs one epoch's executions; returns True if the data ran out."""
        if self._position.step_in_epoch == 0:
            # (A run resumed mid-epoch keeps the metric state its checkpoint
            # brought back, so the epoch reports what it would have.)
            self._metrics.reset()
        reporter.start_epoch()
        position = self._position
        next_log = (
            position.step_in_epoch // self._log_every_steps + 1
        ) * self._log_every_steps
        while steps_per_epoch is None or position.step_in_epoch < steps_per_epoch:
            num_steps = self.steps_per_execution
            if steps_per_epoch is not None:
                num_steps = min(num_steps, steps_per_epoch - position.step_in_epoch)
            if self._checkpoint_every_steps:
                to_save = self._checkpoint_every_steps - position.step % self._checkpoint_every_steps
                num_steps = min(num_steps, to_save)
            callbacks.on_train_batch_begin(position.step_in_epoch)
            ran, stop = self._runner.train(iterator, num_steps, watcher.requested)
            position.step += ran
            position.step_in_epoch += ran
            logs = {}
            at_save = ran and self._checkpoint_every_steps and (
                position.step % self._checkpoint_every_steps == 0
            )
            if position.step_in_epoch >= next_log or at_save:
                self._runner.sync()
            if position.step_in_epoch >= next_log:
                next_log += self._log_every_steps
                logs = self._metrics.results()
                reporter.log_point(
                    epoch=epoch, step_in_epoch=position.step_in_epoch,
                    total_steps=total_steps, global_step=position.step,
                    values=logs,
                    examples_seen=float(self._metrics.examples_seen.numpy()),
                )
            callbacks.on_train_batch_end(position.step_in_epoch - 1, logs)
            if at_save:
                self._save()
            if stop:
                self._runner.sync()
                self._save()
                stop = Preempted(
                    position.step, watcher.signum, saved=self._checkpoint is not None
                )
                print(f"{cluster.task_type() or 'worker'}-{cluster.task_id()}: {stop}", flush=True)
                raise stop
            if ran < num_steps:
                return True
        return False

    def evaluate(self, data, steps: Optional[int] = None) -> Dict[str, float]:
        """Loss and metrics over ``data`` (or its first ``steps`` batches).

        Every example counts once; the result equals Keras ``evaluate`` on one
        device. Uses "pad" when training does, else "exact" (never drops).
        """
        _positive_int("steps", steps, True)
        self._build(data, "evaluation dataset")
        policy = "pad" if self._partial_batch == "pad" else "exact"
        with self._explain_failures():
            self._metrics.reset()
            self._runner.evaluate(data, steps=steps, partial_batch=policy,
                                  global_batch_size=self._global_batch_size)
            return self._metrics.results()
