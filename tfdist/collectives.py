"""Everything replicas and workers agree on, in one place.

tfdist communicates across replicas for three reasons only, and each has one
function here:

* `all_reduce_sum`: global counts a replica can not read from its batch
  (loss denominators under Keras masks, the example count without a
  carried count column, synchronized batch statistics over real rows),
  and the batch's gradient when the optimizer clips (`tfdist.gradients`);
* `sum_over_replicas` / `any_worker`: host-side agreements, each in its own
  small function: the stop agreement (SIGTERM / Ctrl-C on any worker stops
  every worker at the same step; `tfdist.agreement`, about once a second)
  and choices that decide which collectives run;
* `barrier`: every worker has joined the cluster.

Otherwise gradient sums belong to the optimizer (``apply_gradients``) and metric
totals are reduced by Keras when read; tfdist adds no other collective.
"""

import tensorflow as tf


def all_reduce_sum(value):
    """Sums ``value`` (a tensor or a structure of them) over all replicas.

    Call in replica context (inside ``strategy.run``).
    """
    context = tf.distribute.get_replica_context()
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)


def sum_over_replicas(strategy: tf.distribute.Strategy, values) -> tf.Tensor:
    """The sum over every replica of ``values`` (the same tensor on each of
    a worker's replicas): the same result on every worker.

    Call in cross-replica context, inside a ``tf.function``.
    """
    per_replica = strategy.run(lambda: tf.identity(tf.cast(values, tf.float32)))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


def any_worker(strategy: tf.distribute.Strategy, requested) -> tf.Tensor:
    """True on every worker when any worker passed a true ``requested``.

    Call in cross-replica context, inside a ``tf.function``.
    """
    return sum_over_replicas(strategy, requested) > 0


def barrier(strategy: tf.distribute.Strategy) -> None:
    """Returns once every worker has joined (one tiny all-reduce)."""

    @tf.function
    def all_reduce_one():
        return strategy.reduce(
            tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None
        )

    all_reduce_one()
