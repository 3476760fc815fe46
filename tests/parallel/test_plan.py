"""The one plan a Trainer sees for how a model is split
(`tfdist.parallel.plan.ModelPlan`): its axes, the null plan's whole
batches, the pipeline's plumbing no longer public, and ``task_devices``
at its public name."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tfdist.errors import ConfigurationError
from tfdist.parallel.plan import AXES, ModelPlan, WHOLE


def test_the_axes_are_keras_device_mesh_names_and_a_pipeline_fills_its_own():
    assert AXES == ("data", "pipeline", "model")
    assert WHOLE.axes == {"data": 1, "pipeline": 1, "model": 1}
    assert not WHOLE.cuts_batches
    two_stages = tfdist.parallel.Pipeline(cuts=["h1"], micro_batches=2)
    assert ModelPlan(two_stages).axes == {"data": 1, "pipeline": 2, "model": 1}
    strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    across = tfdist.parallel.Pipeline(cuts=["h1", "h2"], micro_batches=2)
    assert ModelPlan(across, strategy).axes == {"data": 2, "pipeline": 3, "model": 1}
    assert ModelPlan(across, strategy).cuts_batches
    assert ModelPlan(None, strategy).axes == {"data": 2, "pipeline": 1, "model": 1}
    mesh = keras.distribution.DeviceMesh((1, 2, 2), ["batch", "pipeline", "model"],
                                         [f"cpu:{index}" for index in range(4)])
    layout = keras.distribution.ModelParallel(layout_map=keras.distribution.LayoutMap(mesh),
                                              batch_dim_name="batch")
    assert ModelPlan([two_stages, layout]).axes == {"data": 1, "pipeline": 2, "model": 2}


def test_anything_else_as_parallel_is_refused_naming_what_it_takes():
    with pytest.raises(ConfigurationError, match=r"must be a tfdist.parallel.Pipeline, a keras.distribution.ModelParallel, a list of one of each"):
        ModelPlan("1f1b")
    with pytest.raises(ConfigurationError, match=r"must be a tfdist.parallel.Pipeline, a keras.distribution.ModelParallel, a list of one of each"):
        tfdist.attach(ref.compile_model(ref.build_mlp(), "sgd"), parallel=("h1",)).fit(
            *ref.classification_arrays(8)[:2], verbose=0)


def test_the_null_plan_runs_the_batch_whole_and_touches_nothing():
    """Without a split the plan calls the step's whole-batch pass with the
    batch and the count it was given, and nothing else."""
    calls = []

    def whole(batch, global_examples):
        calls.append((batch, global_examples))
        return "result"

    def micro_batch(*args, **kwargs):  # pragma: no cover - must not run
        raise AssertionError("the null plan ran a micro-batch")

    model = ref.compile_model(ref.build_mlp(), "sgd")
    assert WHOLE.forward_backward(model, "batch", None, whole=whole,
                                  micro_batch=micro_batch) == "result"
    assert calls == [("batch", None)]
    assert WHOLE.jit_compile(True) is True
    WHOLE.attach(model, tf.distribute.get_strategy(), communication=None, static_shapes=True)
    WHOLE.when_built(None)  # (nothing waited: no build)


def test_a_pipelines_plumbing_is_no_longer_public_and_says_what_to_use():
    pipeline = tfdist.parallel.Pipeline(cuts=["h1"], micro_batches=2)
    for name in ("attach_to", "forward_backward"):
        with pytest.raises(AttributeError, match=rf"Pipeline.{name} is no longer public: pass "
                                                 r"the pipeline as `parallel=` to tfdist.attach"):
            getattr(pipeline, name)
        assert not hasattr(pipeline, name)
    with pytest.raises(AttributeError, match="'Pipeline' object has no attribute 'other'"):
        getattr(pipeline, "other")


def test_a_pipeline_per_replica_attaches_when_keras_builds_the_model():
    """A model Keras builds on its first batch, under a strategy with 2
    replicas: the plan places each replica's stage copies once tfdist has
    built it, and it trains as one device."""
    x = np.random.default_rng(0).random((12, 3)).astype("float32")
    y = x @ np.ones((3, 2), "float32")

    def build():
        keras.utils.set_random_seed(2)
        model = keras.Sequential([keras.layers.Dense(4, name="h1"), keras.layers.Dense(2)])
        model.compile(optimizer="adam", loss="mse")
        return model

    expected = build()
    expected_history = expected.fit(x, y, batch_size=4, epochs=2, shuffle=False,
                                    verbose=0).history
    strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    with strategy.scope():
        model = build()
    assert not model.built
    tfdist.attach(model, strategy, parallel=tfdist.parallel.Pipeline(cuts=["h1"],
                                                                     micro_batches=2))
    history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0).history
    ref.assert_weight_lists_close(expected.get_weights(), model.get_weights())
    ref.assert_logs_close(expected_history, history)
    last = model.layers[-1].kernel.value.values
    assert [c.device[-5:] for c in last] == ["CPU:2", "CPU:3"]


def test_task_devices_is_exported_where_the_guide_calls_it():
    from tfdist.parallel import cluster_stages  # pylint: disable=import-outside-toplevel

    assert tfdist.parallel.task_devices is cluster_stages.task_devices
    assert "task_devices" in tfdist.parallel.__all__


def test_a_pipeline_trains_through_the_plan_as_one_device():
    """The replica step's one path through the plan: a two-stage pipeline
    equals one device (weights and History)."""
    x, y, _ = ref.classification_arrays(24)

    def fit(model):
        history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
        return model.get_weights(), history

    keras.utils.set_random_seed(3)
    expected = fit(ref.compile_model(ref.build_mlp(), "adam"))
    keras.utils.set_random_seed(3)
    model = ref.compile_model(ref.build_mlp(), "adam")
    pipeline = tfdist.parallel.Pipeline(cuts=[model.layers[0].name], micro_batches=3)
    actual = fit(tfdist.attach(model, parallel=pipeline))
    ref.assert_weight_lists_close(expected[0], actual[0])
    ref.assert_logs_close(expected[1], actual[1])
    assert np.isfinite(actual[1]["loss"]).all()
