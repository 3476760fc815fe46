"""Megatron-LM's two forms of a dense layer split over one replica's model
devices (the model axis of `tfdist.parallel.layouts`), forward and
backward, each op placed on the device that holds its shard.

- `column`: the kernel split by output columns (``kernels[j]`` on
  ``devices[j]``, its bias part beside it). The input, whole on its own
  device, is sent once to each model device; device j computes its columns
  of the output (the activation too: it is elementwise). No sum: the
  output stays split, ``outputs[j]`` on ``devices[j]``. Backward: each
  device computes its kernel's and bias' gradient in place and its part of
  the input's gradient, and the parts are summed on the input's device
  (sent once each).
- `row`: the kernel split by input rows, its input already split the same
  way (a column form's outputs): device j multiplies its part by its rows,
  and the partial products are summed on the output's device (sent once
  each), where the bias is added once. Backward: the output's gradient is
  sent once to each model device, which computes its rows' gradient and
  its input part's gradient in place.

So a column form followed by a row form moves, per direction, one tensor
of the batch's rows per model device: the input there, the partial
products back (forward); the output's gradient there, the input's
gradient parts back (backward); never a weight. The activations between
them never leave their devices.

Each form runs as one ``tf.custom_gradient`` whose backward pass is
written out per device: TensorFlow places a gradient op where
``GradientTape.gradient`` is called, not with its forward op
(tensorflow/tensorflow#33688), so automatic differentiation would run
every shard's backward pass on one device. A device's backward pass is
differentiated from its forward pass (a tape per device), so any
elementwise activation works.

>>> import numpy as np, tensorflow as tf, tfdist
>>> devices = tfdist.strategies.configure_logical_cpus(3)
>>> x = tf.constant(np.arange(8, dtype="float32").reshape(2, 4) / 8)
>>> whole = np.linspace(-1, 1, 24, dtype="float32").reshape(4, 6)
>>> kernels = []
>>> for j, columns in enumerate(np.split(whole, 2, axis=1)):
...     with tf.device(devices[1 + j]):
...         kernels.append(tf.Variable(columns))
>>> parts = column(x, kernels, None, devices[1:], "relu")
>>> [p.device[-5:] for p in parts]
['CPU:1', 'CPU:2']
>>> np.allclose(np.concatenate([p.numpy() for p in parts], 1), np.maximum(x.numpy() @ whole, 0))
True
"""

from typing import Callable, List, Optional, Sequence

import keras
import tensorflow as tf

from tfdist._internal.tensorflow import placed_gradients


def _activation(activation) -> Callable:
    return keras.activations.get(activation) if activation is not None else (lambda z: z)


def on_device(device: str, function: Callable, inputs: Sequence[tf.Tensor]):
    """``function(*inputs)`` as one ``tf.custom_gradient`` on ``device``,
    forward and backward: its inputs are sent there once, its gradients
    computed there (TensorFlow would place them where the tape's gradient
    is called), and nothing of a variable it reads (its shards, which live
    on ``device``: a mirrored variable's replica copy, watched as it is
    read) leaves it. The inputs' gradients stay on ``device``; whoever sums
    them sends them once. ``function`` may return a tuple of tensors (an
    attention's output and scores): the result is that tuple."""
    with tf.device(device):
        @placed_gradients.custom_gradient
        def unit(*tensors):
            with tf.GradientTape() as tape:
                tape.watch(tensors)
                placed_gradients.read_captures_with(tape)  # (a shard gathered for the step)
                output = function(*tensors)
            flat = tf.nest.flatten(output)

            def backward(*upstream, variables=None, captured=()):
                with tf.device(device):
                    upstream = [tf.zeros_like(o) if u is None else tf.identity(u)
                                for o, u in zip(flat, upstream)]
                    inputs = list(tensors) + list(captured)
                    grads = tape.gradient(flat, inputs + list(variables or []),
                                          output_gradients=upstream)
                return grads[:len(inputs)], grads[len(inputs):]

            return output, backward

        return unit(*inputs)


def _as(value: tf.Tensor, dtype) -> tf.Tensor:
    """``value`` in the layer's compute dtype (float32 weights under mixed precision)."""
    return value if value.dtype == dtype else tf.cast(value, dtype)


def einsum(equation: str) -> Callable:
    """The product of an ``EinsumDense`` of ``equation``, for `column` and `row`."""
    def times(x: tf.Tensor, kernel) -> tf.Tensor:
        return tf.einsum(equation, x, _as(tf.convert_to_tensor(kernel), x.dtype))
    return times


def _times(x: tf.Tensor, kernel) -> tf.Tensor:
    """``x @ kernel`` over ``x``'s last dimension, whatever its leading ones
    (a batch, a sequence), as Keras' ``Dense`` computes it."""
    kernel = _as(tf.convert_to_tensor(kernel), x.dtype)
    if x.shape.rank == 2:
        return tf.matmul(x, kernel)
    return tf.tensordot(x, kernel, [[x.shape.rank - 1], [0]])


def column(x, kernels: Sequence[tf.Variable], biases: Optional[Sequence],
           devices: Sequence[str], activation=None, times: Optional[Callable] = None) -> List[tf.Tensor]:
    """``activation(x @ kernels[j] + biases[j])`` on ``devices[j]``, for
    each j: the column form (module doc). ``x``: [..., inputs], on its own
    device (or a list of it, whole on each device: gathered there by
    `tfdist.parallel.sharded_sequence`); ``kernels[j]``: [inputs, columns
    of shard j]; ``biases``: one per shard, or None. ``times(x, kernel)``:
    the product, by default ``Dense``'s (an ``EinsumDense`` gives its
    equation's). Returns the output's parts, in order."""
    biases = list(biases) if biases is not None else [None] * len(kernels)
    inputs = list(x) if isinstance(x, (list, tuple)) else [x] * len(kernels)
    return [on_device(device, lambda tensor, k=kernel, b=bias: column_part(
                tensor, k, b, activation, times), [each])
            for kernel, bias, device, each in zip(kernels, biases, devices, inputs)]


def column_part(x: tf.Tensor, kernel, bias, activation=None,
                times: Optional[Callable] = None) -> tf.Tensor:
    """One shard's part of the column form, ``activation(times(x, kernel)
    + bias)``, where it is called (`column` runs it on the shard's device;
    `tfdist.parallel.sharded_attention` runs an attention's three
    projections in one unit per device)."""
    z = (times or _times)(x, kernel)
    return _activation(activation)(z if bias is None else z + _as(tf.convert_to_tensor(bias),
                                                                  z.dtype))


def row(parts: Sequence[tf.Tensor], kernels: Sequence[tf.Variable], bias,
        device: str, activation=None, devices: Optional[Sequence[str]] = None,
        times: Optional[Callable] = None) -> tf.Tensor:
    """``activation(sum_j parts[j] @ kernels[j] + bias)`` on ``device``:
    the row form (module doc). ``parts[j]``: [..., inputs of shard j] on
    shard j's device (a column form's outputs); ``kernels[j]``: [inputs of
    shard j, outputs] there (on ``devices[j]``, by default the kernel's
    own device); ``bias``: [outputs] or None, added once. ``times``: as
    for `column`."""
    products = row_products(parts, kernels, devices, times)
    with tf.device(device):
        return row_finish(tf.add_n(products), bias, activation)  # (each product sent once)


def row_products(parts: Sequence[tf.Tensor], kernels: Sequence[tf.Variable],
                 devices: Optional[Sequence[str]] = None,
                 times: Optional[Callable] = None) -> List[tf.Tensor]:
    """The row form's partial products, ``parts[j] @ kernels[j]`` on
    ``devices[j]`` (`row` sums them on one device;
    `tfdist.parallel.sharded_sequence` reduce-scatters them)."""
    times = times or _times
    devices = list(devices) if devices is not None else [k.device for k in kernels]
    return [on_device(shard_device, lambda p, k=kernel: times(p, k), [part])
            for part, kernel, shard_device in zip(parts, kernels, devices)]


def row_finish(output: tf.Tensor, bias, activation=None) -> tf.Tensor:
    """The row form's summed product with its bias added once and its
    activation, where it is called."""
    if bias is not None:
        output = output + _as(tf.convert_to_tensor(bias), output.dtype)
    return _activation(activation)(output)
