"""The static-shape path: what TPUs need, selectable (and tested) on CPUs.

A TPU compiles the whole step with XLA for one set of shapes. So on this
path every global batch has the full global batch size (a partial final
batch is padded, with a mask of 0.0 on the padding that losses, metrics
and batch statistics honour, so results stay exact), the forward and
backward pass is XLA-compiled, and steps run in the Trainer's host loops
(``steps_per_execution``).

``static_shapes=None`` (the default everywhere) means: on for a
``TPUStrategy``, off otherwise. ``static_shapes=True`` on a one-device or
mirrored strategy runs the same path on CPUs or GPUs, which is how tfdist
tests it without a TPU.

Which to use when (both are exact; neither is deprecated):

- On a TPU: nothing. A ``TPUStrategy`` takes this path by itself (and
  compiles the whole step, so tfdist adds no ``jit_compile``).
- XLA on GPUs or CPUs: ``jit_compile=True`` with ``DataOptions(partial_batch="pad")``. Training
  and evaluation then run at one shape, exactly as here; ``predict`` keeps
  the exact last batch.
- Rehearsing the TPU job on CPUs or GPUs (with `tfdist.tpu.preflight`):
  ``static_shapes=True``. It is the same padded, XLA-compiled step, plus
  what a TPU also needs: ``predict`` pads its last batch too, and
  ``partial_batch="exact"`` (changing shapes) is an error instead of a
  second XLA compilation for the last batch.

>>> import tfdist
>>> strategy = tfdist.make_strategy("one_device")
>>> tfdist.replica.static_shapes.resolve(strategy, static_shapes=True, partial_batch=None,
...                                      jit_compile=False)
StepOptions(partial_batch='pad', jit_compile=True, static_shapes=True)
"""

import dataclasses
from typing import Optional

import tensorflow as tf

from tfdist.errors import ConfigurationError

_STATIC_POLICIES = ("pad", "drop")


def is_tpu(strategy: tf.distribute.Strategy) -> bool:
    """Whether ``strategy`` runs on TPUs (TPUStrategy and its variants)."""
    return isinstance(strategy, (tf.distribute.TPUStrategy,
                                 tf.distribute.experimental.TPUStrategy))


@dataclasses.dataclass(frozen=True)
class StepOptions:
    """How batches are shaped and steps compiled."""

    partial_batch: str
    jit_compile: bool
    static_shapes: bool


def resolve(strategy, *, static_shapes: Optional[bool], partial_batch: Optional[str],
            jit_compile: bool) -> StepOptions:
    """The step options for ``strategy`` and the user's choices.

    Raises:
      ConfigurationError: ``static_shapes`` is not a bool or None, or it
        is on together with ``partial_batch="exact"`` (whose partial batches
        change shape).
    """
    if static_shapes is not None and not isinstance(static_shapes, bool):
        raise ConfigurationError(
            f"`static_shapes` ({static_shapes!r}) must be True, False or None "
            "(None: on for a TPUStrategy, off otherwise)."
        )
    tpu = is_tpu(strategy)
    static = tpu if static_shapes is None else static_shapes
    if (jit_compile or (static and not tpu)) and isinstance(
            strategy, tf.distribute.experimental.ParameterServerStrategy):
        raise ConfigurationError(
            f"`{'jit_compile' if jit_compile else 'static_shapes'}=True` is not supported under "
            "ParameterServerStrategy: XLA compiles the step on a worker, and the variables live "
            "on the parameter servers (TensorFlow: 'Trying to access resource ... located in "
            "device /job:ps'). Compile the model without jit_compile.")
    if not static:
        return StepOptions(partial_batch or "exact", jit_compile, False)
    if partial_batch not in (None,) + _STATIC_POLICIES:
        raise ConfigurationError(
            f"`partial_batch={partial_batch!r}` gives batches of changing shape, "
            f"but the static-shape path is on ({'a TPUStrategy' if tpu else 'static_shapes=True'}). "
            "Use partial_batch='pad' (pads the last batch with a mask, exact) or "
            "'drop', or leave partial_batch unset."
        )
    # A TPUStrategy compiles the whole step itself; elsewhere the
    # forward/backward pass is compiled as one XLA program.
    return StepOptions(partial_batch or "pad", not tpu, True)


__all__ = ["StepOptions", "is_tpu", "resolve"]
