"""What tfdist reads of a ``keras.distribution`` object that Keras gives
no public name: a ``ModelParallel``'s `LayoutMap` (its rules, which
`tfdist.parallel.layouts` checks against a model); and the one function
Keras' TensorFlow backend lacks for a distribution set with
``keras.distribution.set_distribution``: ``distribute_tensor``, which
``Layer.__call__`` calls for every ``"<path>/output"`` rule (without it a
layer with such a rule raises ``AttributeError`` on TensorFlow).
`lay_out_outputs_on_the_batch` gives it: an output laid out over the
batch's axis alone is what the strategy's replicas already hold, so it is
returned as it is; any other layout is an error naming it. Tested with
Keras 3.15 and 3.16; `tests/_internal/test_keras_contract.py` pins it.

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


def splits_the_batch_only(axes: tuple, batch_axis: str) -> bool:
    """Whether an output layout's ``axes`` split nothing but dimension 0,
    over ``batch_axis`` (what the strategy's replicas hold already)."""
    return all(axis is None for axis in axes[1:]) and axes[:1] in ((), (None,), (batch_axis,))


def lay_out_outputs_on_the_batch(batch_axis: str, model_axis=None) -> None:
    """Gives Keras' TensorFlow backend a ``distribute_tensor`` (module
    doc) for layouts that split dimension 0 over ``batch_axis`` at most;
    with ``model_axis``, also those that split a middle dimension over it
    (sequence parallelism, which tfdist's layers have laid out already)."""
    from keras.src.backend.tensorflow import distribution_lib  # pylint: disable=import-outside-toplevel

    def distribute_tensor(tensor, layout):
        axes = tuple(getattr(layout, "axes", ()) or ())
        if model_axis is not None and model_axis in axes[1:-1]:
            return tensor
        if not splits_the_batch_only(axes, batch_axis):
            raise NotImplementedError(
                f"tfdist lays out layer outputs over the batch's axis {batch_axis!r} (their "
                f"first dimension) only; this layout is {axes}.")
        return tensor

    distribution_lib.distribute_tensor = distribute_tensor
