"""Datasets: tfdist's own TFDS builders and a loader for any TFDS dataset.

Importing this package registers tfdist's builders with TFDS, so
``tfds.load("synthetic_patterns")`` works too. Nothing here downloads:
our builders generate their data locally; other TFDS datasets must already
be prepared in ``data_dir``.
"""

from tfdist.data.datasets.loader import load_supervised, LOCAL_BUILDERS
from tfdist.data.datasets.synthetic_patterns import SyntheticPatterns

__all__ = ["LOCAL_BUILDERS", "SyntheticPatterns", "load_supervised"]
