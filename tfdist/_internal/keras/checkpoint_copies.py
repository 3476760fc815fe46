"""Host copies of Keras variables for background checkpoint saves. User:
`tfdist.checkpoint.background_writes`.
Tested with Keras 3.15 and 3.16; `tests/_internal/test_keras_contract.py` pins what it reads.
"""

import contextlib


def _reuse_host_copy(self, object_map):
    """Keras' ``Variable._copy_trackable_to_cpu`` without its new variable:
    the host copy of the wrapped ``tf.Variable`` stands for the Keras one."""
    self.value._copy_trackable_to_cpu(object_map)  # pylint: disable=protected-access
    object_map[self] = object_map[self.value]


@contextlib.contextmanager
def host_copies_reused():
    """Within this block, background checkpoint saves copy Keras variables
    into the same host variables every time.

    Keras 3.15's ``Variable._copy_trackable_to_cpu`` makes a new
    ``tf.Variable`` on every call. TensorFlow's async checkpoint copies
    state in a ``tf.function``, which may create variables on its first
    trace only, so the third async save of a Keras model fails ("only
    supports singleton tf.Variables"). The wrapped variable's own copy
    (``ResourceVariable._copy_trackable_to_cpu``) is reused and assigned
    on each save, which is what the checkpoint needs.
    """
    from tfdist._internal.keras import privates  # pylint: disable=import-outside-toplevel

    core = privates.tensorflow_ops("core")
    original = core.Variable.__dict__["_copy_trackable_to_cpu"]
    core.Variable._copy_trackable_to_cpu = _reuse_host_copy  # pylint: disable=protected-access
    try:
        yield
    finally:
        core.Variable._copy_trackable_to_cpu = original  # pylint: disable=protected-access
