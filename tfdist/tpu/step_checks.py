"""Preflight checks on the training step: trace it at a TPU's static shapes,
walk its ops, and compile it with XLA.

The step traced is tfdist's own (`tfdist.replica.step.forward_backward`, with
batch statistics over real rows), on one core's batch: the per-replica
shapes a ``TPUStrategy`` compiles. Op names carry the Keras layer's name
scope (``functional/my_layer_1/boolean_mask/Where``), which is how a
problem names its layer.

XLA on CPU accepts some ops a TPU program should not have (``Where`` and
``Unique`` compile to bounded dynamic shapes there), so those are found by
op type and by unknown output shapes, and the XLA compile catches the rest.
"""

import re

import tensorflow as tf

from tfdist._internal.keras import (
    batch_statistics as keras_statistics, model_state as keras_model_state)
from tfdist.replica import step
from tfdist.tpu.report import PreflightReport

_WHERE_FIX = ("Keep shapes fixed: weight by a 0/1 mask (`x * tf.cast(cond, x.dtype)`) "
              "or use the three-argument `tf.where(cond, x, y)` instead of selecting rows.")
_UNIQUE_FIX = ("Use fixed-size results, e.g. `tf.math.bincount(ids, minlength=n, "
               "maxlength=n)` or one-hot sums over a known vocabulary.")
_HOST_FIX = ("Write it with TensorFlow ops, or move it into the input pipeline "
             "(tf.data runs on the TPU host).")
DYNAMIC_SHAPE_OPS = {
    "Where": ("tf.where with one argument / tf.boolean_mask", _WHERE_FIX),
    "Unique": ("tf.unique", _UNIQUE_FIX),
    "UniqueV2": ("tf.unique", _UNIQUE_FIX),
    "UniqueWithCounts": ("tf.unique_with_counts", _UNIQUE_FIX),
    "UniqueWithCountsV2": ("tf.unique_with_counts", _UNIQUE_FIX),
    "ListDiff": ("tf.sets / setdiff1d", _UNIQUE_FIX),
}
HOST_ONLY_OPS = {
    "PyFunc": "tf.numpy_function", "PyFuncStateless": "tf.numpy_function",
    "EagerPyFunc": "tf.py_function",
}
_XLA_FIX = ("Replace the op with one XLA compiles (see 'TensorFlow ops available on "
            "Cloud TPU' in the Cloud TPU docs), or compute it in the input pipeline.")


class _Layers:
    """Maps op names to the Keras layer whose name scope made them."""

    def __init__(self, model):
        self._names = {layer.name for layer in keras_model_state.all_layers(model)}

    def layer_of(self, op_name: str):
        """The deepest layer name in the op's name scope, or None."""
        found = None
        for part in op_name.split("/"):
            for candidate in (part, re.sub(r"_\d+$", "", part)):
                if candidate in self._names:
                    found = candidate
                    break
        return found

    def of(self, op_name: str) -> str:
        layer = self.layer_of(op_name)
        return f"layer {layer!r}" if layer else f"op {op_name!r}"


def check_model_dtypes(model, report: PreflightReport) -> None:
    """float64 weights or layer computations: TPUs have no float64."""
    for variable in model.variables:
        if str(variable.dtype) == "float64":
            report.add("float64", f"variable {variable.path!r}", "is float64.",
                       "Build the model with dtype='float32' (or the mixed policy "
                       "'mixed_bfloat16'): `keras.config.set_floatx('float32')`.")
    for layer in keras_model_state.all_layers(model):
        if getattr(layer, "compute_dtype", None) == "float64":
            report.add("float64", f"layer {layer.name!r}", "computes in float64.",
                       "Create the layer with dtype='float32' (or 'mixed_bfloat16').")


def _step_function(model, has_weight):
    """The per-replica step with tensors only as arguments."""

    def traced(x, y, mask, global_examples, *weight):
        with keras_statistics.statistics_over_real_rows(mask):
            result = step.forward_backward(
                model, x, y, weight[0] if has_weight else None, mask, global_examples,
                count_only=True)
        return result.gradients

    return traced


def _per_replica_specs(element_spec, per_replica: int):
    def fix(spec):
        return tf.TensorSpec([per_replica] + spec.shape.as_list()[1:], spec.dtype)

    parts = tf.nest.map_structure(fix, element_spec)
    x, y = parts[0], parts[1]
    extra = (parts[2],) if len(parts) == 3 else ()
    return (x, y, tf.TensorSpec([per_replica], tf.float32),
            tf.TensorSpec([], tf.float32)) + extra


def _build(model, element_spec) -> None:
    """Builds the model's, compiled loss's and optimizer's state, as the
    Trainer does, in the scope the model was created in."""
    strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
    with strategy.scope():
        keras_model_state.build_model_state(model, element_spec)


def _walk_graph(graph, layers: _Layers, report: PreflightReport) -> None:
    """Op types and output shapes of the traced step (nested functions too)."""
    for op in graph.get_operations():
        _check_op(op.type, op.name, [t.dtype for t in op.outputs], layers, report)
        # Shapes are judged in the layers' forward ops; a gradient inherits
        # an unknown shape from the forward op already reported.
        forward = not op.name.startswith("gradient_tape") and layers.layer_of(op.name)
        unknown = [t.shape for t in op.outputs
                   if t.shape.rank is None or None in t.shape.as_list()]
        if forward and unknown and op.type not in DYNAMIC_SHAPE_OPS:
            report.add("dynamic shape", layers.of(op.name),
                       f"op {op.name!r} ({op.type}) has output shape {unknown[0]} "
                       "although every input shape is static.",
                       _WHERE_FIX)
    for function in graph.as_graph_def().library.function:
        for node in function.node_def:
            dtypes = [tf.as_dtype(v.type) for v in node.attr.values() if v.type]
            _check_op(node.op, node.name, dtypes, layers, report)


def _check_op(op_type, name, dtypes, layers: _Layers, report: PreflightReport) -> None:
    where = layers.of(name)
    if op_type in DYNAMIC_SHAPE_OPS:
        api, fix = DYNAMIC_SHAPE_OPS[op_type]
        report.add("dynamic shape", where,
                   f"op {name!r} ({op_type}, from {api}) has a data-dependent output size.",
                   fix)
    elif op_type in HOST_ONLY_OPS:
        report.add("host-only op", where,
                   f"op {name!r} ({op_type}, from {HOST_ONLY_OPS[op_type]}) runs Python "
                   "on the host; a TPU step cannot call it.", _HOST_FIX)
    elif tf.string in dtypes:
        report.add("host-only op", where,
                   f"op {name!r} ({op_type}) works on strings; TPUs have no string ops.",
                   "Turn strings into ids in the input pipeline (StringLookup / "
                   "TextVectorization in `dataset.map`).")
    elif tf.float64 in dtypes and not name.startswith("gradient_tape"):
        report.add("float64", where, f"op {name!r} ({op_type}) computes in float64.",
                   "Compute in float32 (drop the cast to float64).")


def _compile(function, specs, layers: _Layers, report: PreflightReport) -> bool:
    """XLA-compiles the step to HLO (nothing runs); a failure names its node."""
    try:
        tf.function(function, jit_compile=True).experimental_get_compiler_ir(*specs)(
            stage="hlo")
        return True
    except Exception as error:  # pylint: disable=broad-except
        message = " ".join(str(error).split())
        node = re.search(r"\{\{node ([^}]+)\}\}", message)
        op = re.search(r"(?:No registered '|with op )(\w+)", message)
        where = layers.of(node.group(1)) if node else "step"
        if not any(p.where == where for p in report.problems):
            if op and node:
                detail = f"XLA cannot compile op {node.group(1)!r} ({op.group(1)})."
            else:
                detail = f"XLA cannot compile the step: {message[:300]}"
            report.add("XLA", where, detail, _XLA_FIX)
        return False


def _last_line(error) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def check_step(model, element_spec, per_replica: int, report: PreflightReport) -> None:
    """Traces, walks and compiles the per-replica step; fills ``report``."""
    specs = _per_replica_specs(element_spec, per_replica)
    layers = _Layers(model)
    function = _step_function(model, has_weight=len(specs) == 5)
    try:
        _build(model, element_spec)
        graph = tf.function(function).get_concrete_function(*specs).graph
    except Exception as error:  # pylint: disable=broad-except
        report.add("trace", "step",
                   f"the step does not trace at static shapes {specs}: "
                   f"{type(error).__name__}: {_last_line(error)}",
                   "Make the model run on one batch of these shapes on CPU first.")
        return
    _walk_graph(graph, layers, report)
    report.compiled = _compile(function, specs, layers, report)
