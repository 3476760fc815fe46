"""tfdist.replica.losses in a hand-written loop: global-count scaling, empty replicas."""

import numpy as np
import tensorflow as tf

import tfdist


def _replica_gradients(strategy, x, loss_fn):
    """Sum over replicas of d(loss_fn)/dw for w = 1.0, with x split by rows."""
    with strategy.scope():
        weight = tf.Variable(1.0)
    dataset = tf.data.Dataset.from_tensors(x)
    batch = next(iter(strategy.experimental_distribute_dataset(dataset)))

    @tf.function
    def step(batch):
        def replica_fn(values):
            with tf.GradientTape() as tape:
                loss = loss_fn(values * weight)
            return loss, tape.gradient(loss, weight)

        loss, grad = strategy.run(replica_fn, args=(batch,))
        return (
            strategy.reduce("sum", loss, axis=None),
            strategy.reduce("sum", grad, axis=None),
            strategy.experimental_local_results(loss),
        )

    return step(batch)


def _replica_loss(values, sample_weight=None, global_count=None):
    """`replica_loss` on a batch of ``values`` (one loss element per row):
    the global count all-reduced, or the given ``global_count``."""
    count = None if global_count is None else tf.fill(tf.shape(values), float(global_count))
    batch = tfdist.Batch(values, sample_weight=sample_weight, global_examples=count)
    return tfdist.replica.losses.replica_loss(values, batch)


def test_replica_loss_is_the_global_mean_with_empty_replicas(make_strategy):
    x = np.array([1.0, 2.0], "float32")  # 2 examples over 4 replicas: 2 empty
    loss, grad, per_replica = _replica_gradients(
        make_strategy(4), x, _replica_loss
    )
    np.testing.assert_allclose(loss, x.mean(), rtol=1e-6)
    np.testing.assert_allclose(grad, x.mean(), rtol=1e-6)
    assert not np.isnan([float(v) for v in per_replica]).any()
    assert [float(v) for v in per_replica][2:] == [0.0, 0.0]


def test_compute_average_loss_without_global_batch_size_is_wrong_here(make_strategy):
    """The bug tfdist fixes: local batch x replicas is not the global count."""
    x = np.array([1.0, 2.0, 3.0], "float32")  # replicas get 1, 1, 1, 0
    loss, _, _ = _replica_gradients(
        make_strategy(4), x, lambda v: tf.nn.compute_average_loss(v)
    )
    assert abs(float(loss) - x.mean()) > 0.1
    loss, _, _ = _replica_gradients(make_strategy(4), x, _replica_loss)
    np.testing.assert_allclose(loss, x.mean(), rtol=1e-6)


def test_replica_loss_with_sample_weight_and_given_count(make_strategy):
    def weighted(values):
        return _replica_loss(values, sample_weight=2.0 * tf.ones_like(values), global_count=4.0)

    x = np.array([1.0, 2.0, 3.0, 4.0], "float32")
    loss, _, _ = _replica_gradients(make_strategy(2), x, weighted)
    np.testing.assert_allclose(loss, 2.0 * x.sum() / 4.0, rtol=1e-6)
