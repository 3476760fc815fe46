"""Evaluation beside training: an ``evaluator`` task evaluates every new
checkpoint while the workers train (TensorFlow's SidecarEvaluator, Orbit's
continuous evaluation), for the same program.

A task whose ``TF_CONFIG`` names it ``evaluator`` (``tfdist-run
--evaluator`` starts one; on a cluster, the platform's evaluator task) runs
the program like any worker, but its strategy is one local device that
joins no cluster, and its ``fit`` (`Trainer.fit` or ``attach``'s) does not
train: it watches the checkpoint directory
(``checkpointing=tfdist.CheckpointOptions(directory=...)``) and, for each
checkpoint listed there (a checkpoint being written is not listed yet),
reads the model's weights, evaluates ``fit``'s validation data, prints a
line and writes the metrics as TensorBoard scalars to
``<log_dir>/evaluator`` (``tfdist.ReportingOptions(log_dir=...)``; by
default ``logs/evaluator`` in the checkpoint directory) at the
checkpoint's step.
It ends after evaluating the checkpoint of the last epoch ``fit`` asked
for, or with an error naming the directory when no new checkpoint comes
for ``TFDIST_EVALUATOR_TIMEOUT`` seconds (default 3600). It never takes
part in a collective, so it can not slow or stop training; a checkpoint
deleted before it is read (``CheckpointOptions(max_to_keep=...)``) or
damaged is skipped, saying so.
"""

import os
import re
import time
from typing import Callable, Dict, Optional

import keras
import tensorflow as tf

from tfdist.errors import ConfigurationError

TIMEOUT_ENV = "TFDIST_EVALUATOR_TIMEOUT"
DEFAULT_TIMEOUT_SECONDS = 3600.0
POLL_SECONDS = 0.5


def evaluate_checkpoints(*, checkpoint, evaluate: Callable[[], Dict[str, float]],
                         has_validation_data: bool, epochs: int,
                         log_dir: Optional[str]) -> keras.callbacks.History:
    """Evaluates each new checkpoint of ``checkpoint`` (a `TrainingCheckpoint`)
    with ``evaluate`` until the one at ``epochs``; returns a History of
    ``val_*`` values, one per checkpoint evaluated (``history.epoch`` holds
    their steps)."""
    if checkpoint is None or checkpoint.directory is None:
        raise ConfigurationError(
            "This task is an evaluator: it evaluates the checkpoints training writes, so "
            "the Trainer (or attach) needs `checkpointing=tfdist.CheckpointOptions(directory)`, "
            "the directory the chief writes to.")
    if not has_validation_data:
        raise ConfigurationError(
            "This task is an evaluator: it evaluates each checkpoint on fit's validation "
            "data. Pass `validation_data=` (or `validation_split=`) to fit.")
    timeout = _timeout_seconds()
    writer = tf.summary.create_file_writer(os.path.join(log_dir, "evaluator")) if log_dir else None
    history = keras.callbacks.History()
    history.history, history.epoch = {}, []
    evaluated = -1
    waiting_since = time.monotonic()
    while True:
        for path in checkpoint.listed():
            number = _number(path)
            if number <= evaluated:
                continue
            evaluated = number
            waiting_since = time.monotonic()
            try:
                position = checkpoint.read_model(path)
            except (tf.errors.NotFoundError, tf.errors.DataLossError, IndexError) as error:
                print(f"[evaluator] skipping {os.path.basename(path)}: "
                      f"{str(error).splitlines()[0][:200]}", flush=True)
                continue
            logs = evaluate()
            _report(path, position, logs, writer, history)
            if position.epoch >= epochs and position.step_in_epoch == 0:
                return history
        if time.monotonic() - waiting_since > timeout:
            raise TimeoutError(
                f"The evaluator waited {timeout:g} s for a new checkpoint in "
                f"{checkpoint.directory} (last evaluated: step {max(evaluated, 0)}); the chief "
                f"wrote none. Set {TIMEOUT_ENV} to wait longer.")
        time.sleep(POLL_SECONDS)


def _report(path, position, logs, writer, history) -> None:
    values = ", ".join(f"{name} {float(value):.4f}" for name, value in logs.items())
    print(f"[evaluator] {os.path.basename(path)} (epoch {position.epoch}, step "
          f"{position.step}): {values}", flush=True)
    history.epoch.append(position.step)
    for name, value in logs.items():
        history.history.setdefault(f"val_{name}", []).append(float(value))
    if writer is not None:
        with writer.as_default(step=position.step):
            for name, value in logs.items():
                tf.summary.scalar(name, float(value))
        writer.flush()


def _number(path: str) -> int:
    match = re.search(r"-(\d+)$", path)
    return int(match.group(1)) if match else -1


def _timeout_seconds() -> float:
    text = os.environ.get(TIMEOUT_ENV)
    if text is None:
        return DEFAULT_TIMEOUT_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigurationError(f"{TIMEOUT_ENV} ({text!r}) must be a positive number of seconds.")
    return value
