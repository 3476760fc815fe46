"""Cloud TPU support: ``make_strategy("tpu")`` (`tfdist.tpu.connect`) and a
CPU preflight that finds what would stop a step from running on a TPU
(`tfdist.tpu.preflight`). The TPU's static-shape training path itself is
`tfdist.replica.static_shapes`, usable (and tested) on CPU replicas."""

from tfdist.tpu.connect import tpu_strategy
from tfdist.tpu.preflight import preflight
from tfdist.tpu.report import PreflightReport, Problem

__all__ = ["PreflightReport", "Problem", "preflight", "tpu_strategy"]
