"""Each stage's optimizer update on the stage's device (`tfdist.parallel.pipeline`).

A pipeline's step runs under one replica, and TensorFlow places an op
without a device where the step runs: the first stage's device (the
chief, with stages on other processes). Keras' optimizers compute each
weight's update (Adam's moments, the step) in ops of their own, which
would then run there: every other stage's gradient, weights and state
would cross to the first stage and the results back, at every step (the
cluster benchmark measured 8 MB on the link per step where the
activations were 2). `run_on_weight_devices` makes the optimizer update
each stage's weights, and decay them (AdamW), under the weights' device:
its updates are per weight, so running them in groups by device is the
same update. Its clipping runs each gradient's part under the gradient's
device (a global norm gathers one scalar per gradient), and
`constrain_on_weight_devices` does the same for the weights' constraints.
(The optimizer's EMA of the weights, ``use_ema=True``, still runs where
the step runs.)

>>> import keras, tensorflow as tf, tfdist
>>> devices = tfdist.strategies.configure_logical_cpus(2)  # (before other TensorFlow work)
>>> from tfdist.parallel import stage_updates
>>> with tf.device(devices[1]):
...     weight = keras.Variable([1.0, 2.0])
>>> optimizer = keras.optimizers.SGD(0.5)
>>> stage_updates.run_on_weight_devices(optimizer)
>>> @tf.function
... def step():
...     optimizer.apply([tf.constant([1.0, 1.0])], [weight])
>>> ops = step.get_concrete_function().graph.get_operations()
>>> sorted({op.device[-5:] for op in ops if op.type in ("Mul", "AssignSubVariableOp")})
['CPU:1']
"""

import functools
from typing import Callable

import tensorflow as tf

from tfdist._internal.keras import layer_units, optimizer as keras_optimizer, patches
from tfdist._internal.keras import model_state as keras_model_state, norm_groups
from tfdist._internal.keras import placed_weights
from tfdist._internal.tensorflow import distributed_variables


def run_on_weight_devices(optimizer) -> None:
    """Makes ``optimizer`` (or a LossScaleOptimizer's inner one) update and
    decay each weight under the weight's device (module doc)."""
    inner = patches.inner_optimizer(optimizer)
    if getattr(inner, "_tfdist_updates_on_weight_devices", False):
        return
    update, decay = patches.update_of(inner), patches.weight_decay_of(inner)

    def update_by_device(grads, variables, learning_rate):
        pairs = list(zip(grads, variables))
        for _, group in _by_device(pairs, lambda pair: _placement(pair[1])):
            with tf.device(placed_weights.device_of(group[0][1])):
                update([g for g, _ in group], [v for _, v in group], learning_rate)

    def decay_by_device(variables):
        for _, group in _by_device(variables, _placement):
            with tf.device(placed_weights.device_of(group[0])):
                decay(group)

    patches.replace_update_of(inner, update_by_device)
    patches.replace_weight_decay_of(inner, decay_by_device)
    patches.replace_clipping_of(inner, _clip_on_gradient_devices)
    object.__setattr__(inner, "_tfdist_updates_on_weight_devices", True)


def _placement(variable) -> tuple:
    """Where ``variable`` lives, the same key in every replica: its copies'
    devices (a replica's group of updates is one merge of all replicas',
    so every replica must make the same groups; grouped by the local
    copy's device alone, a tensor-parallel shard on replica 0's own device
    would join replica 0's replicated weights but not replica 1's)."""
    storage = keras_model_state.tensorflow_variable(variable)
    if distributed_variables.is_distributed(storage):
        return tuple(copy.device for copy in distributed_variables.local_copies(storage))
    return (placed_weights.device_of(variable),)


def constrain_on_weight_devices(weights) -> None:
    """Makes each weight's constraint (``kernel_constraint=...``, which
    Keras' ``apply`` runs after the update, where the step runs) compute
    under the weight's device: ``Variable.constraint`` becomes the same
    constraint, placed (under a strategy, on the device of the copy the
    replica updates: read when it runs)."""
    for weight in weights:
        layer_units.replace_constraint(
            weight, functools.partial(_placed, weight=weight), policy="stage")


def _placed(constraint: Callable, weight) -> Callable:
    def constrain(value):
        with tf.device(placed_weights.device_of(weight)):
            return constraint(value)

    return constrain


def _clip_on_gradient_devices(optimizer, gradients) -> list:
    """Keras' clipping (``clipnorm``, ``global_clipnorm``, ``clipvalue``),
    each gradient's part of it under the gradient's device: a global norm
    gathers only each gradient's squared norm, and so does ``clipnorm`` of a
    weight kept as shards (`tfdist._internal.keras.norm_groups`)."""
    gradients = list(gradients)
    if (optimizer.clipnorm or 0) > 0 or (optimizer.global_clipnorm or 0) > 0:
        variables = norm_groups.clipped_variables(gradients)
        summed = None if variables is None or not (optimizer.clipnorm or 0) > 0 \
            else norm_groups.summed_squares(variables)
        return keras_optimizer.clip_slices(optimizer, gradients, summed or (lambda s: s),
                                           placed=True)
    clipped = list(gradients)  # (clipvalue, elementwise; or no clipping)
    present = [index for index, g in enumerate(gradients) if g is not None]
    for device, group in _by_device(
            present, lambda index: keras_optimizer.tensor_device(gradients[index])):
        with tf.device(device):
            for index, value in zip(group, keras_optimizer.clip_gradients(
                    optimizer, [gradients[index] for index in group])):
                clipped[index] = value
    return clipped


def _by_device(items, device_of: Callable):
    """``(device, [item, ...])`` for ``items`` grouped by ``device_of(item)``,
    the devices in first-seen order, each group in the items' order."""
    groups = {}
    for item in items:
        groups.setdefault(device_of(item), []).append(item)
    return groups.items()
