"""The checkpoint keys TensorFlow gives the objects a checkpoint reaches.

A worker that writes its own slices of a checkpoint (`tfdist.checkpoint.
slice_writes`) writes them under the keys the chief's checkpoint gives the
same objects, so that the chief can merge the files into one checkpoint.
TensorFlow names an object by its path from the checkpoint's root
(``model/layer_with_weights-0/kernel``) and a saved value by that path and
its attribute (``.../.ATTRIBUTES/VARIABLE_VALUE``), as its saver does
(``save_util``). Tested with TensorFlow 2.19-2.21;
``tests/_internal/test_checkpoint_keys.py`` compares them with the keys of
a written checkpoint.
"""

from typing import Callable, Dict

from tensorflow.python.checkpoint import graph_view
from tensorflow.python.trackable import trackable_utils

VALUE = "VARIABLE_VALUE"  # the attribute a variable's value is saved under


def value_keys(root, wanted: Callable[[object], bool]) -> Dict[str, object]:
    """``{checkpoint key of its value: object}`` for each object reachable
    from ``root`` (a ``tf.train.Checkpoint``) for which ``wanted(object)``."""
    _, paths = graph_view.ObjectGraphView(root).breadth_first_traversal()
    return {trackable_utils.checkpoint_key(trackable_utils.object_path_to_string(path), VALUE):
            trackable for trackable, path in paths.items() if wanted(trackable)}
