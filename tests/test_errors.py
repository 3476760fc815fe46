"""Bad input gets a clear error naming the problem and the fix."""

import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref


def _compiled_in(strategy):
    with strategy.scope():
        return ref.compile_model(ref.build_mlp(), "adam")


def test_unknown_strategy_lists_known_names():
    with pytest.raises(ValueError, match="Known strategies: mirrored, multi_worker_mirrored, one_device"):
        tfdist.make_strategy("mirrorred")


def test_bad_communication_option():
    with pytest.raises(tfdist.errors.ConfigurationError, match="`communication` \\('carrier-pigeon'\\)"):
        tfdist.make_strategy("mirrored", num_replicas=2, communication="carrier-pigeon")


def test_more_replicas_than_devices_after_runtime_started():
    # conftest made 4 logical CPUs; this starts the runtime if nothing has.
    tf.constant(0.0)
    with pytest.raises(tfdist.errors.RuntimeAlreadyStartedError, match="after tfdist.make_strategy"):
        tfdist.make_strategy("mirrored", num_replicas=8)


def test_make_strategy_after_tensorflow_started_in_a_fresh_process():
    program = textwrap.dedent("""
        import tensorflow as tf, tfdist
        tf.constant(1.0)  # starts the runtime with 1 CPU device
        try:
            tfdist.make_strategy("mirrored", num_replicas=2)
        except tfdist.errors.RuntimeAlreadyStartedError as error:
            print("ERROR:", error)
    """)
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert "ERROR: `num_replicas=2` needs 2 logical CPU devices" in result.stdout, result.stderr


def test_model_built_outside_strategy_scope(make_strategy):
    model = ref.compile_model(ref.build_mlp(), "adam")
    with pytest.raises(tfdist.errors.ConfigurationError, match="created outside strategy.scope"):
        tfdist.Trainer(model, make_strategy(2))


def test_model_not_compiled(make_strategy):
    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.build_mlp()
    with pytest.raises(tfdist.errors.ConfigurationError, match="is not compiled"):
        tfdist.Trainer(model, strategy)


@pytest.mark.parametrize("value", [0, -1])
def test_steps_per_execution_must_be_positive(make_strategy, value):
    strategy = make_strategy(2)
    model = _compiled_in(strategy)
    model.steps_per_execution = value  # as model.compile(steps_per_execution=value) sets it
    with pytest.raises(tfdist.errors.ConfigurationError,
                       match=f"model.compile: `steps_per_execution` \\({value}\\)"):
        tfdist.Trainer(model, strategy)


def test_dataset_without_batch_dimension(make_strategy):
    strategy = make_strategy(2)
    x, y, _ = ref.classification_arrays(8)
    unbatched = tf.data.Dataset.from_tensor_slices((x, y))
    trainer = tfdist.Trainer(_compiled_in(strategy), strategy)
    with pytest.raises(tfdist.errors.ConfigurationError, match="no batch dimension.*ds.batch"):
        trainer.fit(unbatched, verbose=0)


def test_dataset_elements_not_x_y_tuples(make_strategy):
    strategy = make_strategy(2)
    x, y, _ = ref.classification_arrays(8)
    as_dict = tf.data.Dataset.from_tensor_slices({"x": x, "y": y}).batch(4)
    trainer = tfdist.Trainer(_compiled_in(strategy), strategy)
    with pytest.raises(tfdist.errors.ConfigurationError, match=r"tuples \(x, y\) or \(x, y, sample_weight\)"):
        trainer.fit(as_dict, verbose=0)


@pytest.mark.parametrize("bad", ["4-tuple", "unbatched"])
def test_validation_data_of_the_wrong_form(make_strategy, bad):
    strategy = make_strategy(2)
    x, y, w = ref.classification_arrays(8)
    validation = (x, y, w, w) if bad == "4-tuple" else tf.data.Dataset.from_tensor_slices((x, y))
    trainer = tfdist.Trainer(_compiled_in(strategy), strategy)
    with pytest.raises(tfdist.errors.ConfigurationError, match=r"The validation_data.s y component .* no batch dimension|`validation_data` must be \(x, y\) or \(x, y, sample_weight\); got a tuple of 4"):
        trainer.fit(ref.global_batches(8, 4), validation_data=validation, verbose=0)


def test_pad_needs_batch_divisible_by_replicas(make_strategy):
    strategy = make_strategy(3)
    trainer = tfdist.Trainer(_compiled_in(strategy), strategy,
        input_pipeline=tfdist.DataOptions(partial_batch="pad"))
    with pytest.raises(tfdist.errors.ConfigurationError, match="divisible by the 3 replicas; got 16"):
        trainer.fit(ref.global_batches(40, 16), verbose=0)


def test_unknown_partial_batch_policy(make_strategy):
    strategy = make_strategy(2)
    with pytest.raises(tfdist.errors.ConfigurationError, match="`partial_batch` \\('trim'\\)"):
        tfdist.Trainer(_compiled_in(strategy), strategy,
            input_pipeline=tfdist.DataOptions(partial_batch="trim"))


def test_jit_compile_rejects_masked_losses(make_strategy):
    strategy = make_strategy(2)
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((4,), dtype="int32"),
            keras.layers.Embedding(10, 3, mask_zero=True),
            keras.layers.Dense(2, activation="softmax"),
        ])
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", jit_compile=True)
    tokens = np.array([[1, 2, 0, 0]] * 8, "int32")
    data = tf.data.Dataset.from_tensor_slices((tokens, np.ones((8, 4), "int64"))).batch(4)
    trainer = tfdist.Trainer(model, strategy,
        input_pipeline=tfdist.DataOptions(partial_batch="pad"))
    with pytest.raises(Exception, match="jit_compile=True supports losses without Keras masks"):
        trainer.fit(data, verbose=0)


def test_sample_weight_that_does_not_fit_the_loss_names_it():
    per_example = tf.ones([4])
    weights = tf.ones([4, 2, 2])  # one value per example expected
    with pytest.raises(tfdist.errors.ConfigurationError,
                       match=r"`sample_weight` has shape \(4, 2, 2\).*shape \[batch\]"):
        tfdist.replica.losses.replica_loss(
            per_example, tfdist.Batch(per_example, sample_weight=weights,
                                      global_examples=tf.fill([4], 4.0)))


def test_data_of_an_unknown_kind_names_the_argument_and_the_fix(make_strategy):
    strategy = make_strategy(2)
    trainer = tfdist.Trainer(_compiled_in(strategy), strategy)
    x, y, _ = ref.classification_arrays(8)
    with pytest.raises(tfdist.errors.ConfigurationError,
                       match=r"`y` is None.*`x` is a tuple of 2: call fit\(x, y\), not fit\(\(x, y\)\)"):
        trainer.fit((x, y), verbose=0)
    with pytest.raises(tfdist.errors.ConfigurationError,
                       match=r"`x` is a set; tfdist takes NumPy arrays .* or a dataset_fn"):
        trainer.fit({1, 2}, verbose=0)


def test_dataset_fn_that_returns_no_dataset(make_strategy):
    strategy = make_strategy(2)
    trainer = tfdist.Trainer(_compiled_in(strategy), strategy)
    with pytest.raises(tfdist.errors.ConfigurationError,
                       match=r"dataset_fn\(input_context\) returned list; it must return a tf.data.Dataset"):
        trainer.fit(lambda context: [1, 2, 3], verbose=0)


def test_epoch_dataset_that_returns_no_dataset(make_strategy):
    strategy = make_strategy(2)
    trainer = tfdist.Trainer(_compiled_in(strategy), strategy)
    with pytest.raises(tfdist.errors.ConfigurationError,
                       match=r"EpochDataset.make_dataset\(0\) returned NoneType"):
        trainer.fit(tfdist.data.EpochDataset(lambda epoch: None), verbose=0)


def test_parameter_server_evaluation_of_a_dataset_fn_names_the_fix():
    from tfdist.data import epochs
    from tfdist.loops.runners import CoordinatorRunner

    source = epochs.as_source(lambda context: None, "validation_data")
    # The check comes before the runner touches its coordinator.
    with pytest.raises(tfdist.errors.ConfigurationError,
                       match="the validation_data is a dataset_fn. Pass the evaluation data as global batches"):
        CoordinatorRunner.evaluate(object(), source, steps=None, partial_batch="exact")


def test_every_error_class_lives_in_tfdist_errors():
    import importlib
    import inspect
    import pkgutil

    defined_elsewhere = []
    for info in pkgutil.walk_packages(tfdist.__path__, "tfdist."):
        if info.name.startswith(("tfdist.integrations", "tfdist.__main__", "tfdist.launch.__main__")):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, Exception)
                    and value.__module__ == info.name and info.name != "tfdist.errors"):
                defined_elsewhere.append(f"{info.name}.{name}")
    assert not defined_elsewhere, defined_elsewhere
    assert tfdist.errors.SparkTrainingError.__module__ == "tfdist.errors"


def test_a_misspelt_option_is_pythons_error_naming_it(make_strategy):
    strategy = make_strategy(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(TypeError, match="unexpected keyword argument 'checkpionting'"):
        tfdist.attach(model, strategy, checkpionting=None)


@pytest.mark.parametrize("options,message", [
    ({"steps_per_execution": 2}, r"`steps_per_execution=` is now "
                                 r"`model\.compile\(steps_per_execution=\.\.\.\)`"),
    ({"partial_batch": "trim"},
     r"`partial_batch=` is now `input_pipeline=tfdist\.DataOptions\(partial_batch=\.\.\.\)`"),
    ({"data": tfdist.DataOptions()}, r"`data=` is now `input_pipeline=tfdist\.DataOptions"),
    ({"input_pipeline": "pad"},
     r"`input_pipeline` must be a tfdist\.DataOptions \(or None\); got str 'pad'"),
])
def test_attach_checks_its_trainer_options_when_called(make_strategy, options, message):
    """Before any fit: a misspelt or bad option is an error at ``attach``."""
    strategy = make_strategy(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(tfdist.errors.ConfigurationError, match=message):
        tfdist.attach(model, strategy, **options)
