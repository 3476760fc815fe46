"""Cloud TPU support: ``tfdist.make_strategy("tpu")`` connects to the TPU
(`tfdist.strategies.tpu`), and a CPU preflight finds what would stop a step
from running on a TPU, and what would waste it (`tfdist.tpu.preflight`). The TPU's static-shape
training path itself is `tfdist.replica.static_shapes`, usable (and tested)
on CPU replicas.

>>> import tfdist
>>> strategy = tfdist.make_strategy("tpu", tpu="local")   # doctest: +SKIP
>>> strategy.num_replicas_in_sync                         # doctest: +SKIP
8
"""

from tfdist.tpu.preflight import preflight
from tfdist.tpu.report import Advice, PreflightReport, Problem

__all__ = ["Advice", "PreflightReport", "Problem", "preflight"]
