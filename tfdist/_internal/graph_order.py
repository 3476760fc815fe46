"""Holding back a gradient until an earlier exchange has run, in a traced step.

In a ``tf.function`` the backward pass is a set of ops TensorFlow runs as
soon as their inputs are ready, so every weight's gradient is made within a
few milliseconds, long before the first one has crossed the network: all of
them are alive at once. `run_after` makes the op that produces one
gradient's elements wait for another op (the previous weight's
reduce-scatter), so a gradient is made only when the exchange is ready to
take it. This is what lets sharded optimizer state hold about one weight's
gradient at a time (ZeRO stage 2; `tfdist.communication.sharding`).

The ordering never changes a value, only when an op runs. It is added only
when it cannot close a cycle: a gradient that the other op itself depends
on (a global-norm clip) is left as it is, and so is one whose op also feeds
a stateful op made earlier (a synchronized batch normalization's gradient
feeds the all-reduce of the layer below, and TensorFlow runs stateful ops
in program order), a gradient made outside the ``tf.cond`` branch it is
used in (mixed precision's finite check, gradient accumulation), sparse
gradients, and eager execution.

TensorFlow has no public way to add an ordering edge to an op that already
exists; ``Operation._add_control_input`` is what its own automatic control
dependencies use (`tests/_internal/test_graph_order.py` pins it).

>>> import tensorflow as tf
>>> traced = {}
>>> @tf.function
... def step(x):
...     first = tf.reduce_sum(x)
...     outer = tf.matmul(tf.reshape(x, [2, 1]), tf.reshape(x, [1, 2]))
...     traced["ordered"] = run_after(outer, first.op)
...     traced["waits for"] = [op.type for op in outer.op.control_inputs]
...     cycle = tf.reduce_sum(outer)  # depends on the matmul: no edge the other way
...     traced["cycle ordered"] = run_after(outer, cycle.op)
...     return outer + cycle
>>> step(tf.constant([1.0, 2.0])).numpy().tolist()
[[10.0, 11.0], [11.0, 13.0]]
>>> traced
{'ordered': True, 'waits for': ['Sum'], 'cycle ordered': False}
"""

import weakref
from typing import Set

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

# Per graph, the ops given an ordering edge (an edge against creation order).
_REORDERED: "weakref.WeakKeyDictionary[object, Set[int]]" = weakref.WeakKeyDictionary()


def run_after(tensor, op, *, exact: bool = False) -> bool:
    """Makes the op that produces ``tensor``'s elements run after ``op``
    (both in one traced graph); returns whether it did (module doc).
    ``exact``: ``tensor``'s own op (an identity made to be ordered: a
    pipeline stage's start, `tfdist.parallel.stage_units`), not the op
    that made the elements it passes on."""
    if tf.executing_eagerly() or isinstance(tensor, tf.IndexedSlices) or op is None:
        return False
    maker = tensor.op if exact else _maker(tensor)
    if (maker is None or maker.graph is not op.graph or _depends_on(op, maker)
            or _feeds_a_stateful_op(maker)):
        return False
    maker._add_control_input(op)  # pylint: disable=protected-access
    _REORDERED.setdefault(maker.graph, set()).add(id(maker))
    return True


def _maker(tensor):
    """The op that makes ``tensor``'s elements: back from the tensor's own
    op through ops that pass one input of the same size on (a cast, a
    scale, an identity) to the op whose inputs are all of other sizes (the
    ``MatMul`` of a kernel's gradient). None when the elements come from
    outside the computation: a variable's value, or an input of the graph
    (a gradient made outside a ``tf.cond`` branch and used inside it)."""
    op, size = tensor.op, tensor.shape.num_elements()
    while True:
        if op.type in ("ReadVariableOp", "Placeholder") or not op.inputs:
            return None
        same = [t for t in op.inputs
                if t.dtype != tf.resource and t.shape.num_elements() == size]
        if len(same) != 1:
            return op
        op = same[0].op


def _feeds_a_stateful_op(maker) -> bool:
    """Whether an existing stateful op (a collective, a variable update)
    uses ``maker``'s outputs, directly or not.

    When the function is finished, TensorFlow orders its stateful ops in
    program order (automatic control dependencies). Such an op was made
    before the op ``maker`` would wait for, so it will run before it: an
    edge would close a cycle (a batch-normalization gradient whose input
    gradient crosses a synchronized all-reduce below it)."""
    seen, stack = {id(maker)}, [maker]
    while stack:
        current = stack.pop()
        if current is not maker and (current._is_stateful  # pylint: disable=protected-access
                                     or any(t.dtype == tf.resource for t in current.inputs)):
            return True
        consumers = [c for t in current.outputs for c in t.consumers()]
        consumers += list(current._control_outputs)  # pylint: disable=protected-access
        for consumer in consumers:
            if id(consumer) not in seen:
                seen.add(id(consumer))
                stack.append(consumer)
    return False


def depends_on(op, target) -> bool:
    """Whether op ``op`` already runs after op ``target`` (a dataflow path or
    a control edge, `run_after`'s included), in one traced graph."""
    return op.graph is target.graph and _depends_on(op, target)


def _depends_on(op, target) -> bool:
    """Whether ``op`` depends on ``target``, directly or not.

    Ops are created after their inputs, so the search skips ops created
    before ``target``; an op given an ordering edge by `run_after` is the
    exception (its new input was created after it) and is searched through.
    """
    reordered = _REORDERED.get(op.graph, set())
    floor = target._id  # pylint: disable=protected-access  (the op's creation number)
    seen, stack = {id(op)}, [op]
    while stack:
        current = stack.pop()
        if current is target:
            return True
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if id(parent) in seen:
                continue
            if parent._id < floor and id(parent) not in reordered:  # pylint: disable=protected-access
                continue
            seen.add(id(parent))
            stack.append(parent)
    return False


def keep_as_written(tensor) -> None:
    """Marks the op that makes ``tensor`` (in a traced function) so that
    Grappler leaves it as written (``_grappler_do_not_remove``, which puts
    it among the nodes every optimizer preserves). A running sum
    ``((g0 + g1) + g2) + ...`` frees each addend once it is added;
    Grappler's arithmetic optimizer would otherwise collapse the chain
    into one ``AddN``, which keeps every addend alive until the last
    exists. Eagerly (no graph) it does nothing."""
    if tf.executing_eagerly() or not hasattr(tensor, "op"):
        return
    tensor.op._set_attr(  # pylint: disable=protected-access
        "_grappler_do_not_remove", attr_value_pb2.AttrValue(b=True))
