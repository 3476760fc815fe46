"""`tfdist._internal.state_writes`: what it finds in traced code, and the
TensorFlow private it reads (``Graph._functions``)."""

import keras
import tensorflow as tf

from tfdist._internal.state_writes import Writes


def _found_while_tracing(body) -> list:
    found = []

    @tf.function
    def traced(x):
        writes = Writes(tf.compat.v1.get_default_graph())
        result = body(x)
        found.extend(writes.found())
        return result

    traced(tf.ones((2, 3)))
    return found


def test_a_graph_keeps_the_functions_its_loops_add():
    """The private this module reads: a while loop's body is added to the
    graph's ``_functions`` (name -> function with a ``definition``)."""
    names = []

    @tf.function
    def traced(x):
        graph = tf.compat.v1.get_default_graph()
        before = set(graph._functions)  # pylint: disable=protected-access
        result = tf.while_loop(lambda i, x: i < 2, lambda i, x: (i + 1, x * 2), (0, x))
        names.extend(set(graph._functions) - before)  # pylint: disable=protected-access
        assert all(graph._functions[n].definition.node_def  # pylint: disable=protected-access
                   for n in names)
        return result

    traced(tf.constant(1.0))
    assert len(names) == 2  # the loop's condition and body


def test_a_dense_layer_writes_nothing():
    layer = keras.layers.Dense(2)
    layer.build((2, 3))  # (building assigns the initial values)
    assert _found_while_tracing(layer) == []


def test_batch_normalization_in_training_writes_its_statistics():
    layer = keras.layers.BatchNormalization()
    layer.build((2, 3))
    assert "AssignVariableOp" in _found_while_tracing(lambda x: layer(x, training=True))
    assert _found_while_tracing(lambda x: layer(x, training=False)) == []


def test_a_dropout_draws_from_its_seed_and_a_stateful_random_op_is_found():
    dropout = keras.layers.Dropout(0.5)
    assert _found_while_tracing(lambda x: dropout(x, training=True))
    assert _found_while_tracing(lambda x: x + tf.random.uniform(tf.shape(x)))
    assert _found_while_tracing(lambda x: keras.layers.Dropout(0.0)(x, training=True)) == []


def test_a_write_inside_a_loop_body_is_found():
    counter = tf.Variable(0.0)

    def body(x):
        def step(i, total):
            counter.assign_add(1.0)
            return i + 1, total + x
        return tf.while_loop(lambda i, total: i < 3, step, (0, tf.zeros_like(x)))[1]

    assert "AssignAddVariableOp" in _found_while_tracing(body)
