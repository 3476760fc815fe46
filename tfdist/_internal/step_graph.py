"""The graph a replica's step is traced in, seen from inside the control
flow the step itself builds.

A layer may read a weight inside a loop or a branch it builds while the
step is traced: a Keras RNN runs its cell in a ``tf.while_loop``, whose
body is a graph of its own. A collective placed there runs once per
iteration, and its gradient is built inside the loop's gradient, where
TensorFlow cannot carry a collective's ordering token. What must run once
per step (fully sharded weights' gather, `tfdist.communication.fully_sharded`)
goes in the step's graph instead, and the loop captures its result.

The step's graph is the one ``strategy.run`` was called in: MirroredStrategy
(and MultiWorkerMirroredStrategy) trace each replica on a thread of its own
that keeps that graph as its ``graph`` attribute. A loop around the step
(``steps_per_execution``) is outside it, so a weight read in step 2 is
gathered again, after step 1's update.
"""

import threading

import tensorflow as tf


def of_this_replica() -> tf.Graph:
    """The graph the running replica's step is traced in, if the current
    graph is inside it (a loop or branch the step built); else the current
    graph."""
    current = tf.compat.v1.get_default_graph()
    step = getattr(threading.current_thread(), "graph", None)
    graph = current
    while graph is not None:
        if graph is step:
            return step
        graph = getattr(graph, "outer_graph", None)
    return current
