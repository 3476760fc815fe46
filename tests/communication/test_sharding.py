"""What `tfdist.communication.ShardedOptimizerState` refuses, each with an
error naming the option and the fix (its exactness against one device is
in `tests/conformance/test_sharded_state.py`)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tfdist.communication import Compression, LocalSGD, ShardedOptimizerState
from tfdist.errors import ConfigurationError


def _model(strategy, optimizer):
    with strategy.scope():
        model = ref.build_mlp(l2=0.0)
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return model


@pytest.fixture(name="strategy")
def _strategy():
    return tfdist.make_strategy("mirrored", num_replicas=2)


@pytest.mark.parametrize("make,name", [(lambda: keras.optimizers.Lamb(), "Lamb"),
                                       (lambda: keras.optimizers.Adafactor(), "Adafactor"),
                                       (lambda: keras.optimizers.Nadam(), "Nadam")])
def test_an_optimizer_that_looks_across_elements_is_refused(strategy, make, name):
    model = _model(strategy, make())
    with pytest.raises(ConfigurationError, match=f"{name} is not one of them"):
        tfdist.Trainer(model, strategy, communication=ShardedOptimizerState())


class MyAdam(keras.optimizers.Adam):
    """A user's Adam with other defaults: its update is Adam's own."""

    def __init__(self, learning_rate=0.02, beta_2=0.99, **kwargs):
        super().__init__(learning_rate=learning_rate, beta_2=beta_2, **kwargs)


class AdamWithItsOwnStep(keras.optimizers.Adam):
    """An Adam subclass whose update is its own (it may look across elements)."""

    def update_step(self, gradient, variable, learning_rate):
        super().update_step(gradient, variable, learning_rate)


def test_a_subclass_with_its_own_update_step_is_refused_naming_it(strategy):
    model = _model(strategy, AdamWithItsOwnStep())
    with pytest.raises(ConfigurationError,
                       match="AdamWithItsOwnStep subclasses Adam but overrides update_step"):
        tfdist.Trainer(model, strategy, communication=ShardedOptimizerState())


def test_a_subclass_keeping_adams_update_equals_one_device_adam():
    """``class MyAdam(keras.optimizers.Adam)`` (its defaults changed only) is
    accepted by capability, not by name, and trains as one device's plain
    Adam with the same settings, on 3 replicas (the last batch uneven)."""
    expected, model = _sharded_on_3_replicas_and_one_device(
        lambda: keras.optimizers.Adam(0.02, beta_2=0.99), MyAdam)
    sliced = sorted(int(np.prod(v.shape)) for v in model.optimizer.variables if v.shape != ())
    thirds = [-(-int(np.prod(w.shape)) // 3) for w in model.trainable_variables]
    assert sliced == sorted(thirds * 2)  # (sharded: a third of each slot per replica)


def test_moving_averages_are_refused(strategy):
    model = _model(strategy, keras.optimizers.Adam(use_ema=True))
    with pytest.raises(ConfigurationError, match="use_ema=True"):
        tfdist.Trainer(model, strategy, communication=ShardedOptimizerState())


def test_gradient_accumulation_equals_one_device_on_the_union_batches(tmp_path):
    """``gradient_accumulation_steps=3`` with sharded state on 3 replicas,
    micro-batches of 8 (the epoch's last union 8 + 5 rows): one device's fit
    on batches of 24; saved, the state is an unsharded optimizer's."""
    x, y, _ = ref.classification_arrays(37)
    expected = ref.compile_model(ref.build_mlp(), "adam")
    initial = expected.get_weights()
    expected.fit(x, y, batch_size=24, epochs=3, shuffle=False, verbose=0)
    strategy = tfdist.make_strategy("mirrored", num_replicas=3)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
        model.optimizer.gradient_accumulation_steps = 3
    model.set_weights(initial)
    tfdist.attach(model, strategy, communication=ShardedOptimizerState())
    model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    ref.assert_weights_close(expected, model, atol=1e-5)
    plain = ref.compile_model(ref.build_mlp(), "adam")
    plain.optimizer.gradient_accumulation_steps = 3
    plain.optimizer.build(plain.trainable_variables)
    shapes = [{key: value.shape for key, value in _optimizer_saves(m, tmp_path / tag).items()}
              for m, tag in ((model, "sharded"), (plain, "plain"))]
    assert shapes[0] == shapes[1]


def test_local_sgd_is_refused(strategy):
    model = _model(strategy, "adam")
    with pytest.raises(ConfigurationError, match="local SGD keeps each replica's own weights"):
        tfdist.Trainer(model, strategy, communication=(ShardedOptimizerState(), LocalSGD(4)))


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_with_compression_the_update_uses_the_16_bit_gradient_sum(strategy, dtype):
    """Sharded state with ``Compression``: each replica's gradient crosses
    in 16 bits and each slice is updated from that sum, as in
    tests/communication/test_compression.py's one-device loop of 16-bit
    shares (and not as the uncompressed run)."""
    from tests.communication import test_compression as compression  # pylint: disable=import-outside-toplevel

    dataset = ref.global_batches(64, 16)
    with strategy.scope():
        model = compression._model()  # pylint: disable=protected-access
    tfdist.Trainer(model, strategy, communication=(ShardedOptimizerState(), Compression(dtype))
                   ).fit(dataset, epochs=2, verbose=0)
    expected = compression._one_device(dataset, 2, dtype)  # pylint: disable=protected-access
    uncompressed = compression._one_device(dataset, 2)  # pylint: disable=protected-access
    assert ref.largest_difference(expected, uncompressed) > 1e-5
    assert ref.largest_difference(model.get_weights(), expected) < 1e-5


def test_an_optimizer_already_built_is_refused(strategy):
    model = _model(strategy, "adam")
    with strategy.scope():
        model.optimizer.build(model.trainable_variables)
    with pytest.raises(ConfigurationError, match="before the optimizer is built"):
        tfdist.Trainer(model, strategy, communication=ShardedOptimizerState())


def test_one_replica_keeps_keras_own_update():
    strategy = tfdist.make_strategy("one_device")
    model = tfdist.attach(_model(strategy, "adam"), strategy,
                          communication=ShardedOptimizerState())
    x, y, _ = ref.classification_arrays(32)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    sizes = sorted(int(np.prod(v.shape)) for v in model.optimizer.variables if v.shape != ())
    assert sizes == sorted(2 * [int(np.prod(v.shape)) for v in model.trainable_variables])


def test_between_steps_the_slices_being_updated_hold_no_elements(strategy):
    """What a replica keeps between steps is the state of its slices: the
    variables a weight's slice is updated in are emptied after each update
    (as FSDP frees its unsharded parameters) and filled again at the next
    one, and the run still ends at one device's weights."""
    data = ref.global_batches(64, 16)
    expected = ref.build_mlp(l2=0.0)
    expected.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    initial = expected.get_weights()
    expected.fit(data, epochs=2, verbose=0)
    model = _model(strategy, "adam")
    model.set_weights(initial)
    sharding = ShardedOptimizerState()
    tfdist.attach(model, strategy, communication=sharding)
    model.fit(data, epochs=1, verbose=0)
    slices = sharding._shards  # pylint: disable=protected-access
    assert len(slices) == len(model.trainable_variables)
    assert {tuple(part.read_value().shape) for variable in slices
            for part in strategy.experimental_local_results(variable)} == {(0,)}
    model.fit(data, epochs=1, verbose=0)
    ref.assert_weights_close(expected, model, atol=1e-5)


OPTIMIZERS = {
    "adamw": lambda: keras.optimizers.AdamW(0.02, weight_decay=0.05),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01, momentum=0.5),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "adamax": lambda: keras.optimizers.Adamax(0.02),
    "adadelta": lambda: keras.optimizers.Adadelta(1.0),
    "lion": lambda: keras.optimizers.Lion(0.002),
    "nesterov": lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    "amsgrad": lambda: keras.optimizers.Adam(0.02, amsgrad=True),
}


# CI runs amsgrad (its slots made in two groups: Keras' order in the
# checkpoint) and adadelta (a pair); --conformance=full runs all eight.
IN_CI = ("adadelta", "amsgrad")


@pytest.mark.parametrize("name", [
    name if name in IN_CI else pytest.param(name, marks=pytest.mark.conformance_full)
    for name in sorted(OPTIMIZERS)])
def test_every_elementwise_optimizer_equals_one_device(name, tmp_path):
    """Each optimizer the sharding accepts, on 3 replicas (the last batch of
    6 rows: uneven), against single-device Keras fit on the same batches;
    its checkpoint is one device's (its slots in Keras' order)."""
    expected, model = _sharded_on_3_replicas_and_one_device(OPTIMIZERS[name], OPTIMIZERS[name])
    # Per replica, each slot of each weight holds a third of it.
    sliced = sorted(int(np.prod(v.shape)) for v in model.optimizer.variables if v.shape != ())
    thirds = [-(-int(np.prod(w.shape)) // 3) for w in model.trainable_variables]
    assert sliced and sliced == sorted(thirds * (len(sliced) // len(thirds)))
    # Saved, the state is one device's Keras state (names, shapes, values).
    saved, wanted = ({key: value for key, value in _optimizer_saves(m, tmp_path / tag).items()}
                     for m, tag in ((model, "sharded"), (expected, "one_device")))
    assert saved.keys() == wanted.keys() and len(wanted) >= 4  # (a slot of 4 weights)
    for key, value in wanted.items():
        np.testing.assert_allclose(saved[key], value, atol=1e-5, rtol=0, err_msg=key)


def _sharded_on_3_replicas_and_one_device(one_device_optimizer, sharded_optimizer):
    """The test MLP fit for 3 epochs on 70 rows in batches of 16 by
    single-device Keras with ``one_device_optimizer()`` and, attached with
    sharded state on 3 replicas, with ``sharded_optimizer()``, from the same
    weights; ``(one-device model, sharded model)``, weights checked equal."""
    data = ref.global_batches(70, 16)
    expected = ref.build_mlp()
    expected.compile(optimizer=one_device_optimizer(), loss="sparse_categorical_crossentropy")
    initial = expected.get_weights()
    expected.fit(data, epochs=3, verbose=0)
    strategy = tfdist.make_strategy("mirrored", num_replicas=3)
    with strategy.scope():
        model = ref.build_mlp()
        model.compile(optimizer=sharded_optimizer(), loss="sparse_categorical_crossentropy")
    model.set_weights(initial)
    tfdist.attach(model, strategy, communication=ShardedOptimizerState())
    model.fit(data, epochs=3, verbose=0)
    ref.assert_weights_close(expected, model, atol=1e-5)
    return expected, model


def _optimizer_saves(model, directory) -> dict:
    path = tf.train.Checkpoint(optimizer=model.optimizer).write(str(directory / "ckpt"))
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(path)
            if name.startswith("optimizer/_variables/")}


class WithUnusedWeight(keras.Model):
    """A subclassed model with a layer its ``call`` never uses: the layer's
    weights get no gradient, and Keras' ``apply`` leaves them out."""

    def __init__(self):
        super().__init__()
        self.used = keras.layers.Dense(3, activation="softmax")
        self.unused = keras.layers.Dense(2)

    def build(self, input_shape):
        self.used.build(input_shape)
        self.unused.build(input_shape)

    def call(self, inputs):
        return self.used(inputs)


def test_a_weight_without_a_gradient_is_named(strategy):
    with strategy.scope():
        model = WithUnusedWeight()
        model.build((None, 5))
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    tfdist.attach(model, strategy, communication=ShardedOptimizerState())
    x, y, _ = ref.classification_arrays(32)
    with pytest.raises(ConfigurationError, match="no gradient for .*dense"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
