"""Everything replicas and workers agree on, in one place.

tfdist communicates across replicas for three reasons only, and each has one
function here:

* `all_reduce_sum`: global counts a replica can not read from its batch
  (loss denominators under Keras masks, the example count without a
  carried count column, synchronized batch statistics over real rows),
  and the batch's gradient when the optimizer clips (`tfdist.gradients`);
* `any_worker`: the stop agreement (SIGTERM / Ctrl-C on any worker stops
  every worker at the same step), folded into the training function so it
  costs no host call of its own;
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


def any_worker(strategy: tf.distribute.Strategy, requested) -> tf.Tensor:
    """True on every worker when any worker passed a true ``requested``.

    Call in cross-replica context, inside a ``tf.function``.
    """
    per_replica = strategy.run(lambda: tf.identity(tf.cast(requested, tf.float32)))
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
    return total > 0


def barrier(strategy: tf.distribute.Strategy) -> None:
    """Returns once every worker has joined (one tiny all-reduce)."""

    @tf.function
    def all_reduce_one():
        return strategy.reduce(
            tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None
        )

    all_reduce_one()
