"""Megatron-LM's column and row forms of a dense layer on a replica's model
devices (`tfdist.parallel.sharded_forms`), against NumPy's one-device
math, with what crosses devices in each phase of a traced step: the
batch's activations once per model device and direction, never a weight."""

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.parallel import device_traffic, sharded_forms

ROWS, INPUTS, HIDDEN, OUTPUTS = 5, 4, 6, 3


def _devices(count):
    return tfdist.strategies.configure_logical_cpus(4)[:count]


def _placed(arrays, devices):
    variables = []
    for array, device in zip(arrays, devices):
        with tf.device(device):
            variables.append(tf.Variable(array))
    return variables


def _problem(k):
    rng = np.random.RandomState(k)
    x = rng.normal(size=(ROWS, INPUTS)).astype("float32")
    w1 = rng.normal(size=(INPUTS, HIDDEN)).astype("float32")
    b1 = rng.normal(size=(HIDDEN,)).astype("float32")
    w2 = rng.normal(size=(HIDDEN, OUTPUTS)).astype("float32")
    b2 = rng.normal(size=(OUTPUTS,)).astype("float32")
    target = rng.normal(size=(ROWS, OUTPUTS)).astype("float32")
    return x, w1, b1, w2, b2, target


def _one_device(x, w1, b1, w2, b2, target):
    """The MLP ``tanh(x w1 + b1) w2 + b2`` with a mean squared error, and its
    gradients, by hand in NumPy."""
    z = x @ w1 + b1
    h = np.tanh(z)
    y = h @ w2 + b2
    loss = np.mean((y - target) ** 2)
    dy = 2 * (y - target) / y.size
    dw2, db2, dh = h.T @ dy, dy.sum(0), dy @ w2.T
    dz = dh * (1 - h ** 2)
    return loss, {"w1": x.T @ dz, "b1": dz.sum(0), "w2": dw2, "b2": db2, "x": dz @ w1.T}


def _sharded_mlp(k, devices, leading=False):
    """``leading``: a replicated layer on device 0 before the column form,
    whose weight needs the column input's gradient."""
    x, w1, b1, w2, b2, target = _problem(k)
    kernels1 = _placed(np.split(w1, k, axis=1), devices)
    biases1 = _placed(np.split(b1, k), devices)
    kernels2 = _placed(np.split(w2, k, axis=0), devices)
    with tf.device(devices[0]):
        bias2 = tf.Variable(b2)
    variables = kernels1 + biases1 + kernels2 + [bias2]
    if leading:
        with tf.device(devices[0]):
            variables.append(tf.Variable(np.eye(INPUTS, dtype="float32")))

    def loss_of(inputs):
        if leading:
            with tf.device(devices[0]):
                inputs = tf.matmul(inputs, variables[-1])
        parts = sharded_forms.column(inputs, kernels1, biases1, devices, "tanh")
        y = sharded_forms.row(parts, kernels2, bias2, devices[0])
        with tf.device(devices[0]):
            return tf.reduce_mean(tf.square(y - target))

    @tf.function
    def forward(inputs):
        with tf.device(devices[0]):
            inputs = tf.identity(inputs)
        return loss_of(inputs)

    @tf.function
    def step(inputs):
        with tf.device(devices[0]):
            inputs = tf.identity(inputs)
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            loss = loss_of(inputs)
        return loss, tape.gradient(loss, variables + [inputs])

    @tf.function
    def train(inputs):
        """One SGD step: each weight updated where it lives."""
        with tf.device(devices[0]):
            inputs = tf.identity(inputs)
        with tf.GradientTape() as tape:
            loss = loss_of(inputs)
        for variable, grad in zip(variables, tape.gradient(loss, variables)):
            with tf.device(variable.device):  # (as an optimizer colocates its update)
                variable.assign_sub(0.1 * grad)
        return loss

    return (x, w1, b1, w2, b2, target), forward, step, train


@pytest.mark.parametrize("k", [2, 3])
def test_a_column_then_row_mlp_equals_one_device(k):
    devices = _devices(k)
    problem, _, step, _ = _sharded_mlp(k, devices)
    expected_loss, expected = _one_device(*problem)
    loss, grads = step(tf.constant(problem[0]))
    np.testing.assert_allclose(loss.numpy(), expected_loss, rtol=1e-5)
    w1_grads, b1_grads = grads[:k], grads[k:2 * k]
    w2_grads, b2_grad, x_grad = grads[2 * k:3 * k], grads[3 * k], grads[3 * k + 1]
    np.testing.assert_allclose(np.concatenate([g.numpy() for g in w1_grads], 1), expected["w1"],
                               atol=1e-5)
    np.testing.assert_allclose(np.concatenate([g.numpy() for g in b1_grads]), expected["b1"],
                               atol=1e-5)
    np.testing.assert_allclose(np.concatenate([g.numpy() for g in w2_grads], 0), expected["w2"],
                               atol=1e-5)
    np.testing.assert_allclose(b2_grad.numpy(), expected["b2"], atol=1e-5)
    np.testing.assert_allclose(x_grad.numpy(), expected["x"], atol=1e-5)


def _crossed(function, devices, *args):
    graph = function.get_concrete_function(*args).graph
    def index(device):
        return tf.DeviceSpec.from_string(device).device_index
    return sorted((index(c.source), index(c.destination), c.shape)
                  for c in device_traffic.crossings(graph, default_device=devices[0]))


@pytest.mark.parametrize("leading", [False, True], ids=["input_is_data", "input_needs_gradient"])
def test_each_phase_sends_the_batchs_activations_once_per_model_device_and_no_weight(leading):
    """Forward: the input to device 1, its partial product back. Backward:
    the output's gradient to device 1, and, when the column form's input
    needs a gradient (a layer before it), device 1's part of it back (as
    Megatron-LM's column layer all-reduces its input's gradient only
    then). The update: nothing (each weight updated where it lives).
    Nothing of a weight's shape crosses, in any phase."""
    devices = _devices(2)
    problem, forward, _, train = _sharded_mlp(2, devices, leading=leading)
    x = tf.constant(problem[0])
    forward_crossings = _crossed(forward, devices, x)
    assert forward_crossings == [(0, 1, (ROWS, INPUTS)), (1, 0, (ROWS, OUTPUTS))]
    step_crossings = _crossed(train, devices, x)
    for crossing in forward_crossings:
        step_crossings.remove(crossing)
    assert step_crossings == [(0, 1, (ROWS, OUTPUTS))] + (
        [(1, 0, (ROWS, INPUTS))] if leading else [])
