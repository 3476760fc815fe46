"""Shuffled datasets: tfdist trains on the orders one-device Keras ``fit``
trains on (issue 33, point 3).

A ``shuffle(n, seed=s)`` dataset draws a new order for every iterator made
of it, so the weights after a few epochs depend on exactly which iterators
were made. Every test here runs plain Keras ``fit`` on one device as the
reference and `tfdist.attach` on 1 to 4 replicas, each on a freshly built
dataset with the same seed, and compares the weights to 1e-5.
"""

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref

EXAMPLES, BATCH, EPOCHS = 96, 16, 3


def shuffled(unknown_cardinality: bool = False, repeat: bool = False):
    dataset = ref.shuffled_batches(EXAMPLES, BATCH)
    if unknown_cardinality:  # tf.data cannot tell how many examples pass a filter
        dataset = dataset.unbatch().filter(lambda features, label: True).batch(BATCH)
    return dataset.repeat() if repeat else dataset


def compiled(strategy=None):
    def build():
        return ref.compile_model(ref.build_mlp(), "sgd")

    if strategy is None:
        return build()
    with strategy.scope():
        return build()


def keras_reference(fits):
    """One-device Keras: ``fits`` is a list of ``fit`` keyword arguments,
    run one after the other on one dataset object."""
    model = compiled()
    dataset = fits[0].pop("dataset")
    for kwargs in fits:
        model.fit(dataset, verbose=0, shuffle=False, **kwargs)
    return model


def tfdist_run(strategy, fits):
    model = compiled(strategy)
    tfdist.attach(model, strategy)
    dataset = fits[0].pop("dataset")
    for kwargs in fits:
        model.fit(dataset, verbose=0, **kwargs)
    return model


CASES = {
    "known cardinality": lambda: [dict(dataset=shuffled(), epochs=EPOCHS)],
    "unknown cardinality": lambda: [dict(dataset=shuffled(unknown_cardinality=True),
                                         epochs=EPOCHS)],
    "repeat with steps_per_epoch": lambda: [dict(dataset=shuffled(repeat=True), epochs=EPOCHS,
                                                 steps_per_epoch=4)],
    "two fit calls": lambda: [dict(dataset=shuffled(), epochs=2), dict(epochs=1)],
    "initial_epoch": lambda: [dict(dataset=shuffled(), epochs=4, initial_epoch=2)],
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("replicas", [1, 3])
def test_shuffled_dataset_trains_on_keras_orders(case, replicas, make_strategy):
    expected = keras_reference(CASES[case]())
    actual = tfdist_run(make_strategy(replicas), CASES[case]())
    ref.assert_weights_close(expected, actual)


@pytest.mark.parametrize("replicas", [2, 4])
def test_shuffled_dataset_on_more_replicas(replicas, make_strategy):
    expected = keras_reference(CASES["known cardinality"]())
    actual = tfdist_run(make_strategy(replicas), CASES["known cardinality"]())
    ref.assert_weights_close(expected, actual)


def test_the_reference_sees_a_new_order_each_epoch():
    """The cases above are not vacuous: an unshuffled run ends elsewhere."""
    x, y, _ = ref.classification_arrays(EXAMPLES)
    plain = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    unshuffled = keras_reference([dict(dataset=plain, epochs=EPOCHS)])
    shuffled_run = keras_reference(CASES["known cardinality"]())
    difference = max(float(np.max(np.abs(a - b))) for a, b in
                     zip(unshuffled.get_weights(), shuffled_run.get_weights()))
    assert difference > 1e-3


@pytest.mark.parametrize("crash_step", [12, 8], ids=["at an epoch's end", "mid-epoch"])
def test_resumed_run_on_a_new_dataset_object_sees_the_uninterrupted_orders(
        crash_step, make_strategy, tmp_path):
    """A restarted job builds its dataset anew (a fresh shuffle seed
    generator); tfdist draws the orders the finished epochs drew, so the
    resumed run ends where one uninterrupted Keras run does."""
    expected = keras_reference(CASES["known cardinality"]())

    first_strategy = make_strategy(2)
    first = tfdist.Trainer(compiled(first_strategy), first_strategy,
        checkpointing=tfdist.CheckpointOptions(str(tmp_path), every_steps=4))
    with pytest.raises(KeyboardInterrupt):  # 6 batches an epoch: crash in epoch 2
        first.fit(shuffled(), epochs=EPOCHS, verbose=0, callbacks=[ref.CrashAtStep(crash_step)])
    strategy = make_strategy(3)
    model = compiled(strategy)
    tfdist.Trainer(model, strategy, checkpointing=tfdist.CheckpointOptions(str(tmp_path))).fit(
        shuffled(), epochs=EPOCHS, verbose=0)
    ref.assert_weights_close(expected, model)
