"""Lists a checkpoint tracks: TensorFlow saves an object's list
attributes as its ``ListWrapper``, which has no public name; tfdist gives
a sharded optimizer's checkpoint the lists Keras' optimizer would have
(`tfdist.communication.sharded_checkpoints`). Pinned by
`tests/_internal/test_tensorflow_contract.py` (listed in `privates`).

>>> is_list(tracked_list([1, 2])), is_list((1,)), is_list({})
(True, True, False)
"""

from tensorflow.python.trackable import data_structures


def tracked_list(items) -> list:
    """``items`` as the list a checkpoint tracks (TensorFlow's ListWrapper)."""
    return data_structures.ListWrapper(list(items))


def is_list(value) -> bool:
    """Whether ``value`` is a list, a tuple or a tracked list."""
    return isinstance(value, (list, tuple, data_structures.ListWrapper))
