"""The Trainer's options, one record per concern (examples below).

`tfdist.Trainer` and `tfdist.attach` take the same keyword-only options:
what a run saves (``checkpointing=`` a `CheckpointOptions`), how its input
pipeline reads the data (``input_pipeline=`` a `DataOptions`), what a run
shows (``reporting=`` a `ReportingOptions`), ``static_shapes`` and
``communication``. What ``model.compile`` owns (``steps_per_execution``,
``jit_compile``) is read from ``model.compile`` only. A record checks its
values when it is made, so a wrong value fails where it was written, not at
the first ``fit``.

>>> import tfdist
>>> saves = tfdist.CheckpointOptions("/tmp/run", every_steps=500, async_write=True)
>>> saves.every_epoch, saves.max_to_keep
(True, 3)
>>> tfdist.DataOptions(partial_batch="pad").shard_policy
'auto'
>>> tfdist.ReportingOptions(log_every_steps=0)
Traceback (most recent call last):
...
tfdist.errors.ConfigurationError: tfdist.ReportingOptions: `log_every_steps` (0) must be a positive integer.
"""

import dataclasses
import functools
import numbers
from typing import Optional

from tfdist._internal import validation
from tfdist.data import options as data_options
from tfdist.data.distributed import PARTIAL_BATCH_POLICIES
from tfdist.errors import ConfigurationError


@dataclasses.dataclass(frozen=True)
class CheckpointOptions:
    """When and how a run saves; ``fit`` resumes from the newest checkpoint
    in ``directory``.

    Attributes:
      directory: where checkpoints (and, by default, summaries) go; None
        saves nothing.
      every_steps: also save every this many steps (None: at epoch ends only).
      every_epoch: save at each epoch's end.
      max_to_keep: checkpoints kept (None keeps every one, as in
        ``tf.train.CheckpointManager``).
      async_write: periodic and epoch saves written in the background
        (`tfdist.checkpoint`); the last save of a ``fit`` is complete when it
        returns.
    """

    directory: Optional[str] = None
    every_steps: Optional[int] = None
    every_epoch: bool = True
    max_to_keep: Optional[int] = 3
    async_write: bool = False

    def __post_init__(self):
        owner = "tfdist.CheckpointOptions"
        validation.positive_int("every_steps", self.every_steps, allow_none=True, owner=owner)
        validation.positive_int("max_to_keep", self.max_to_keep, allow_none=True, owner=owner)


@dataclasses.dataclass(frozen=True)
class DataOptions:
    """What each step reads.

    Attributes:
      partial_batch: "exact", "drop" or "pad" (`tfdist.data`); None: "exact",
        or "pad" where shapes must be static (`tfdist.replica.static_shapes`).
      global_batch_size: for "drop"/"pad" when the dataset does not show it.
      shard_policy: how workers split global-batch datasets (`tfdist.data`).
      data_service: a tf.data service address, or "auto" (`tfdist.data.service`).
      seed: seeds ``shuffle=True`` array orders (per epoch, the same on every worker).
    """

    partial_batch: Optional[str] = None
    global_batch_size: Optional[int] = None
    shard_policy: str = "auto"
    data_service: Optional[str] = None
    seed: int = 0

    def __post_init__(self):
        owner = "tfdist.DataOptions"
        validation.one_of("partial_batch", self.partial_batch,
                          (None,) + tuple(PARTIAL_BATCH_POLICIES), owner=owner)
        validation.positive_int("global_batch_size", self.global_batch_size,
                                allow_none=True, owner=owner)
        validation.one_of("shard_policy", self.shard_policy, tuple(data_options.SHARD_POLICIES),
                          owner=owner)
        if not isinstance(self.seed, numbers.Integral) or isinstance(self.seed, bool):
            raise ConfigurationError(f"{owner}: `seed` ({self.seed!r}) must be an integer.")

    def evaluation_policy(self, static_shapes: bool) -> str:
        """Evaluation pads when training does (or on static shapes); else it
        is exact: it never drops an example."""
        return "pad" if static_shapes or self.partial_batch == "pad" else "exact"


@dataclasses.dataclass(frozen=True)
class ReportingOptions:
    """What a run shows while it trains.

    Attributes:
      log_dir: TensorBoard directory; None: ``<checkpoint directory>/logs``,
        or no summaries without checkpoints.
      log_every_steps: steps between progress lines and batch summaries.
      keras_progress_bar: ``verbose`` shows Keras' progress bar (1) or one
        line per epoch (2) instead of tfdist's log lines (`tfdist.attach`
        sets it).
    """

    log_dir: Optional[str] = None
    log_every_steps: int = 100
    keras_progress_bar: bool = False

    def __post_init__(self):
        validation.positive_int("log_every_steps", self.log_every_steps,
                                owner="tfdist.ReportingOptions")


# Where the Trainer's former keywords went (named in unknown-option errors).
MOVED = {
    "checkpoint_dir": "checkpointing=tfdist.CheckpointOptions(directory=...)",
    "checkpoint_every_steps": "checkpointing=tfdist.CheckpointOptions(every_steps=...)",
    "checkpoint_every_epoch": "checkpointing=tfdist.CheckpointOptions(every_epoch=...)",
    "max_to_keep": "checkpointing=tfdist.CheckpointOptions(max_to_keep=...)",
    "async_checkpoint": "checkpointing=tfdist.CheckpointOptions(async_write=...)",
    "data": "input_pipeline=tfdist.DataOptions(...)",
    "partial_batch": "input_pipeline=tfdist.DataOptions(partial_batch=...)",
    "global_batch_size": "input_pipeline=tfdist.DataOptions(global_batch_size=...)",
    "shard_policy": "input_pipeline=tfdist.DataOptions(shard_policy=...)",
    "data_service": "input_pipeline=tfdist.DataOptions(data_service=...)",
    "seed": "input_pipeline=tfdist.DataOptions(seed=...)",
    "log_dir": "reporting=tfdist.ReportingOptions(log_dir=...)",
    "log_every_steps": "reporting=tfdist.ReportingOptions(log_every_steps=...)",
    "keras_progress_bar": "reporting=tfdist.ReportingOptions(keras_progress_bar=...)",
    "steps_per_execution": "model.compile(steps_per_execution=...)",
    "jit_compile": "model.compile(jit_compile=...)",
}

RECORDS = {"checkpointing": CheckpointOptions, "input_pipeline": DataOptions,
           "reporting": ReportingOptions}


def refuse_moved_keywords(where: str):
    """Decorates ``where``'s function (`tfdist.Trainer`, `tfdist.attach`) so a
    keyword in `MOVED` raises the error that names its new place, before
    Python's ``unexpected keyword argument``; the signature is unchanged.

    >>> @refuse_moved_keywords("f")
    ... def f(*, input_pipeline=None):
    ...     return input_pipeline
    >>> f(seed=1)
    Traceback (most recent call last):
    ...
    tfdist.errors.ConfigurationError: f's options moved: `seed=` is now `input_pipeline=tfdist.DataOptions(seed=...)`.
    """
    def decorate(function):
        @functools.wraps(function)
        def checked(*args, **kwargs):
            moved = sorted(name for name in kwargs if name in MOVED)
            if moved:
                raise ConfigurationError(
                    f"{where}'s options moved: "
                    + "; ".join(f"`{name}=` is now `{MOVED[name]}`" for name in moved) + ".")
            return function(*args, **kwargs)
        return checked
    return decorate


def check_records(**records) -> None:
    """`check_record` for each of `RECORDS` given by keyword (what
    `tfdist.Trainer` and `tfdist.attach` take)."""
    for argument, value in records.items():
        check_record(argument, value)


def check_record(argument: str, value) -> None:
    """Raises unless ``value`` is None or the record ``argument`` takes."""
    record = RECORDS[argument]
    if value is not None and not isinstance(value, record):
        raise ConfigurationError(
            f"`{argument}` must be a tfdist.{record.__name__} (or None); got "
            f"{type(value).__name__} {value!r}. Pass e.g. "
            f"`{argument}=tfdist.{record.__name__}(...)`.")


def summary_dir(strategy, log_dir: Optional[str], checkpoint_dir: Optional[str]) -> Optional[str]:
    """Where summaries go: ``log_dir``, else ``<checkpoint_dir>/logs``; None
    on a task that writes none (multi-worker: the chief writes them)."""
    if not getattr(strategy.extended, "should_save_summary", True):
        return None
    if log_dir:
        return log_dir
    return f"{checkpoint_dir}/logs" if checkpoint_dir else None
