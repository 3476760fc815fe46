"""Gradient clipping (clipnorm, global_clipnorm, clipvalue) applies to the
batch's gradient, as on one device: the Trainer, a custom loop on
tfdist.replica.gradients, and a model's own step (its ``optimizer.apply``)
after ``tfdist.attach``, against single-device Keras fit."""

import keras
import numpy as np
import pytest

import tfdist
from tests.support import models, reference as ref
from tests.support.program_loader import load_program

EPOCHS, BATCH = 3, 16
# Limits small enough that every step clips (checked below).
CLIPS = [{"global_clipnorm": 0.05}, {"clipnorm": 0.02}, {"clipvalue": 0.005}]


def _compiled(clip):
    model = ref.build_mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9, **clip),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _keras_fit(dataset, clip):
    model = _compiled(clip)
    history = model.fit(dataset, epochs=EPOCHS, verbose=0, shuffle=False).history
    return model, history


@pytest.fixture(scope="module")
def unclipped():
    return _keras_fit(ref.global_batches(66, BATCH), {})[0]


@pytest.mark.parametrize("num_replicas, clip", [(4, CLIPS[0]), (2, CLIPS[1]), (4, CLIPS[2])],
                         ids=["global_clipnorm-4", "clipnorm-2", "clipvalue-4"])
def test_trainer_clips_the_batch_gradient(make_strategy, unclipped, num_replicas, clip):
    dataset = ref.global_batches(66, BATCH)  # last batch of 2: empty replicas at 4
    expected, history = _keras_fit(dataset, clip)
    # The limit matters: clipping changes the result by far more than 1e-5.
    assert max(np.abs(a - b).max() for a, b in zip(expected.get_weights(),
                                                   unclipped.get_weights())) > 1e-2

    strategy = make_strategy(num_replicas)
    with strategy.scope():
        model = _compiled(clip)
    actual = tfdist.Trainer(model, strategy).fit(dataset, epochs=EPOCHS, verbose=0).history

    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(history, actual)


def test_custom_loop_clips_the_batch_gradient(make_strategy):
    custom_loop = load_program("custom_loop")
    dataset = ref.global_batches(70, BATCH)
    expected, history = _keras_fit(dataset, {"global_clipnorm": 0.05})

    strategy = make_strategy(4)
    with strategy.scope():
        model = _compiled({"global_clipnorm": 0.05})
    actual = custom_loop.train(strategy, model, dataset, EPOCHS)

    ref.assert_weights_close(expected, model)
    ref.assert_logs_close({k: history[k] for k in ("loss", "accuracy")}, actual)


@pytest.mark.parametrize("cls, num_replicas, clip", [
    (models.GuideTrainStep, 4, CLIPS[0]), (models.PenaltyLoss, 3, CLIPS[1]),
    (models.GuideApplyGradients, 2, CLIPS[2])], ids=["own_train_step-global_clipnorm-4",
                                            "compute_loss_override-clipnorm-3",
                                            "apply_gradients-clipvalue-2"])
def test_a_models_own_step_clips_the_batch_gradient(make_strategy, cls, num_replicas, clip):
    """keras.io's train_step (``optimizer.apply``), Keras' step around a
    compute_loss override, and ``optimizer.apply_gradients`` (66 rows in
    batches of 16: a last batch of 2, empty replicas on 4)."""
    dataset = ref.global_batches(66, BATCH, weighted=False)

    def compiled():
        model = models.functional_as(cls)
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9, **clip),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    expected = compiled()
    history = expected.fit(dataset, epochs=EPOCHS, verbose=0, shuffle=False).history
    unclipped = models.compiled_model(cls)
    unclipped.fit(dataset, epochs=EPOCHS, verbose=0, shuffle=False)
    assert max(np.abs(a - b).max() for a, b in zip(expected.get_weights(),
                                                   unclipped.get_weights())) > 1e-2

    strategy = make_strategy(num_replicas)
    with strategy.scope():
        model = compiled()
    tfdist.attach(model, strategy)
    actual = model.fit(dataset, epochs=EPOCHS, verbose=0, shuffle=False).history

    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(history, actual)
