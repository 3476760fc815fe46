"""The TPU's static-shape path, run on CPU replicas: padded full-size batches,
XLA-compiled steps and host loops equal single-device Keras ``fit``; its
checkpoints restore on the ordinary path and back."""

import numpy as np
import pytest

import tfdist
from tests.support import reference as ref
from tfdist.errors import ConfigurationError

EPOCHS, BATCH = 3, 16
# 70: last global batch of 6; 66: last batch of 2, so 3 or 4 replicas have
# only padding (replicas with no real example).
PARTIAL, SMALLER_THAN_REPLICAS = 70, 66


def _trainer(strategy, steps_per_execution=1, **kwargs):
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam", steps_per_execution=steps_per_execution)
    return model, tfdist.Trainer(model, strategy, **kwargs)


@pytest.mark.parametrize("num_replicas, num_examples", [
    (1, PARTIAL), (2, SMALLER_THAN_REPLICAS), (4, SMALLER_THAN_REPLICAS),
])
def test_static_shapes_equal_single_device_keras(make_strategy, num_replicas, num_examples):
    dataset = ref.global_batches(num_examples, BATCH)
    expected_model, expected_history = ref.keras_fit(dataset, EPOCHS, "adam")

    model, trainer = _trainer(make_strategy(num_replicas), static_shapes=True,
                              steps_per_execution=3)
    history = trainer.fit(dataset, epochs=EPOCHS, verbose=0).history

    assert trainer.static_shapes
    ref.assert_weights_close(expected_model, model)
    ref.assert_logs_close(expected_history, history)
    ref.assert_logs_close(
        expected_model.evaluate(dataset, verbose=0, return_dict=True),
        trainer.evaluate(dataset),
    )


def test_every_step_sees_the_full_global_batch_shape(make_strategy):
    """What makes the path static: the distributed batches all have one shape."""
    strategy = make_strategy(4)
    dataset = ref.global_batches(SMALLER_THAN_REPLICAS, BATCH)
    shapes, real = set(), []
    for batch in tfdist.data.distribute(strategy, dataset, partial_batch="pad"):
        for replica in strategy.experimental_local_results(batch["x"]):
            shapes.add(tuple(replica.shape))
        real.append(sum(float(m.numpy().sum())
                        for m in strategy.experimental_local_results(batch["mask"])))
    assert shapes == {(BATCH // 4, ref.NUM_FEATURES)}
    assert real == [16.0] * 4 + [2.0]


def test_static_shapes_are_off_by_default_off_tpu(make_strategy):
    _, trainer = _trainer(make_strategy(2))
    assert not trainer.static_shapes


@pytest.mark.parametrize("first, second", [
    ({"static_shapes": True}, {}), ({}, {"static_shapes": True}),
])
def test_checkpoints_cross_between_static_and_dynamic_paths(
        make_strategy, tmp_path, first, second):
    dataset = ref.global_batches(PARTIAL, BATCH)
    expected_model, expected_history = ref.keras_fit(dataset, EPOCHS, "adam")

    _, writer = _trainer(make_strategy(4), checkpointing=tfdist.CheckpointOptions(str(tmp_path)),
                         **first)
    writer.fit(dataset, epochs=2, verbose=0)
    model, reader = _trainer(make_strategy(2), checkpointing=tfdist.CheckpointOptions(str(tmp_path)),
                             **second)
    history = reader.fit(dataset, epochs=EPOCHS, verbose=0).history

    ref.assert_weights_close(expected_model, model)
    ref.assert_logs_close({k: v[2:] for k, v in expected_history.items()}, history)


@pytest.mark.parametrize("options, named", [
    ({"static_shapes": True, "input_pipeline": tfdist.DataOptions(partial_batch="exact")},
     "partial_batch='exact'"),
    ({"static_shapes": "yes"}, "`static_shapes`"),
])
def test_bad_static_shape_options_name_the_fix(make_strategy, options, named):
    with pytest.raises(ConfigurationError, match=named):
        _trainer(make_strategy(2), **options)


def test_predict_on_the_static_path_is_in_order_and_complete(make_strategy):
    dataset = ref.global_batches(SMALLER_THAN_REPLICAS, BATCH)
    expected = ref.compile_model(ref.build_mlp(), "adam")
    _, trainer = _trainer(make_strategy(4), static_shapes=True)

    predicted = trainer.predict(dataset)

    assert predicted.shape == (SMALLER_THAN_REPLICAS, ref.NUM_CLASSES)
    ref.assert_weights_close(expected, trainer.model)  # same initial weights
    np.testing.assert_allclose(predicted, expected.predict(dataset, verbose=0), atol=1e-5)
