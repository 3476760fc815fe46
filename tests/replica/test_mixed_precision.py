"""Mixed precision under tfdist equals one-device Keras (issue 33, point 4).

``mixed_float16`` (Keras wraps the optimizer in a ``LossScaleOptimizer``)
and ``mixed_bfloat16`` (no loss scaling), dense and sparse (embedding)
gradients, tfdist's step and a model's own ``train_step``, on 1 to 4
replicas, against plain Keras ``fit`` on one device, same data and order.

Tolerance. Layers compute in 16 bits, so a replica's gradient is a sum of
its rows' terms rounded to 11 (float16) or 8 (bfloat16) significant bits;
splitting the batch over replicas regroups those sums. That is the same
kind of error as computing in 16 bits at all, and measured it is of the
same size or smaller: on the LSTM below, after 12 steps, tfdist on 3 and 4
replicas is 6e-5..1e-4 (float16, SGD and Adam) and 2.1e-3..2.8e-3
(bfloat16) from one device, where one device in 16 bits is 2.1e-4..6e-4
(float16) and 2.3e-3 (bfloat16) from float32. So each test allows twice
the 16-bit-vs-float32 difference of its own run (4.2e-4, 1.2e-3, 4.5e-3). A
gradient twice too large (summed over 2 replicas instead of averaged, the
classic distribution bug) moves the weights by 6e-2, far outside. On one
replica the results are identical (0.0).
"""

import keras
import numpy as np
import pytest
from tests.support import short_form
from tests.support.mixed_precision import (OwnStep, dense_model, features_with_an_overflow,
                                           max_difference, one_device,
                                           references, sequence_model, tokens, with_tfdist)


# CI: each policy and optimizer on one replica count: 4, 3 and 1 (--full: all).
@pytest.mark.parametrize("policy, optimizer, replicas", short_form.in_turn(
    [("mixed_float16", "sgd"), ("mixed_float16", "adam"), ("mixed_bfloat16", "sgd")], (4, 3, 1)))
def test_embedding_and_lstm_in_mixed_precision_equal_one_device(
        policy, optimizer, replicas, make_strategy):
    """Sparse embedding gradients through a LossScaleOptimizer (a crash in
    the optimizer's condition once: CollectiveGatherV2 on 2 and 3 replicas)."""
    expected, tolerance = references(policy, optimizer)
    actual = with_tfdist(lambda: sequence_model(policy, optimizer), tokens(),
                         make_strategy(replicas))
    assert type(actual.optimizer) is type(expected.optimizer)
    assert max_difference(expected, actual) <= (1e-6 if replicas == 1 else tolerance)


def test_the_tolerance_would_catch_a_wrongly_scaled_gradient():
    """Not vacuous: a gradient twice too large (2 replicas' gradients
    summed instead of averaged, as the learning rate 0.2) ends far outside
    every tolerance above."""
    for (policy, optimizer) in [("mixed_float16", "sgd"), ("mixed_bfloat16", "sgd")]:
        expected, tolerance = references(policy, optimizer)

        def too_fast():
            model = sequence_model(policy, optimizer)
            model.optimizer.learning_rate = 0.2
            return model

        difference = max_difference(expected, one_device(too_fast, tokens()))
        assert difference > 5 * tolerance


@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("cls", [keras.Sequential, OwnStep], ids=["tfdist step", "own step"])
def test_an_overflow_on_one_replica_skips_the_step_on_all_as_one_device_does(
        cls, replicas, make_strategy):
    """One replica's gradient overflows: one device skips the update and
    halves the scale; so must every replica (Keras alone applied the
    infinite gradient: weights inf)."""
    expected = one_device(lambda: dense_model(cls), features_with_an_overflow())
    actual = with_tfdist(lambda: dense_model(cls), features_with_an_overflow(),
                         make_strategy(replicas))
    scale = float(expected.optimizer.dynamic_scale.numpy())
    assert scale < 32768.0  # one device did skip steps (the initial scale is 2**15)
    assert float(actual.optimizer.dynamic_scale.numpy()) == scale
    assert max_difference(expected, actual) < 2e-4  # float16's tolerance above


def test_plain_keras_outside_tfdist_keeps_its_own_check(make_strategy):
    """The agreement is scoped to tfdist's steps: a Keras fit under a
    strategy, outside tfdist, runs Keras' own LossScaleOptimizer.apply
    (which applies the other replica's overflow: weights not finite)."""
    strategy = make_strategy(2)
    with_tfdist(dense_model, features_with_an_overflow(), strategy)  # installs the wrapper
    with strategy.scope():
        model = dense_model()
    model.fit(features_with_an_overflow(), epochs=1, verbose=0)
    assert not all(np.isfinite(w).all() for w in model.get_weights())
