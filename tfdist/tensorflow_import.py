"""``tfdist.import_tensorflow()``: TensorFlow imported without its C++
start-up noise (the lines about CUDA drivers and CPU instructions that
TensorFlow prints before any output of a program's own). How the noise is
told apart, and ``TFDIST_TF_LOGS=1`` to see it: `tfdist._internal.tf_logs`.
"""

from tfdist._internal import tf_logs


def import_tensorflow():
    """Imports TensorFlow (and starts nothing else) without its start-up
    noise; for scripts, before they import ``keras`` or ``tensorflow``.

    >>> import tfdist
    >>> tf = tfdist.import_tensorflow()
    >>> tf.__name__
    'tensorflow'
    """
    return tf_logs.import_module("tensorflow")
