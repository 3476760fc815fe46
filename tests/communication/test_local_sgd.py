"""Local SGD (`tfdist.communication.LocalSGD`) against independent references:
Keras fit on one device (every_steps=1), and a plain loop that keeps one
copy of the weights per replica, steps each on its contiguous share of
every global batch and averages them on the same schedule (every H steps
after warm-up, at epoch ends, before saves). Multi-worker and
parameter-server runs: tests/scenarios/test_multi_worker.py, tests/scenarios/test_parameter_server.py."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tests.support.models import GuideTrainStep
from tests.support.mixed_precision import EPOCHS as MIXED_EPOCHS
from tests.support.mixed_precision import (OwnStep, dense_model, features_with_an_overflow,
                                           max_difference, one_device, references,
                                           sequence_model, tokens)
from tfdist.communication import Compression, LocalSGD
from tfdist.errors import ConfigurationError

EXAMPLES, BATCH, EPOCHS = 70, 16, 3  # 5 steps per epoch, a partial last batch
LR, MOMENTUM = 0.1, 0.9


def _model():
    model = ref.build_mlp(l2=0.0)
    model.compile(optimizer=keras.optimizers.SGD(LR, momentum=MOMENTUM),
                  loss="sparse_categorical_crossentropy")
    return model


def _outer():
    return keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)


def _reference(replicas, every, warmup=0, outer=False, save_every=None, epochs=EPOCHS,
               weighted=True):
    """Local SGD by hand: per-replica weights and momentum, SGD as Keras
    writes it (m = 0.9 m - lr g; w += m), weights and momenta averaged when
    tfdist's schedule says. ``weighted``: the batches' sample weights used.
    (A replica's gradient: its rows' summed loss over the global count,
    times the replicas.)"""
    init = _model().get_weights()
    weights = [[tf.Variable(w) for w in init] for _ in range(replicas)]
    momenta = [[tf.Variable(tf.zeros_like(w)) for w in init] for _ in range(replicas)]
    anchor = [w.copy() for w in init]
    outer_momentum = [np.zeros_like(w) for w in init]
    shape_model = _model()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction="sum")
    step, since = 0, 0

    def average():
        nonlocal since
        mean = [np.mean([weights[r][i].numpy() for r in range(replicas)], axis=0)
                for i in range(len(init))]
        if outer and step > warmup:  # DiLoCo: Nesterov SGD on anchor - mean
            for i, m in enumerate(mean):
                gradient = anchor[i] - m
                outer_momentum[i] = 0.9 * outer_momentum[i] - 0.7 * gradient
                anchor[i] = anchor[i] + (-0.7 * gradient + 0.9 * outer_momentum[i])
            mean = [a.copy() for a in anchor]
        elif outer:
            anchor[:] = [m.copy() for m in mean]
        mean_momentum = [np.mean([momenta[r][i].numpy() for r in range(replicas)], axis=0)
                         for i in range(len(init))]
        for r in range(replicas):
            for variable, value in zip(weights[r], mean):
                variable.assign(value)
            for variable, value in zip(momenta[r], mean_momentum):
                variable.assign(value)
        since = 0

    for _ in range(epochs):
        for x, y, w in ref.global_batches(EXAMPLES, BATCH):
            size = int(x.shape[0])
            step += 1
            since += 1
            # Contiguous rows, ceil(size / replicas) each while they last
            # (as tf.distribute splits: 16 rows on 3 replicas are 6, 6, 4).
            chunk = -(-size // replicas)
            for r in range(replicas):
                rows = slice(min(r * chunk, size), min((r + 1) * chunk, size))
                shape_model.set_weights([v.numpy() for v in weights[r]])
                with tf.GradientTape() as tape:
                    loss = loss_fn(y[rows], shape_model(x[rows], training=True),
                                   w[rows] if weighted else None) / size
                gradients = tape.gradient(loss, shape_model.trainable_variables)
                for variable, m, g in zip(weights[r], momenta[r], gradients):
                    m.assign(MOMENTUM * m - LR * replicas * g)
                    variable.assign_add(m)
            if step <= warmup or (step - warmup) % every == 0 or (
                    save_every and step % save_every == 0):
                average()
        if since:
            average()
    return [v.numpy() for v in weights[0]]


@pytest.mark.parametrize("via", ["Trainer", "attach"])
def test_every_step_equals_keras_fit_on_one_device(make_strategy, via):
    expected, _ = ref.keras_fit(ref.global_batches(EXAMPLES, BATCH), EPOCHS, "sgd", l2=0.0)
    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(l2=0.0), "sgd")
    local = LocalSGD(every_steps=1)
    if via == "Trainer":
        tfdist.Trainer(model, strategy, communication=local).fit(
            ref.global_batches(EXAMPLES, BATCH), epochs=EPOCHS, verbose=0)
    else:  # unchanged Keras fit
        tfdist.attach(model, strategy, communication=local)
        model.fit(ref.global_batches(EXAMPLES, BATCH), epochs=EPOCHS, verbose=0)
    assert ref.largest_difference(model.get_weights(), expected.get_weights()) < 1e-5
    assert local.averagings == EPOCHS * 5


class _Replicas(keras.callbacks.Callback):
    """Records, after step 2 and at each epoch's end, whether the replicas'
    copies of the first kernel differ."""

    def __init__(self, strategy):
        super().__init__()
        self._strategy, self.after_step_2, self.epoch_ends = strategy, None, []

    def _differ(self):
        copies = [c.numpy() for c in self._strategy.experimental_local_results(
            self.model.trainable_variables[0].value)]
        return max(float(np.max(np.abs(c - copies[0]))) for c in copies)

    def on_train_batch_end(self, batch, logs=None):
        if self.after_step_2 is None and batch == 1:
            self.after_step_2 = self._differ()

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_ends.append(self._differ())


@pytest.mark.parametrize("replicas,every,warmup,outer", [
    (2, 4, 0, False), (3, 3, 2, False), (2, 3, 0, True)])
def test_local_steps_and_averaging_equal_a_hand_written_local_sgd(
        make_strategy, replicas, every, warmup, outer):
    strategy = make_strategy(replicas)
    with strategy.scope():
        model = _model()
    local = LocalSGD(every_steps=every, warmup_steps=warmup,
                     outer_optimizer=_outer() if outer else None)
    watch = _Replicas(strategy)
    trainer = tfdist.Trainer(model, strategy, communication=local)
    trainer.fit(ref.global_batches(EXAMPLES, BATCH), epochs=EPOCHS, verbose=0,
                callbacks=[watch])
    expected = _reference(replicas, every, warmup, outer)
    assert ref.largest_difference(model.get_weights(), expected) < 1e-5
    assert watch.epoch_ends == [0.0] * EPOCHS  # identical weights at every epoch's end
    if warmup < 2:
        assert watch.after_step_2 > 1e-4  # the replicas stepped on their own batches
    synchronous = _reference(replicas, 1)
    assert ref.largest_difference(expected, synchronous) > 1e-4  # not synchronous training


def test_a_models_own_train_step_steps_locally_and_averages(make_strategy):
    """keras.io's train_step (compute_loss, optimizer.apply) under tfdist.attach
    and local SGD: the hand-written local SGD's weights, not synchronous ones."""
    strategy = make_strategy(2)
    with strategy.scope():
        base = ref.build_mlp(l2=0.0)
        model = GuideTrainStep(base.inputs, base.outputs)
        model.compile(optimizer=keras.optimizers.SGD(LR, momentum=MOMENTUM),
                      loss="sparse_categorical_crossentropy")
    local = LocalSGD(every_steps=2)
    tfdist.attach(model, strategy, communication=local)
    model.fit(ref.global_batches(EXAMPLES, BATCH, weighted=False), epochs=EPOCHS, verbose=0)
    expected = _reference(2, 2, weighted=False)
    assert ref.largest_difference(model.get_weights(), expected) < 1e-5
    assert ref.largest_difference(expected, _reference(2, 1, weighted=False)) > 1e-4
    assert local.averagings == EPOCHS * 3  # steps 2, 4 and the epoch's 5th


def _mixed_precision_local_sgd(build, data, strategy):
    with strategy.scope():
        model = build()
    tfdist.attach(model, strategy, communication=LocalSGD(every_steps=1))
    model.fit(data, epochs=MIXED_EPOCHS, verbose=0)
    return model


def test_mixed_precision_every_step_equals_one_device(make_strategy):
    """mixed_float16 (a LossScaleOptimizer around SGD with momentum), an
    embedding's sparse gradients: every_steps=1 is one device's run within
    float16's tolerance (tests/replica/test_mixed_precision.py); every_steps=3
    really steps locally."""
    expected, tolerance = references("mixed_float16", "sgd")
    strategy = make_strategy(2)
    actual = _mixed_precision_local_sgd(lambda: sequence_model("mixed_float16", "sgd"),
                                        tokens(), strategy)
    assert max_difference(expected, actual) <= tolerance
    # Local steps through the LossScaleOptimizer: the replicas part between averagings.
    with strategy.scope():
        model = sequence_model("mixed_float16", "sgd")
    watch = _Replicas(strategy)
    tfdist.attach(model, strategy, communication=LocalSGD(every_steps=3))
    model.fit(tokens(), epochs=MIXED_EPOCHS, verbose=0, callbacks=[watch])
    assert watch.after_step_2 > 1e-4 and watch.epoch_ends == [0.0] * MIXED_EPOCHS


@pytest.mark.parametrize("cls", [keras.Sequential, OwnStep], ids=["tfdist step", "own step"])
def test_an_overflow_on_one_replica_skips_the_local_step_on_all(make_strategy, cls):
    """One replica's local gradient overflows: every replica skips that step
    and halves the scale, as one device does (the replicas agree)."""
    expected = one_device(lambda: dense_model(cls), features_with_an_overflow())
    actual = _mixed_precision_local_sgd(lambda: dense_model(cls), features_with_an_overflow(),
                                        make_strategy(2))
    scale = float(expected.optimizer.dynamic_scale.numpy())
    assert scale < 32768.0
    assert float(actual.optimizer.dynamic_scale.numpy()) == scale
    assert max_difference(expected, actual) < 2e-4


def test_a_resume_mid_epoch_continues_the_outer_optimizer_exactly(make_strategy, tmp_path):
    """Saves every 2 steps (each after an averaging); stopped after step 7,
    resumed from step 6 on a fresh model and Trainer: the weights of a run
    that was never stopped, including the outer optimizer's momentum."""
    strategy = make_strategy(2)

    class StopAfter7(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if trainer.step == 7:
                raise KeyboardInterrupt

    with strategy.scope():
        model = _model()
    trainer = tfdist.Trainer(model, strategy,
        communication=LocalSGD(every_steps=3, outer_optimizer=_outer()),
        checkpointing=tfdist.CheckpointOptions(str(tmp_path), every_steps=2))
    with pytest.raises(KeyboardInterrupt):
        trainer.fit(ref.global_batches(EXAMPLES, BATCH), epochs=EPOCHS, verbose=0,
                    callbacks=[StopAfter7()])
    with strategy.scope():
        resumed = _model()
    trainer = tfdist.Trainer(resumed, strategy,
        communication=LocalSGD(every_steps=3, outer_optimizer=_outer()),
        checkpointing=tfdist.CheckpointOptions(str(tmp_path), every_steps=2))
    trainer.fit(ref.global_batches(EXAMPLES, BATCH), epochs=EPOCHS, verbose=0)
    assert trainer.step == EPOCHS * 5
    expected = _reference(2, 3, outer=True, save_every=2)
    assert ref.largest_difference(resumed.get_weights(), expected) < 1e-5


def test_bad_local_sgd_arguments_are_clear_errors(make_strategy):
    for arguments, match in [
            (dict(every_steps=0), r"`every_steps` \(0\) must be a positive integer"),
            (dict(every_steps=2.5), r"`every_steps` \(2.5\)"),
            (dict(every_steps=4, warmup_steps=-1), r"`warmup_steps` \(-1\)"),
            (dict(every_steps=4, outer_optimizer="sgd"), r"`outer_optimizer` \('sgd'\) must be a Keras")]:
        with pytest.raises(ConfigurationError, match=match):
            LocalSGD(**arguments)
    strategy = make_strategy(2)
    with strategy.scope():
        model = _model()
    for communication in [(Compression("bf16"), LocalSGD(4)), (LocalSGD(4), Compression("bf16"))]:
        with strategy.scope():
            model = _model()
        with pytest.raises(ConfigurationError, match="no gradient all-reduce is left to compress"):
            tfdist.Trainer(model, strategy, communication=communication)
    with strategy.scope():
        model = ref.build_mlp(l2=0.0)
        model.compile(optimizer=keras.optimizers.SGD(0.1, gradient_accumulation_steps=2),
                      loss="sparse_categorical_crossentropy")
    with pytest.raises(ConfigurationError, match="gradient_accumulation_steps=2"):
        tfdist.Trainer(model, strategy, communication=LocalSGD(4))
    local = LocalSGD(4)
    with strategy.scope():
        first, second = _model(), _model()
    tfdist.Trainer(first, strategy, communication=local)
    with pytest.raises(ConfigurationError, match="already attached"):
        tfdist.Trainer(second, strategy, communication=local)
