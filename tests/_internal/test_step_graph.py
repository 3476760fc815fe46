"""`tfdist._internal.step_graph`: from inside a loop a replica's step
builds, the graph of the step; never past the step (a loop around
``strategy.run``). Pins what it reads of TensorFlow: MirroredStrategy's
replica threads keep the graph ``strategy.run`` was called in."""

import tensorflow as tf

import tfdist
from tfdist._internal import step_graph


def test_inside_a_loop_the_step_builds_it_is_the_steps_graph_and_no_further_out():
    strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    seen = {}

    def replica_step():
        seen["step"] = tf.compat.v1.get_default_graph()

        def body(i):
            seen["in_loop"] = step_graph.of_this_replica()
            seen["loop_body"] = tf.compat.v1.get_default_graph()
            return i + 1

        tf.while_loop(lambda i: i < 3, body, [tf.constant(0)])
        return tf.constant(0)

    def around(i):
        seen["around"] = tf.compat.v1.get_default_graph()
        strategy.run(replica_step)
        return i + 1

    @tf.function
    def steps():  # a loop around the step (steps_per_execution)
        tf.while_loop(lambda i: i < 2, around, [tf.constant(0)])

    steps.get_concrete_function()
    assert seen["loop_body"] is not seen["step"]
    assert seen["in_loop"] is seen["step"]
    assert seen["step"] is seen["around"]  # the step is traced in the loop around it
    assert step_graph.of_this_replica() is tf.compat.v1.get_default_graph()  # (no replica)
