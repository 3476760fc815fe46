"""Layers as the units fully sharded weights are gathered and freed by
(`tfdist.communication.FullySharded`, ``reshard_after_forward=True``).

PyTorch's FSDP gathers a module's parameters before its forward pass,
frees them after it, and gathers them again before its backward pass
(``reshard_after_forward``), so that only the layers being computed hold
whole weights. TensorFlow keeps every input of an op alive until the
op's gradient has run: a ``MatMul`` keeps its weight operand for the
backward pass. Freeing a gathered weight after the forward pass
therefore means the backward pass must not use the forward's tensors.
Each unit (a layer of the model that owns trainable weights, or a nested
one named by path: `tfdist._internal.keras.layer_paths.units`)
runs as one ``tf.custom_gradient`` whose gradient gathers the unit's
weights again and recomputes the unit's forward pass from its inputs
(as ``tf.recompute_grad`` does, which Keras' ``RematScope`` uses): the
unit's activations are freed too, for one more forward pass of compute.

Order: a gather waits for the inputs of the unit before it (``prefetch``:
the next unit's weights arrive while this one computes, at most two
units' gathered weights alive at once, FSDP's default) or for its own
inputs (no prefetch: one unit at a time). In the backward pass the
same holds with the units' output gradients in reverse order.

A unit whose forward pass changes state (``BatchNormalization``'s moving
statistics, a ``Dropout``'s random seed: a second forward pass would
update or draw again) or runs a check or a print (a
``tf.debugging.assert_*``: a second run in the backward pass would wait
for the next replica's forward pass, a deadlock;
`tfdist._internal.state_writes`) is not recomputed: its gradient uses
the forward pass's tensors, so its gathered weights stay alive until its
backward pass, with a warning naming it. The numbers are the same either
way.
"""

import functools
import threading
import warnings
import weakref
from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from tfdist._internal import state_writes
from tfdist._internal.keras import compiled as keras_compiled, layer_calls, layer_paths, layer_units
from tfdist._internal.thread_values import ThreadValue
from tfdist.errors import ConfigurationError

_SCOPE = ThreadValue()  # the unit pass being traced on this thread (`GatherScope`)


class GatherScope:
    """The gathers of one unit's forward (or recomputed) pass: each weight
    gathered once per pass (``gathered``: (replica, weight index) ->
    tensor), each gather running after the tensors in ``after``."""

    def __init__(self, after: List[tf.Tensor]):
        self.after = after
        self.gathered = {}


def current_scope() -> Optional[GatherScope]:
    """The unit pass being traced on this thread, if any."""
    return _SCOPE.get()


class _Anchors:
    """Per traced step and replica: what the last unit's gathers waited
    for, in the forward pass and in the backward pass."""

    def __init__(self):
        self.forward = None
        self.backward = None


def unit_patterns(units, reshard_after_forward: bool) -> Optional[List[str]]:
    """``FullySharded(units=...)`` checked: a list of layer paths (regular
    expressions), which only resharding after the forward pass uses."""
    if units is None:
        return None
    if isinstance(units, str) or not all(isinstance(u, str) for u in units):
        raise ConfigurationError(
            f"FullySharded: `units` ({units!r}) must be a list of layer paths (regular "
            "expressions), e.g. ['backbone/block_\\d+'].")
    if not reshard_after_forward:
        raise ConfigurationError(
            "FullySharded(units=...) chooses what is gathered and freed as one, which only "
            "reshard_after_forward=True does; drop `units` or reshard_after_forward=False.")
    return list(units)


class GatherUnits:
    """Wraps the ``call`` of a model's units that own trainable weights,
    so that each runs as a unit (module doc) inside a replica of a step;
    anywhere else they run as before.

    Args:
      in_replica_step: returns the (graph, replica) of the replica step
        being traced, or None outside one (eager, cross-replica, another
        strategy).
      prefetch: gather the next unit's weights while this one computes.
    """

    def __init__(self, in_replica_step: Callable, prefetch: bool):
        self._in_replica_step = in_replica_step
        self._prefetch = prefetch
        self._anchors = weakref.WeakKeyDictionary()  # graph -> {replica: _Anchors}
        self.kept_whole = []  # names of units whose gathered weights stay through the step
        self._lock = threading.Lock()

    def wrap(self, model, patterns: Sequence[str] = (), what: str = "FullySharded",
             skip: Callable = lambda layer: False) -> List[str]:
        """Makes each layer of ``model`` whose path one of ``patterns``
        matches, and each layer beside them, a unit if it has trainable
        weights (`tfdist._internal.keras.layer_paths.units`; no patterns:
        the model's layers) and ``skip(layer)`` is false (a table looked up
        where its rows live: nothing gathered to free); returns their paths."""
        named = layer_paths.matching(model, patterns)
        if patterns and not named:
            raise ConfigurationError(
                f"{what}: `units` {list(patterns)} match no layer's path; the model's layers "
                f"are {[path for path, _ in layer_paths.walk(model)][:24]}.")
        paths = []
        for unit in layer_paths.units(model, named, what=what):
            if unit.layer.trainable_weights and not skip(unit.layer) and layer_units.wrap_call(
                    unit.layer, "gather", functools.partial(self._unit_call, unit.layer)):
                paths.append(unit.path)
        return paths

    def _unit_call(self, layer, original):
        """``original`` (``layer``'s call) run as a unit inside a replica
        step, as it is anywhere else."""
        def call(*args, **kwargs):
            site = self._in_replica_step()
            if site is None or current_scope() is not None:
                return original(*args, **kwargs)
            return self._run(layer, original, args, kwargs, site)

        return call

    def _anchors_of(self, graph, replica) -> _Anchors:
        with self._lock:
            return self._anchors.setdefault(graph, {}).setdefault(replica, _Anchors())

    def _run(self, layer, original, args, kwargs, site):
        graph, replica = site
        call = layer_calls.LayerCall(args, kwargs)
        if not call.differentiable:
            return original(*args, **kwargs)
        anchors = self._anchors_of(graph, replica)

        def in_step_graph(tensors):
            return [t for t in tensors if getattr(t, "graph", None) is graph]

        def forward_pass(tensors):
            own = in_step_graph(tensors)
            after = own if not self._prefetch or anchors.forward is None else anchors.forward
            anchors.forward = own
            anchors.backward = None  # (a new backward pass follows this forward)
            writes = state_writes.Writes(tf.compat.v1.get_default_graph())
            with tf.GradientTape(watch_accessed_variables=True) as forward_tape:
                forward_tape.watch(tensors)
                with _SCOPE.set_to(GatherScope(after)):
                    call_args, call_kwargs = call.arguments(tensors)
                    result = original(*call_args, **call_kwargs)
            written = writes.found()

            def gradient(upstream, variables):
                if written:
                    self._keep_whole(layer, written)
                    return forward_tape.gradient(
                        tf.nest.flatten(result), list(tensors) + variables,
                        output_gradients=upstream,
                        unconnected_gradients=tf.UnconnectedGradients.ZERO)
                with keras_compiled.in_autocast_scope(call.autocast):
                    return self._recompute(original, call, tensors, variables, upstream,
                                           anchors, in_step_graph)

            return result, gradient

        return layer_units.run_as_unit(call, forward_pass)

    def _recompute(self, original, call, tensors, variables, upstream, anchors,
                   in_step_graph):
        own = in_step_graph(upstream)
        after = own if not self._prefetch or anchors.backward is None else anchors.backward
        anchors.backward = own
        with tf.control_dependencies(own):
            inputs = [tf.identity(t) for t in tensors]
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(inputs)
            tape.watch(variables)
            with _SCOPE.set_to(GatherScope(after)):
                call_args, call_kwargs = call.arguments(inputs, with_masks=True)
                result = original(*call_args, **call_kwargs)
        return tape.gradient(tf.nest.flatten(result), inputs + variables,
                             output_gradients=list(upstream),
                             unconnected_gradients=tf.UnconnectedGradients.ZERO)

    def _keep_whole(self, layer, written) -> None:
        if layer.name in self.kept_whole:
            return
        self.kept_whole.append(layer.name)
        warnings.warn(
            f"FullySharded: layer {layer.name!r} runs ops in its forward pass that a second "
            f"run would repeat ({', '.join(written)}: it updates statistics, draws random "
            "numbers, or checks or prints, which TensorFlow runs in the order the replicas "
            "were traced), so its forward pass is not computed again in the backward pass "
            "and its gathered weights stay alive until then. The numbers are the same; only the bound on "
            "gathered weights alive at once does not cover this layer.", stacklevel=2)
