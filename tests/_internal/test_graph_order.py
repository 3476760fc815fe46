"""`tfdist._internal.graph_order.run_after`: the edge it adds orders ops and
never closes a cycle (the sharded state's gradients rely on it)."""

import numpy as np
import tensorflow as tf

from tfdist._internal import graph_order


def test_tensorflow_still_has_the_op_internals_run_after_reads():
    """The private parts of TensorFlow's ops run_after uses (its own
    automatic control dependencies use them): if an upgrade removes one,
    this names it."""
    assert callable(getattr(tf.Operation, "_add_control_input", None))
    graph = tf.Graph()
    with graph.as_default():
        first = tf.constant(1.0)
        second = tf.identity(first)
        counter = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[], shared_name="x")
        update = tf.raw_ops.AssignVariableOp(resource=counter, value=second)
    assert first.op._id < second.op._id  # creation order
    assert update._is_stateful and not second.op._is_stateful
    assert list(first.op._control_outputs) == []


def test_the_edge_orders_the_producer_and_leaves_the_values_alone():
    traced = {}

    @tf.function
    def step(x):
        first = tf.reduce_sum(x * 3.0)
        gradient = tf.matmul(tf.reshape(x, [3, 1]), tf.reshape(x, [1, 3]))
        scaled = gradient * 0.5  # the producer is the matmul, not the scale
        traced["ordered"] = graph_order.run_after(scaled, first.op)
        traced["waits"] = [op.name for op in gradient.op.control_inputs]
        traced["first"] = first.op.name
        return scaled, first

    x = np.array([1.0, 2.0, 3.0], np.float32)
    scaled, first = step(tf.constant(x))
    assert traced["ordered"] and traced["waits"] == [traced["first"]]
    np.testing.assert_array_equal(scaled.numpy(), np.outer(x, x) * 0.5)
    assert float(first) == 18.0


def test_no_edge_when_the_other_op_depends_on_the_gradient():
    """A global-norm clip makes every exchanged gradient depend on every
    other gradient: ordering one after another would be a cycle."""
    traced = {}

    @tf.function
    def step(x):
        gradients = [x * 2.0, x * x]
        norm = tf.linalg.global_norm(gradients)
        exchanged = tf.reduce_sum(gradients[0] / norm)
        traced["ordered"] = graph_order.run_after(gradients[1], exchanged.op)
        return exchanged

    step(tf.constant([1.0, 2.0]))
    assert traced["ordered"] is False


def test_a_cycle_through_an_earlier_edge_is_found():
    """Edges already added point from newer ops to older ones, against the
    creation order the search prunes by; the search follows them."""
    traced = {}

    @tf.function
    def step(x):
        column, row = tf.reshape(x, [2, 1]), tf.reshape(x, [1, 2])
        older = tf.matmul(column, row)            # made first
        newer = tf.matmul(column * 2.0, row)      # made second
        waits_on_newer = tf.reduce_sum(newer)
        traced["first edge"] = graph_order.run_after(older, waits_on_newer.op)
        waits_on_older = tf.reduce_sum(older)     # so, through the edge, on newer
        traced["second edge"] = graph_order.run_after(newer, waits_on_older.op)
        return waits_on_older + waits_on_newer

    assert float(step(tf.constant([1.0, 2.0]))) == 27.0
    assert traced == {"first edge": True, "second edge": False}


def test_eager_and_sparse_gradients_are_left_alone():
    x = tf.constant([1.0, 2.0])
    assert graph_order.run_after(x * 2.0, None) is False
    assert graph_order.run_after(x * 2.0, tf.constant(1.0)) is False  # (eager)
    sparse = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), tf.constant([3, 2]))
    assert graph_order.run_after(sparse, tf.constant(1.0)) is False


def test_a_gradient_made_outside_a_branch_is_left_alone():
    """Inside a ``tf.cond`` branch (mixed precision's finite check, gradient
    accumulation) a gradient made before it is an input of the branch: it
    is made already, and no edge is added."""
    traced = {}

    @tf.function
    def step(x):
        gradient = tf.matmul(tf.reshape(x, [2, 1]), tf.reshape(x, [1, 2]))

        def apply():
            exchanged = tf.reduce_sum(x)
            traced["ordered"] = graph_order.run_after(gradient, exchanged.op)
            return gradient * exchanged

        return tf.cond(x[0] > 0, apply, lambda: gradient)

    assert step(tf.constant([1.0, 2.0])).numpy().tolist() == [[3.0, 6.0], [6.0, 12.0]]
    assert traced["ordered"] is False


def test_no_edge_when_the_gradient_feeds_a_stateful_op_made_earlier():
    """TensorFlow runs stateful ops in program order: a gradient whose op
    also feeds an earlier variable update (or collective, as a synchronized
    batch normalization's does) must not wait for a later op."""
    total = tf.Variable(0.0)
    traced = {}

    @tf.function
    def step(x):
        gradient = tf.matmul(tf.reshape(x, [2, 1]), tf.reshape(x, [1, 2]))
        total.assign_add(tf.reduce_sum(gradient))  # stateful, made first
        exchanged = tf.raw_ops.ReadVariableOp(resource=total.handle, dtype=tf.float32)
        traced["ordered"] = graph_order.run_after(gradient, exchanged.op)
        return gradient, exchanged

    gradient, exchanged = step(tf.constant([1.0, 2.0]))
    assert traced["ordered"] is False and float(exchanged) == 9.0


def test_a_running_sum_kept_as_written_is_marked_for_grappler_and_keeps_its_value():
    """The mark that keeps Grappler from collapsing a running sum into one
    AddN (every addend alive at once); eagerly nothing happens."""
    traced = {}

    @tf.function
    def summed(parts):
        total = parts[0]
        for part in tf.unstack(parts)[1:]:
            total = total + part
            graph_order.keep_as_written(total)
        traced["marked"] = total.op.get_attr("_grappler_do_not_remove")
        return total

    np.testing.assert_allclose(summed(tf.ones([4, 3])).numpy(), np.full(3, 4.0))
    assert traced["marked"] is True
    graph_order.keep_as_written(tf.constant(1.0))  # (eager: nothing to mark)
