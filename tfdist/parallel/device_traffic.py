"""What crosses devices in a traced step: every tensor an op reads from
an op placed on another device, which TensorFlow's runtime sends there
(a copy between devices of one process, a Send / Recv between tasks).

Read from the graph as traced (each op's requested device), before
TensorFlow's placer runs: what the layout asks for, which on CPUs and on
GPUs with soft placement off is what runs; except that an op on a
variable (a read, an update) runs where the variable lives, as the placer
makes it, so a weight read from another device shows as its value
crossing. A tensor sent to a device once
is counted once, whichever ops there read it. Its bytes are known when
its shape is static (a weight, a gradient, a scalar), else None (an
activation of as many rows as the batch gives).

>>> import tensorflow as tf, tfdist
>>> devices = tfdist.strategies.configure_logical_cpus(2)
>>> @tf.function
... def step():
...     with tf.device(devices[0]):
...         a = tf.ones([4, 3])
...     with tf.device(devices[1]):
...         return a * 2.0
>>> [(c.source[-5:], c.destination[-5:], c.bytes) for c in
...  crossings(step.get_concrete_function().graph)]
[('CPU:0', 'CPU:1', 48)]
"""

import dataclasses
from typing import List, Optional

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Crossing:
    """One tensor sent from ``source`` to ``destination`` (devices)."""

    tensor: str
    source: str
    destination: str
    shape: tuple
    dtype: str
    bytes: Optional[int]


def _device(name: str) -> str:
    spec = tf.DeviceSpec.from_string(name)
    return spec.replace(job=spec.job or "localhost", replica=spec.replica or 0,
                        task=spec.task or 0).to_string()


def needed_ops(graph) -> Optional[set]:
    """The names of the ops a function graph runs: those its outputs and
    its stateful ops (its control outputs) need; TensorFlow prunes the
    rest. None for a graph that is not a function's."""
    roots = [t.op for t in getattr(graph, "outputs", None) or []] + list(
        getattr(graph, "control_outputs", None) or [])
    if not roots:
        return None
    needed, stack = set(), list(roots)
    while stack:
        op = stack.pop()
        if op.name in needed:
            continue
        needed.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return needed


def crossings(graph, default_device: Optional[str] = None) -> List[Crossing]:
    """Every tensor of ``graph`` (a ``tf.Graph``, such as a concrete
    function's) read on another device than its op's (module doc), in the
    graph's op order, among the ops a function runs (an op whose result
    nothing needs is pruned by TensorFlow, and not counted). An op on a
    variable runs where the variable lives; a
    captured tensor is where it was made; another op without a device runs
    on ``default_device`` (the device a ``tf.function`` without a
    strategy runs on), or is left out when that is None."""
    captured = {internal.name: external.device
                for external, internal in getattr(graph, "captures", ())
                if getattr(external, "device", "")}
    placed = {}

    def device_of(op) -> str:
        if op.name not in placed:
            resources = [captured.get(t.name) or device_of(t.op) for t in op.inputs
                         if t.dtype == tf.resource]
            resources = [r for r in resources if r]
            own = op.device or (captured.get(op.outputs[0].name) if op.outputs else None)
            device = resources[0] if resources else (own or default_device or "")
            placed[op.name] = _device(device) if device else ""
        return placed[op.name]

    found, seen = [], set()
    needed = needed_ops(graph)
    for op in graph.get_operations():
        if needed is not None and op.name not in needed:
            continue
        destination = device_of(op)
        if not destination:
            continue
        for tensor in op.inputs:
            if tensor.dtype == tf.resource:
                continue
            source = device_of(tensor.op)
            if not source:
                continue
            key = (tensor.name, destination)
            if source == destination or key in seen:
                continue
            seen.add(key)
            shape = tuple(tensor.shape.as_list()) if tensor.shape.rank is not None else None
            elements = tensor.shape.num_elements()  # (None unless the shape is static)
            size = None if elements is None else elements * tensor.dtype.size
            found.append(Crossing(tensor.name, source, destination, shape,
                                  tensor.dtype.name, size))
    return found
