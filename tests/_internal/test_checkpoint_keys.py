"""`tfdist._internal.checkpoint_keys` against the keys TensorFlow's saver
writes (the TensorFlow privates it reads: ``ObjectGraphView``,
``trackable_utils``)."""

import keras
import tensorflow as tf

from tfdist._internal import checkpoint_keys


def test_the_keys_are_those_a_written_checkpoint_uses(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                              keras.layers.BatchNormalization(), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    root = tf.train.Checkpoint(model=model, optimizer=model.optimizer, step=tf.Variable(1))
    keys = checkpoint_keys.value_keys(root, lambda t: isinstance(t, (keras.Variable, tf.Variable)))
    written = dict(tf.train.list_variables(root.write(str(tmp_path / "ckpt"))))
    values = {key for key in written if key.endswith("/.ATTRIBUTES/VARIABLE_VALUE")}
    assert set(keys) == values
    for key, variable in keys.items():
        assert written[key] == list(variable.shape), key
    assert len({id(v) for v in keys.values()}) == len(model.variables) + len(
        model.optimizer.variables) + 1  # (+ the step; `write` makes no save counter)
