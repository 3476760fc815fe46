"""What tfdist reads of a ``keras.distribution`` object that Keras gives
no public name: a ``ModelParallel``'s `LayoutMap` (its rules, which
`tfdist.parallel.layouts` checks against a model). Tested with Keras 3.15
and 3.16; `tests/_internal/test_keras_contract.py` pins it.

>>> import keras
>>> mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], ["cpu:0", "cpu:1"])
>>> rules = keras.distribution.LayoutMap(mesh)
>>> rules["d1/kernel"] = (None, "model")
>>> list(layout_map_of(keras.distribution.ModelParallel(layout_map=rules)))
['d1/kernel']
"""


def layout_map_of(distribution):
    """The ``keras.distribution.LayoutMap`` a ``ModelParallel`` was made with."""
    return distribution._layout_map  # pylint: disable=protected-access
