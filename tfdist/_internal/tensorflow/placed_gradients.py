"""``tf.custom_gradient`` inside a traced function, with nothing sent to
the caller's device that the call did not compute there.

In a graph, ``tf.custom_gradient`` passes the function's results, its
inputs and the values of every variable it read through one ``IdentityN``
op, placed on the device the call is made under. A call whose variables
live on other devices (a pipeline stage's pass whose layer keeps its
shards on the stage's model devices: `tfdist.parallel.plan`) therefore
reads each of them and sends its value to that device, once per call, though
the value is never used there. `custom_gradient` records the same custom
gradient with the gradient tape (`tensorflow.python.eager.record`, as
TensorFlow's own decorator does) but gives each result its own identity,
beside the tensor, and reads each variable beside the variable, where
nothing else consumes it: the traced step moves what the call computes, not
its weights.

Eagerly (each op runs where it is placed, no ``IdentityN`` gathers them)
it is ``tf.custom_gradient`` itself.

>>> import tensorflow as tf
>>> w = tf.Variable(3.0)
>>> def times_w(x):
...     def gradient(upstream, variables):
...         return [upstream * 10.0], [upstream * 20.0]   # (not the true gradients: custom)
...     return x * w, gradient
>>> @tf.function
... def step(x):
...     with tf.GradientTape() as tape:
...         tape.watch(x)
...         y = custom_gradient(times_w)(x)
...     return y, tape.gradient(y, [x, w])
>>> [float(t) for t in tf.nest.flatten(step(tf.constant(2.0)))]
[6.0, 10.0, 20.0]
"""

import contextlib
import itertools
from typing import Callable

import tensorflow as tf
from tensorflow.python.eager import record  # (see privates.PRIVATES)

from tfdist._internal.thread_values import ThreadValue

_NAMES = itertools.count()


def custom_gradient(f: Callable) -> Callable:
    """``f`` (``f(*tensors) -> (result, gradient)``, as for
    ``tf.custom_gradient``: ``gradient(*upstream, variables=...)`` returns
    the inputs' gradients and, when ``f`` read variables, theirs) made a
    differentiable function whose identities stay beside their tensors
    (module doc)."""

    def call(*args):
        if tf.executing_eagerly():  # (nothing is placed by a graph: TensorFlow's own)
            return tf.custom_gradient(f)(*args)
        args = [tf.convert_to_tensor(arg) for arg in args]
        captures = _Captures(args)
        with record.VariableWatcher() as watcher, _CALL.set_to(captures):
            result, gradient = f(*args)
        flat_result = tf.nest.flatten(result)
        variables = sorted({v.ref(): v for v in watcher.watched_variables()}.values(),
                           key=lambda v: v.name)
        captured = list(captures.tensors)
        with record.stop_recording():
            outputs = [_beside(t, tf.identity, t) for t in flat_result]
        reads = [_beside(v.handle, tf.convert_to_tensor, v) for v in variables]

        def backward(*upstream):
            given = {"variables": variables} if variables else {}
            if captured:
                given["captured"] = captured
            if variables:
                input_gradients, variable_gradients = gradient(*upstream, **given)
            else:
                input_gradients, variable_gradients = gradient(*upstream, **given), []
            return ([None] * len(flat_result) + list(tf.nest.flatten(input_gradients))
                    + list(variable_gradients))

        record.record_operation(f"PlacedCustomGradient{next(_NAMES)}", outputs,
                                flat_result + args + captured + reads, backward)
        return tf.nest.pack_sequence_as(result, outputs)

    return call


class _Captures:
    """What one `custom_gradient` call's function reads that was computed
    outside it and is not among its arguments (`capture`), for a function
    that differentiates them (`read_captures_with`)."""

    def __init__(self, args):
        self.args = args
        self.tape = None
        self.tensors = []


_CALL = ThreadValue()  # the innermost `custom_gradient` call being traced: its _Captures


def read_captures_with(tape: tf.GradientTape) -> None:
    """Says, inside ``f`` of the innermost `custom_gradient` call, that ``f``
    differentiates what it reads with ``tape``: tensors `capture` gives it
    from outside are watched by ``tape``, made inputs of the call, and
    ``f``'s gradient is given them (``gradient(*upstream,
    captured=[...])``, returning their gradients after the arguments')."""
    captures = _CALL.get()
    if captures is not None:
        captures.tape = tape


def capture(tensor: tf.Tensor) -> tf.Tensor:
    """``tensor``, computed outside the `custom_gradient` call being traced
    (a weight gathered once for a pipelined step, read by a split layer's
    form), as that call's function reads it: when the function
    differentiates its reads (`read_captures_with`), an input of the call,
    so the gradient it computes for ``tensor`` reaches ``tensor``'s own
    gradient; else (or outside a call) as it is."""
    captures = _CALL.get()
    if captures is None or captures.tape is None or \
            any(t is tensor for t in captures.args + captures.tensors):
        return tensor
    captures.tape.watch(tensor)
    captures.tensors.append(tensor)
    return tensor


def _beside(anchor, make: Callable, value):
    """``make(value)`` on ``anchor``'s device (under the caller's scope when
    it names none)."""
    device = getattr(anchor, "device", "") or ""
    with (tf.device(device) if device else contextlib.nullcontext()):
        return make(value)
