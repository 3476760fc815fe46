"""Cloud TPU support: ``tfdist.make_strategy("tpu")`` connects to the TPU
(`tfdist.tpu.connect`), and a CPU preflight finds what would stop a step
from running on a TPU (`tfdist.tpu.preflight`). The TPU's static-shape
training path itself is `tfdist.replica.static_shapes`, usable (and tested)
on CPU replicas. ``tfdist.tpu.tpu_strategy`` is a deprecated alias of
``make_strategy("tpu")``.

>>> import tfdist
>>> strategy = tfdist.make_strategy("tpu", tpu="local")   # doctest: +SKIP
>>> strategy.num_replicas_in_sync                         # doctest: +SKIP
8
"""

import warnings
from typing import Optional

from tfdist.tpu import connect
from tfdist.tpu.preflight import preflight
from tfdist.tpu.report import PreflightReport, Problem


def tpu_strategy(tpu: Optional[str] = None, zone: Optional[str] = None,
                 project: Optional[str] = None, *, timeout_seconds: float = 60.0):
    """Deprecated: use ``tfdist.make_strategy("tpu", tpu=..., zone=...,
    project=..., timeout_seconds=...)``, which takes the same arguments.

    >>> import tfdist
    >>> strategy = tfdist.tpu.tpu_strategy(tpu="local")     # doctest: +SKIP
    """
    warnings.warn(
        "tfdist.tpu.tpu_strategy is deprecated; use tfdist.make_strategy(\"tpu\", ...), "
        "which takes the same arguments.", DeprecationWarning, stacklevel=2)
    return connect.tpu_strategy(tpu, zone, project, timeout_seconds=timeout_seconds)


__all__ = ["PreflightReport", "Problem", "preflight"]
