"""A model's layers as pipeline stages: each unit (a layer the cuts
name, or one beside them: `tfdist._internal.keras.layer_paths.units`,
nested layers by path) runs on its stage's device, forward and backward, and each stage's passes of a step's
micro-batches run in the schedule's order (`tfdist.parallel.pipeline`).

Every unit's ``call`` is wrapped. Wherever it runs, its ops are
placed on its stage's device (``tf.device``). Inside a pipelined training
step (`StageUnits.micro_batch`) the call also runs as one
``tf.custom_gradient`` whose gradient is computed under the same device:
TensorFlow places a gradient op where ``GradientTape.gradient`` is called,
not with its forward op (tensorflow/tensorflow#33688), so without this a
stage's backward pass would run on the last stage's device.

Each call records where its pass starts and ends: an identity of its
inputs (the start; every op of the layer that reads data waits for it)
and its outputs (the end), per (stage, micro-batch) and direction. Once a
step's micro-batches are traced, `StepTrace.order` makes each stage's
passes run one after the other in the schedule's order
(`tfdist._internal.graph_order.run_after`): the dataflow executor would
otherwise run every forward pass as soon as its input arrives (GPipe's
memory, whatever the schedule). The order never changes a value.
"""

import contextlib
import dataclasses
import functools
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tfdist._internal import graph_order
from tfdist._internal.keras import layer_calls, layer_units
from tfdist._internal.tensorflow import distributed_variables
from tfdist._internal.thread_values import ThreadValue
from tfdist.errors import ConfigurationError
from tfdist.parallel import schedules

_SITE = ThreadValue()  # the pipelined step being traced on this thread (`_Site`)


@dataclasses.dataclass
class _Pass:
    """Where one stage's forward or backward pass of one micro-batch
    starts (tensors made by its first ops) and ends (its results)."""

    starts: List[tf.Tensor] = dataclasses.field(default_factory=list)
    ends: List[tf.Tensor] = dataclasses.field(default_factory=list)


class StepTrace:
    """The passes of one traced training step, by (pipeline, stage, action)."""

    def __init__(self):
        self.passes: Dict[Tuple[int, int, schedules.Action], _Pass] = {}
        # (stage, action) of each pass `order` could not make wait for the
        # stage's previous pass (an edge that would close a cycle)
        self.unordered: List[Tuple[int, schedules.Action]] = []

    def of(self, pipeline: int, stage: int, kind: str, micro_batch: int) -> _Pass:
        return self.passes.setdefault(
            (pipeline, stage, schedules.Action(kind, micro_batch)), _Pass())

    def order(self, orders: Sequence[Sequence[schedules.Action]], pipeline: int = 0) -> int:
        """Makes each device of ``pipeline`` (this replica's) run its passes
        in ``orders`` (one list per device; per stage with one stage per
        device): each pass starts after the device's previous pass ended.
        Returns the ordering edges added.

        An edge that would close a cycle, or that TensorFlow's order of
        stateful ops would contradict (`tfdist._internal.graph_order`),
        cannot be added: the pass is listed in ``unordered`` (the pipeline
        then warns, naming it: never relaxed in silence).
        """
        added = 0
        for device, order in enumerate(orders):
            previous = None
            for action in order:
                stage = action.on_stage(device)
                current = self.passes.get((pipeline, stage, action.pass_))
                if current is None or not current.ends:
                    continue  # (a stage without weights or ops in this direction)
                if previous is not None:
                    with tf.control_dependencies(None):
                        ended = tf.group(*previous.ends)
                    for start in current.starts:
                        if graph_order.run_after(start, ended, exact=True):
                            added += 1
                        elif not _waits_for(start, previous):
                            self.unordered.append((stage, action))
                            break
                previous = current
        return added


def _waits_for(start, previous: _Pass) -> bool:
    """Whether ``start``'s op already runs after every end of ``previous``
    (a control edge added before, or a dataflow path)."""
    return all(graph_order.depends_on(start.op, end.op) for end in previous.ends)


class StageUnits:
    """Wraps the ``call`` of each unit of ``stage_of`` (pairs of a
    `tfdist._internal.keras.layer_paths.Unit` and its stage) to run on
    ``devices[pipeline][stage mod p]`` (module doc): ``devices`` has one
    list of p devices per local replica (one per stage, or one per v
    stages: `tfdist.parallel.schedules`); each replica's calls run on its
    own pipeline's (evaluation and prediction too)."""

    def __init__(self, devices: Sequence[Sequence[str]], stage_of: Sequence[tuple]):
        self.devices = [list(stages) for stages in devices]
        self.stage_of = list(stage_of)

    def wrap(self) -> None:
        for unit, stage in self.stage_of:
            layer_units.wrap_call(unit.layer, "stage", functools.partial(
                self._stage_call, layer=unit.layer, stage=stage))

    @staticmethod
    @contextlib.contextmanager
    def micro_batch(trace: StepTrace, index: int, pipeline: int = 0, weights=None,
                    data=()):
        """Within this block, the layers' calls are micro-batch ``index``'s
        passes of ``pipeline`` in a pipelined training step traced into
        ``trace``. ``weights``: the step's gathered fully sharded weights
        (`tfdist.communication.fully_sharded.StepWeights`), which each
        layer's pass reads and gives gradients to. ``data``: the
        micro-batch's input tensors, whose gradients no pass computes (a
        plain step's tape never asks for them either)."""
        with _SITE.set_to(_Site(trace, index, pipeline, weights,
                                frozenset(id(t) for t in tf.nest.flatten(data)))):
            yield

    def _stage_call(self, original, layer, stage: int):
        """``original`` (``layer``'s call) run on its stage's device, as a
        pass of a pipelined step when inside one (`micro_batch`)."""
        def call(*args, **kwargs):
            site = _SITE.get()
            pipeline = distributed_variables.local_replica() if site is None else site.pipeline
            devices = self.devices[pipeline]
            device = devices[stage % len(devices)]
            with tf.device(device):
                if site is None or tf.executing_eagerly():
                    return original(*args, **kwargs)
                return _run_stage_pass(original, layer, args, kwargs, stage, device, site)

        return call


@dataclasses.dataclass
class _Site:
    """The pipelined step a layer's call is part of: its trace, the
    micro-batch, the replica's pipeline, the step's gathered weights, the
    micro-batch's input tensors."""

    trace: StepTrace
    micro_batch: int
    pipeline: int
    weights: object = None
    data: frozenset = frozenset()  # (ids of the micro-batch's input tensors)


def _run_stage_pass(original, layer, args, kwargs, stage: int, device: str, site: _Site):
    """One layer's call as part of stage ``stage``'s forward pass of
    ``site.micro_batch`` in ``site.pipeline``, its gradient part of the
    backward pass (module doc)."""
    call = layer_calls.LayerCall(args, kwargs)
    if not call.differentiable:
        raise ConfigurationError(
            "Pipeline: a layer called with a sparse or ragged tensor cannot be placed in a "
            "stage; make its input dense (e.g. tf.sparse.to_dense) before the model.")
    forward = site.trace.of(site.pipeline, stage, schedules.FORWARD, site.micro_batch)
    backward = site.trace.of(site.pipeline, stage, schedules.BACKWARD, site.micro_batch)
    # (fully sharded weights gathered for the step: read here, given gradients here)
    read = [] if site.weights is None else site.weights.of_layer(layer)

    def forward_pass(tensors):
        starts = [tf.identity(t) for t in tensors]
        # (the data's gradient: never used, and on the first stage the
        # costliest of a layer's backward products; left out)
        needed = [index for index, t in enumerate(tensors) if id(t) not in site.data]
        forward.starts += starts
        with tf.GradientTape(watch_accessed_variables=True) as tape, \
                (site.weights.read_by(layer) if site.weights is not None
                 else contextlib.nullcontext()):
            tape.watch(starts + read)
            call_args, call_kwargs = call.arguments(starts, with_masks=True)
            result = original(*call_args, **call_kwargs)
        forward.ends += tf.nest.flatten(result)

        def gradient(upstream, variables):
            with tf.device(device):
                arrived = [tf.identity(u) for u in upstream]
                backward.starts += arrived
                computed = tape.gradient(tf.nest.flatten(result),
                                         [starts[i] for i in needed] + read + variables,
                                         output_gradients=arrived,
                                         unconnected_gradients=tf.UnconnectedGradients.ZERO)
                backward.ends += [g.values if isinstance(g, tf.IndexedSlices) else g
                                  for g in computed if g is not None]
            inputs = [None] * len(starts)
            for index, gradient in zip(needed, computed):
                inputs[index] = gradient
            return inputs + list(computed[len(needed):])

        return result, gradient

    return layer_units.run_as_unit(call, forward_pass, extra=read)
