"""Engines that start tfdist's workers: Ray Train (`tfdist.integrations.ray`)
and Spark barrier stages (`tfdist.integrations.spark`)."""

from tfdist._internal import lazy

__all__ = ["ray", "spark"]  # public modules
__getattr__ = lazy.attributes(__name__, {})
