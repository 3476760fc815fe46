"""Several stages per device (``Pipeline(stages_per_device=v)``, the
interleaved 1F1B schedule): stage s on device s mod p, against one-device
Keras (alone, data x pipeline under MirroredStrategy, and with fully
sharded stages), each device running its passes in the schedule's order
as its ops record it, and what cannot run refused by name."""

import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.parallel.test_pipeline import _assert_equal_to, _fit, _model, _replicated
from tests.support import short_form
from tfdist.communication import FullySharded
from tfdist.errors import ConfigurationError
from tfdist.parallel import schedules

FOUR_STAGES = ["h1", "h2", "h3"]  # (the test MLP's 4 weighted layers, one per stage)

CASES = [  # (micro-batches, batch size): 4 stages on 2 devices
    (2, 8),   # m = p: every forward first (Megatron's warm-up of all m·v)
    (4, 8),   # the last batch of 6: micro-batches of 2, 2, 1, 1
    (6, 5),   # 6 micro-batches of a batch of 5: one left empty
]


@pytest.mark.parametrize("micro_batches,batch_size", CASES,
                         ids=[f"m{m}-b{b}" for m, b in CASES])
def test_four_stages_on_two_devices_equal_one_device(micro_batches, batch_size):
    """An L2 regularizer on the first layer, a max-norm constraint on the
    second: one device's weights, History, evaluation and predictions;
    stage s's weights and Adam state on CPU s mod 2."""
    expected = _fit(_model(), batch_size)
    pipeline = tfdist.parallel.Pipeline(cuts=FOUR_STAGES, micro_batches=micro_batches,
                                        stages_per_device=2)
    assert pipeline.schedule == "interleaved_1f1b" and pipeline.devices_per_pipeline == 2
    model = tfdist.attach(_model(), parallel=pipeline)
    _assert_equal_to(expected, _fit(model, batch_size))
    for layer, stage in (("h1", 0), ("h2", 1), ("h3", 2), ("out", 3)):
        for weight in model.get_layer(layer).weights:
            assert weight.value.device.endswith(f"CPU:{stage % 2}"), weight.path
    moments = [v for v in model.optimizer.variables if "h3_kernel" in v.path]
    assert [v.value.device[-5:] for v in moments] == ["CPU:0", "CPU:0"]
    # Each device's 2·m·v passes each wait for the one before.
    assert pipeline.ordering_edges >= 2 * (2 * micro_batches * 2 - 1)


class _Log:
    """What the recording ops ran, in the order they ran: (stage, "F"/"B")."""

    def __init__(self):
        self.lock, self.entries = threading.Lock(), []


class _Recorded(keras.layers.Layer):
    """Passes its input through, recording (stage, direction) when its
    forward and backward ops run: stateless, so only the schedule's order
    edges (and the data) order them."""

    def __init__(self, stage: int, log: _Log, **kwargs):
        super().__init__(**kwargs)
        self.stage, self.log = stage, log

    def _recording(self, kind: str):
        def record(values):
            with self.log.lock:
                self.log.entries.append((self.stage, kind))
            return values
        return record

    def call(self, inputs):
        @tf.custom_gradient
        def through(values):
            result = tf.numpy_function(self._recording("F"), [values], values.dtype,
                                       stateful=False)
            result.set_shape(values.shape)

            def gradient(upstream):
                passed = tf.numpy_function(self._recording("B"), [upstream], upstream.dtype,
                                           stateful=False)
                passed.set_shape(upstream.shape)
                return passed

            return result, gradient

        return through(inputs)

    def compute_output_shape(self, input_shape):
        return input_shape


@pytest.mark.parametrize("devices,per_device,micro_batches", [(2, 2, 4), (2, 3, 2)])
def test_each_device_runs_its_passes_in_the_interleaved_order(devices, per_device,
                                                               micro_batches):
    """What each device ran, in the order its ops ran (a recording op in
    every stage, forward and backward), is the schedule's order for that
    device: through its stages in turn, not stage by stage."""
    stages, log = devices * per_device, _Log()
    keras.utils.set_random_seed(1)
    layers = [keras.Input((4,))]
    for stage in range(stages):
        # (the recording op after the stage's weights: stage 0's backward
        # pass computes no gradient of the model's inputs)
        layers += [keras.layers.Dense(4, "tanh", name=f"dense{stage}"),
                   _Recorded(stage, log, name=f"record{stage}")]
    model = keras.Sequential(layers)
    model.compile(optimizer="sgd", loss="mse")
    pipeline = tfdist.parallel.Pipeline(
        cuts=[f"record{stage}" for stage in range(stages - 1)], micro_batches=micro_batches,
        stages_per_device=per_device, devices=[f"/cpu:{d}" for d in range(devices)])
    model = tfdist.attach(model, parallel=pipeline)
    rows = 2 * micro_batches
    x = np.random.default_rng(0).random((rows, 4), "float32")
    model.fit(x, x, batch_size=rows, epochs=1, verbose=0)
    orders = schedules.stage_orders("interleaved_1f1b", stages=stages,
                                    micro_batches=micro_batches, stages_per_device=per_device)
    for device, order in enumerate(orders):
        ran = [entry for entry in log.entries if entry[0] % devices == device]
        assert ran == [(action.stage, action.kind) for action in order], device


@pytest.mark.parametrize("sharded", short_form.only([False, True], in_ci=(True,)),
                         ids=lambda sharded: "fully_sharded" if sharded else "replicas")
def test_two_replicas_of_four_stages_on_two_devices_each_equal_one_device(sharded):
    """Data x interleaved pipeline under MirroredStrategy over 2 of the 4
    logical CPUs: replica r's stages s on device (s mod 2)·2 + r, each
    stage's gradients all-reduced (or, fully sharded, reduce-scattered)
    once per step."""
    expected = _fit(_model(), 8)
    model, strategy = _replicated()
    pipeline = tfdist.parallel.Pipeline(cuts=FOUR_STAGES, micro_batches=2,
                                        stages_per_device=2)
    model = tfdist.attach(model, strategy, parallel=pipeline,
                          communication=FullySharded() if sharded else None)
    _assert_equal_to(expected, _fit(model, 8))
    for layer, stage in (("h1", 0), ("h2", 1), ("h3", 2), ("out", 3)):
        for weight in model.get_layer(layer).trainable_weights:
            indexes = [tf.DeviceSpec.from_string(c.device).device_index
                       for c in weight.value.values]
            assert indexes == [2 * (stage % 2), 2 * (stage % 2) + 1], (weight.path, indexes)


def test_what_several_stages_per_device_cannot_run_is_refused_naming_it():
    with pytest.raises(ConfigurationError, match=r"`stages_per_device` \(3\) must divide the 4 "
                                                 r"stages"):
        tfdist.parallel.Pipeline(cuts=FOUR_STAGES, micro_batches=2, stages_per_device=3)
    with pytest.raises(ConfigurationError, match=r"micro_batches \(3\) must be a multiple of "
                                                 r"the 2 devices"):
        tfdist.parallel.Pipeline(cuts=FOUR_STAGES, micro_batches=3, stages_per_device=2)
    with pytest.raises(ConfigurationError, match=r"'gpipe' runs one stage per device"):
        tfdist.parallel.Pipeline(cuts=FOUR_STAGES, micro_batches=2, schedule="gpipe",
                                 stages_per_device=2)
    with pytest.raises(ConfigurationError, match=r"1 pipeline\(s\) of 4 stages need 2 "
                                                 r"devices \(one per 2 stages"):
        _fit(tfdist.attach(_model(), parallel=tfdist.parallel.Pipeline(
            cuts=FOUR_STAGES, micro_batches=2, stages_per_device=2,
            devices=["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"])))


def test_a_users_order_with_several_stages_per_device_runs_as_given():
    """An order of one's own, one line per device, each action naming its
    stage: depth first (each micro-batch through both of device 0's
    stages before the next), not Megatron's; one device's numbers."""
    order = ["F0@0 F0@2 F1@0 F1@2 B0@2 B0@0 B1@2 B1@0",
             "F0@1 F0@3 B0@3 F1@1 B0@1 F1@3 B1@3 B1@1"]
    pipeline = tfdist.parallel.Pipeline(cuts=FOUR_STAGES, micro_batches=2,
                                        stages_per_device=2, schedule=order)
    assert pipeline.schedule == order
    _assert_equal_to(_fit(_model(), 8), _fit(tfdist.attach(_model(), parallel=pipeline), 8))
