"""Run a tfdist program on Spark executors (optional extra: ``[spark]``).

`run(train_fn, num_workers=N)` starts N tasks together in a Spark barrier
stage (every task starts at once or none does), gives each a ``TF_CONFIG``
for a MultiWorkerMirroredStrategy cluster built from the tasks' hosts and a
free port each, runs ``train_fn()`` in every task and returns the chief's
(task 0's) result to the driver. It is the role of spark-tensorflow-
distributor's ``MirroredStrategyRunner``, with tfdist's exact training inside:
``train_fn`` calls ``tfdist.make_strategy("multi_worker_mirrored")`` as under
``tfdist-run``.

Each task runs ``train_fn`` in a fresh Python process of its own (spawned,
not forked): TensorFlow reads ``TF_CONFIG`` once, when its runtime starts,
and Spark reuses Python workers between tasks by default
(``spark.python.worker.reuse``), so a reused worker would keep the previous
run's cluster. ``train_fn`` and its result travel with cloudpickle, so
``train_fn`` may be a closure; the modules it imports must be importable on
the executors.

Failure: when a task fails, Spark aborts the barrier stage (a barrier result
stage is not retried) and `run` raises `SparkTrainingError` with the failed
task's traceback. Every wait is bounded: ``timeout_seconds`` cancels the
Spark job and raises, and tfdist's peer health check ends the surviving
tasks when one dies (`tfdist.strategies.multi_worker`).
"""

import json
import multiprocessing
import os
import queue
import socket
import threading
import time
import traceback
import uuid
from typing import Any, Callable, Optional

from tfdist._internal import validation
from tfdist.errors import ConfigurationError, SparkTrainingError

# How long a task waits for its training process to report after it exits.
_RESULT_GRACE_SECONDS = 30.0



def _import_pyspark():
    try:
        import pyspark  # noqa: F401
        from pyspark import cloudpickle
    except ImportError as error:  # pragma: no cover - depends on the extra
        raise ConfigurationError(
            "tfdist.integrations.spark needs pyspark: pip install -e \".[spark]\" (and a "
            "Java runtime, e.g. Debian's openjdk-17-jre-headless)."
        ) from error
    return cloudpickle


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the Spark task's process ends (Spark
    kills the other tasks of a failed barrier stage; their training must not
    outlive them)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: tfdist's peer check still ends it
        pass


def _train_in_process(payload: bytes, tf_config: str, results) -> None:
    """Body of a task's training process: TF_CONFIG first, then train."""
    _die_with_parent()
    os.environ["TF_CONFIG"] = tf_config
    from pyspark import cloudpickle

    try:
        train_fn = cloudpickle.loads(payload)
        results.put(("ok", cloudpickle.dumps(train_fn())))
    except BaseException as error:  # reported to the driver with its traceback
        results.put(("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))
        raise SystemExit(1)


def _run_training_process(payload: bytes, tf_config: str, task: str, timeout: Optional[float]):
    """Runs ``train_fn`` in a spawned process; its result, or raises."""
    from pyspark import cloudpickle

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=_train_in_process, args=(payload, tf_config, results),
                              name=f"tfdist-spark-{task}")
    process.start()
    try:
        # The result is read before the process is joined: a process whose
        # result is larger than a pipe's buffer exits only once it is read.
        status, value = _result_of(process, results, task, timeout)
        process.join(_RESULT_GRACE_SECONDS)
    finally:
        if process.is_alive():
            process.kill()
            process.join(10)
    if status == "error":
        raise SparkTrainingError(f"{task}: train_fn raised {value}")
    return cloudpickle.loads(value)


def _result_of(process, results, task: str, timeout: Optional[float]):
    """(status, value) from ``process``, waiting at most ``timeout`` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            return results.get(timeout=1.0)
        except queue.Empty:
            pass
        if not process.is_alive():
            try:  # it may have put its result just before exiting
                return results.get(timeout=_RESULT_GRACE_SECONDS)
            except queue.Empty:
                raise SparkTrainingError(
                    f"{task}: the training process exited with code {process.exitcode} "
                    "without a result (killed?).") from None
        if deadline is not None and time.monotonic() > deadline:
            raise SparkTrainingError(f"{task}: training did not finish within {timeout} s.")


def _barrier_task(payload: bytes, timeout: Optional[float]):
    """The function each barrier task runs (pickled to the executors)."""

    def task(_partition):
        from pyspark import BarrierTaskContext

        context = BarrierTaskContext.get()
        index = context.partitionId()
        host = context.getTaskInfos()[index].address.rsplit(":", 1)[0]
        # The port is chosen while the socket is bound and released just
        # before TensorFlow binds it (the same small race as tfdist-run).
        with socket.socket() as probe:
            probe.bind((host, 0))
            addresses = context.allGather(f"{host}:{probe.getsockname()[1]}")
        tf_config = json.dumps({"cluster": {"worker": list(addresses)},
                                "task": {"type": "worker", "index": index}})
        result = _run_training_process(payload, tf_config, f"spark task worker-{index}", timeout)
        yield result if index == 0 else None

    return task


def run(train_fn: Callable[[], Any], num_workers: int, *, spark=None,
        timeout_seconds: Optional[float] = 3600.0) -> Any:
    """Runs ``train_fn()`` on ``num_workers`` Spark tasks as one
    MultiWorkerMirroredStrategy cluster; returns task 0's (the chief's)
    return value.

    Args:
      train_fn: a function without arguments that builds its strategy with
        ``tfdist.make_strategy("multi_worker_mirrored")`` and trains; it may
        return any picklable value (weights, a history dict).
      num_workers: Spark tasks (TensorFlow workers); the cluster needs that
        many free task slots at once (a barrier stage).
      spark: a ``SparkSession`` or ``SparkContext``; default: the active
        session (``SparkSession.builder.getOrCreate()``).
      timeout_seconds: bound on the whole run; the Spark job is cancelled
        and `SparkTrainingError` raised when it is exceeded (None: no bound).

    Raises:
      ConfigurationError: bad ``num_workers`` / ``timeout_seconds``, or fewer
        task slots than ``num_workers``.
      SparkTrainingError: a task failed (its traceback included) or the run
        exceeded ``timeout_seconds``.
    """
    validation.positive_int("num_workers", num_workers)
    if timeout_seconds is not None and not timeout_seconds > 0:
        raise ConfigurationError(
            f"`timeout_seconds` must be a positive number of seconds or None; "
            f"got {timeout_seconds!r}.")
    if not callable(train_fn):
        raise ConfigurationError(
            f"`train_fn` must be a function without arguments; got {train_fn!r}.")
    cloudpickle = _import_pyspark()
    context = _spark_context(spark)
    slots = context.defaultParallelism
    if slots < num_workers:
        raise ConfigurationError(
            f"`num_workers={num_workers}` needs {num_workers} Spark task slots at "
            f"once (a barrier stage), but this Spark has {slots} "
            f"(master {context.master!r}). Use fewer workers or a larger cluster.")

    payload = cloudpickle.dumps(train_fn)
    group = f"tfdist-{uuid.uuid4().hex[:12]}"
    context.setJobGroup(group, f"tfdist: {num_workers} training workers", interruptOnCancel=True)
    timed_out = threading.Event()

    def cancel():
        timed_out.set()
        context.cancelJobGroup(group)

    timer = threading.Timer(timeout_seconds, cancel) if timeout_seconds else None
    if timer:
        timer.daemon = True
        timer.start()
    try:
        rdd = context.parallelize(range(num_workers), num_workers)
        results = rdd.barrier().mapPartitions(_barrier_task(payload, timeout_seconds)).collect()
    except Exception as error:
        if timed_out.is_set():
            raise SparkTrainingError(
                f"the Spark training job did not finish within {timeout_seconds} s "
                "and was cancelled.") from error
        raise SparkTrainingError(_task_failure(error)) from error
    finally:
        if timer:
            timer.cancel()
        context.setLocalProperty("spark.jobGroup.id", None)
    return results[0]


def _spark_context(spark):
    if spark is None:
        from pyspark.sql import SparkSession
        spark = SparkSession.builder.getOrCreate()
    return getattr(spark, "sparkContext", spark)


def _task_failure(error: Exception) -> str:
    """The failed task's own traceback out of Spark's job-abort message."""
    message = str(error)
    start = message.find("Traceback (most recent call last):")
    detail = message[start:] if start >= 0 else message
    return "a Spark training task failed; Spark aborted the barrier stage:\n" + detail[:6000]


__all__ = ["run"]
