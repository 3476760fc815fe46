"""``tensorflow_datasets``, imported with a clear error where its
dependencies do not fit this TensorFlow.

TensorFlow 2.19 needs protobuf 5, and ``tensorflow-metadata`` 1.21 (what
pip resolves beside ``tensorflow-datasets`` 4.9) is generated for protobuf
6: TFDS then imports without its ``core`` module, and the first use fails
with ``module 'tensorflow_datasets' has no attribute 'core'``. This module
turns that into an error naming the version and the fix.
"""

import tensorflow_datasets as tfds

from tfdist.errors import ConfigurationError


def tensorflow_datasets():
    """The ``tensorflow_datasets`` module, its ``core`` importable."""
    try:
        import tensorflow_datasets.core  # pylint: disable=import-outside-toplevel,unused-import
    except Exception as error:  # pylint: disable=broad-except
        import google.protobuf  # pylint: disable=import-outside-toplevel
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        raise ConfigurationError(
            f"tensorflow_datasets cannot import ({type(error).__name__}: {error}) with "
            f"TensorFlow {tf.__version__} and protobuf {google.protobuf.__version__}. "
            "TensorFlow 2.19 needs protobuf 5, which tensorflow-metadata 1.21 was not "
            "generated for: pip install \"tensorflow-metadata<1.21\" (docs/versions.md)."
        ) from error
    return tfds
