"""A custom loop on tfdist's layer (strategies/custom_loop.py) equals
single-device Keras ``fit``: weights, per-epoch loss and accuracy, with
partial and empty-replica batches; the README shows that loop verbatim."""

import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests import reference as ref
from tests.program_loader import load_program

REPO = pathlib.Path(__file__).resolve().parents[1]
custom_loop = load_program("custom_loop")
EPOCHS, BATCH = 3, 16


@pytest.mark.parametrize("num_examples", [70, 66])  # partial; 2 left -> empty replicas
@pytest.mark.parametrize("num_replicas", [1, 2, 4])
def test_custom_loop_equals_single_device_keras(make_strategy, num_replicas, num_examples):
    dataset = ref.global_batches(num_examples, BATCH)
    expected_model, expected_history = ref.keras_fit(dataset, EPOCHS, "adam")

    strategy = make_strategy(num_replicas)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    history = custom_loop.train(strategy, model, dataset, EPOCHS)

    ref.assert_weights_close(expected_model, model)
    ref.assert_logs_close({k: expected_history[k] for k in ("loss", "accuracy")}, history)


def test_readme_shows_the_programs_loop():
    source = (REPO / "strategies" / "custom_loop.py").read_text()
    loop = re.search(r"# \[custom-loop\]\n(.*?)# \[/custom-loop\]", source, re.S).group(1)
    assert loop.strip() in (REPO / "README.md").read_text()


def test_replica_loss_rejects_an_averaged_loss(make_strategy):
    batch = tfdist.Batch(x=tf.ones([2, 1]), y=tf.ones([2]))
    with pytest.raises(tfdist.ConfigurationError,
                       match=r"`per_example_loss` is a scalar.*reduction=None"):
        tfdist.losses.replica_loss(tf.constant(0.5), batch)


def test_replica_loss_ignores_padded_rows_and_uses_the_carried_count():
    batch = tfdist.Batch(
        x=tf.zeros([4, 1]), y=tf.zeros([4]), sample_weight=tf.constant([1.0, 2.0, 5.0, 5.0]),
        mask=tf.constant([1.0, 1.0, 0.0, 0.0]), global_examples=tf.fill([4], 3.0),
    )
    loss = tfdist.losses.replica_loss(tf.constant([1.0, 1.0, np.nan, 7.0]), batch)
    np.testing.assert_allclose(float(loss), (1.0 + 2.0) / 3.0, rtol=1e-6)
