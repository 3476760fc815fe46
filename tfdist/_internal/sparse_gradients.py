"""Sparse gradients combined over replicas into the gradient one device makes.

An ``Embedding``'s gradient is a ``tf.IndexedSlices``: one entry per
lookup, duplicates not summed. Keras 3 optimizers update from that form as
it is, and the form changes the result: Adam, AdamW, RMSprop, Adagrad and
Adamax square each entry (or take its magnitude) before duplicate rows are
summed (``v`` grows by the sum of the entries' squares, not by the square
of their sum). One device's form is
therefore part of what N replicas must reproduce, and it depends on where a
lookup's ids come from:

* ids read from the batch's rows (token ids): one device has one entry per
  row's lookup, so its entries are every replica's, concatenated (what
  ``tf.distribute`` all-reduces IndexedSlices to);
* ids that do not depend on the rows (a position embedding's
  ``ops.arange(length)``, a table read whole): every replica makes the same
  lookup, and one device makes it once, on the whole batch, so its entries
  are the replicas' entries summed (concatenated, each id would count N
  times in the squares).

`combine` gives one device's form for both (`lookup_kind` tells them apart
from the graph the step was traced in, into the functions it calls: an XLA
step's); a gradient that sums lookups of both kinds (one table, both ways)
is split into its parts (`pieces`). Ids the analysis cannot follow (through
control flow) count as rows, the form ``tf.distribute`` gives.
"""

from typing import List

import keras
import tensorflow as tf

ROWS = "rows"
SHARED = "shared"

# Ops whose value is the same on every replica of a step: constants and
# variable reads (mirrored variables hold one value).
_SAME_ON_EVERY_REPLICA = {"Const", "HostConst", "ReadVariableOp", "VarHandleOp", "Rank"}
# Function calls: the walk goes on in the function's body (an XLA step's
# forward and backward pass are one).
_CALLS = {"PartitionedCall", "StatefulPartitionedCall"}
# Ops the walk cannot look into (control flow).
_OPAQUE = {"If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase"}
_WALK_LIMIT = 5000  # ops visited before the walk gives up (and says rows)
_WHOLE = "_tfdist_whole_gradient"


def _is_random(op_type: str) -> bool:
    return any(word in op_type for word in ("Random", "Multinomial", "Rng", "Categorical"))


def _captured(tensor):
    """The tensor a function's input captures (from an enclosing graph, or
    an eager one), or None for an argument."""
    for external, internal in getattr(tensor.graph, "captures", ()):
        if internal is tensor:
            return external
    return None


def _is_eager_constant(tensor) -> bool:
    return (tensor.dtype != tf.resource and not isinstance(tensor, tf.Variable)
            and hasattr(tensor, "numpy") and not hasattr(tensor, "op"))


def _non_batch_dimension(strided_slice) -> bool:
    """``tf.shape(x)[i]`` with a constant ``i`` that is not the batch
    dimension (Keras' ``ops.shape(x)[i]`` for a dimension unknown when
    traced)."""
    shape_op = strided_slice.inputs[0].op
    if shape_op.type != "Shape":
        return False
    begin = tf.get_static_value(strided_slice.inputs[1])
    if begin is None or len(begin) != 1 or strided_slice.get_attr("begin_mask") & 1:
        return False
    if not strided_slice.get_attr("shrink_axis_mask") & 1:
        return False  # (a range of dimensions: may hold the batch's)
    index = int(begin[0])
    if index < 0:
        rank = shape_op.inputs[0].shape.rank
        if rank is None:
            return False
        index += rank
    return index > 0


def _body(call):
    """The graph of the function a call op runs, or None."""
    try:
        return call.graph._get_function(call.get_attr("f").name).graph  # pylint: disable=protected-access
    except (AttributeError, ValueError, KeyError):
        return None


def depends_on_rows(tensor) -> bool:
    """Whether ``tensor`` (traced in a replica's step) may differ between
    replicas: it reads the batch's values, its number of rows, a random
    draw, or something the walk cannot follow. (The shape of a tensor
    counts as the tensor, except a sequence dimension of it: `tf.shape(x)[1]`
    is the same on every replica.) The walk follows function calls into
    their bodies and their arguments back out."""
    stack, seen = [(tensor, ())], set()
    while stack:
        tensor, calls = stack.pop()
        op = tensor.op
        if (op.name, calls) in seen:
            continue
        seen.add((op.name, calls))
        if len(seen) > _WALK_LIMIT or op.type in _OPAQUE or _is_random(op.type):
            return True
        if op.type in _SAME_ON_EVERY_REPLICA or (
                op.type == "StridedSlice" and _non_batch_dimension(op)):
            continue
        if op.type in _CALLS:
            body = _body(op)
            if body is None:
                return True
            stack.append((body.outputs[tensor.value_index], calls + (op,)))
            continue
        if op.type == "Placeholder":
            if calls and tensor.graph is _body(calls[-1]):  # (an argument of the call)
                index = [t.ref() for t in tensor.graph.inputs].index(tensor.ref())
                stack.append((calls[-1].inputs[index], calls[:-1]))
                continue
            outer = _captured(tensor)
            if outer is not None and _is_eager_constant(outer):
                continue
            if outer is None or not hasattr(outer, "op") or outer.dtype == tf.resource:
                return True
            stack.append((outer, calls))  # (a branch's input: its enclosing graph's tensor)
            continue
        if not op.inputs:
            return True
        stack.extend((t, calls) for t in op.inputs)
    return False


def lookup_kind(indices) -> str:
    """`ROWS` or `SHARED` for the ids of a sparse gradient (module doc)."""
    if tf.executing_eagerly() or not hasattr(indices, "op"):
        return ROWS
    return ROWS if depends_on_rows(indices) else SHARED


# Elementwise ops with a scalar that may stand between the concatenation and
# the gradient's values (a loss scale's division, a cast, a replica share).
# (tfdist's finite-gradient agreement adds a scalar 0 or NaN to every entry.)
_BY_SCALAR = {"Mul": tf.multiply, "RealDiv": tf.math.truediv, "Div": tf.math.truediv,
              "AddV2": tf.add, "Add": tf.add, "Sub": tf.subtract}


def _concatenation_below(values):
    """``(concatenated values, rebuild)`` when ``values`` are a concatenation
    along rows, possibly scaled by a scalar or cast after it (``rebuild``
    applies the same to a part), else ``(None, None)``."""
    steps = []
    while values.op.type != "ConcatV2":
        op = values.op
        outer = _captured(values) if op.type == "Placeholder" else None
        if outer is not None and hasattr(outer, "op"):
            values = outer  # (a branch's input: the enclosing graph's tensor)
        elif op.type in ("Identity", "Cast"):
            steps.append((lambda t, dtype=values.dtype: tf.cast(t, dtype)))
            values = op.inputs[0]
        elif op.type in _BY_SCALAR and op.inputs[1].shape.rank == 0:
            steps.append((lambda t, f=_BY_SCALAR[op.type], by=op.inputs[1]: f(t, by)))
            values = op.inputs[0]
        elif op.type == "Mul" and op.inputs[0].shape.rank == 0:
            steps.append((lambda t, by=op.inputs[0]: tf.multiply(by, t)))
            values = op.inputs[1]
        else:
            return None, None
    if tf.get_static_value(values.op.inputs[-1]) != 0:
        return None, None

    def rebuild(part):
        for step in reversed(steps):
            part = step(part)
        return part

    return values, rebuild


def pieces(gradient: tf.IndexedSlices) -> List[tf.IndexedSlices]:
    """The lookups a sparse gradient sums: TensorFlow concatenates the
    entries of several lookups of one table (values and ids alike); each
    part is returned on its own (with whatever scaled the values after the
    concatenation applied to it), else the gradient whole."""
    values, indices = gradient.values, gradient.indices
    if tf.executing_eagerly() or not all(hasattr(t, "op") for t in (values, indices)):
        return [gradient]
    if indices.op.type != "ConcatV2" or tf.get_static_value(indices.op.inputs[-1]) != 0:
        return [gradient]
    concatenated, rebuild = _concatenation_below(values)
    if concatenated is None:
        return [gradient]
    value_parts, index_parts = concatenated.op.inputs[:-1], indices.op.inputs[:-1]
    if len(value_parts) != len(index_parts):
        return [gradient]
    found = []
    for part_values, part_indices in zip(value_parts, index_parts):
        found.extend(pieces(tf.IndexedSlices(rebuild(part_values), part_indices,
                                             gradient.dense_shape)))
    return found


def is_whole(gradient) -> bool:
    """Whether ``gradient`` is already the global batch's (`mark_whole`)."""
    return isinstance(gradient, tf.IndexedSlices) and getattr(gradient.indices, _WHOLE, False)


def mark_whole(gradient: tf.IndexedSlices) -> tf.IndexedSlices:
    """``gradient``, marked as the global batch's on every replica: the
    optimizers' all-reduce passes it on as it is (transforms that keep its
    ids, such as clipping and loss-scale division, keep the mark)."""
    indices = tf.identity(gradient.indices)
    setattr(indices, _WHOLE, True)
    return tf.IndexedSlices(gradient.values, indices, gradient.dense_shape)


def _concatenated(parts: List[tf.IndexedSlices], dense_shape) -> tf.IndexedSlices:
    if len(parts) == 1:
        return tf.IndexedSlices(parts[0].values, parts[0].indices, dense_shape)
    return tf.IndexedSlices(tf.concat([p.values for p in parts], 0),
                            tf.concat([tf.cast(p.indices, tf.int64) for p in parts], 0),
                            dense_shape)


def _identity(values):
    return values


def combine(gradient: tf.IndexedSlices, context, *, send=_identity,
            receive=_identity) -> tf.IndexedSlices:
    """The global batch's sparse gradient, in one device's form, from every
    replica's ``gradient`` (replica context; a collective per piece):
    rows' entries gathered in replica order, shared lookups' summed.
    ``send`` maps each piece's values before the exchange (a scale, a
    16-bit cast), ``receive`` after it. A whole gradient is returned as it is."""
    if is_whole(gradient):
        return gradient
    parts = []
    for piece in pieces(gradient):
        values = send(piece.values)
        if lookup_kind(piece.indices) == SHARED:
            parts.append(tf.IndexedSlices(
                receive(context.all_reduce(tf.distribute.ReduceOp.SUM, values)), piece.indices))
        else:
            parts.append(tf.IndexedSlices(receive(context.all_gather(values, axis=0)),
                                          context.all_gather(piece.indices, axis=0)))
    return _concatenated(parts, gradient.dense_shape)


def combine_micro_batches(gradients: List[tf.IndexedSlices]) -> tf.IndexedSlices:
    """The batch's sparse gradient, in one device's form, from each
    micro-batch's (in order, one replica; `tfdist.parallel.pipeline`): as
    `combine` over replicas, rows' entries concatenated, shared lookups'
    summed."""
    split = [pieces(gradient) for gradient in gradients]
    if len({len(parts) for parts in split}) != 1:
        split = [[gradient] for gradient in gradients]  # (not the same lookups: kept whole)
    parts = []
    for same_lookup in zip(*split):
        if lookup_kind(same_lookup[0].indices) == SHARED:
            parts.append(tf.IndexedSlices(tf.add_n([p.values for p in same_lookup]),
                                          same_lookup[0].indices))
        else:
            parts.append(_concatenated(list(same_lookup), gradients[0].dense_shape))
    return _concatenated(parts, gradients[0].dense_shape)


def split_for_all_reduce(gradient: tf.IndexedSlices, scale: float = 1.0):
    """``gradient`` (times ``scale``) as what a SUM all-reduce turns into one
    device's form: ``(parts, assemble)``, ``parts`` to all-reduce (the rows'
    pieces as IndexedSlices, whose reduction concatenates them; the shared
    lookups' values, dense, summed) and ``assemble(reduced parts)`` the
    gradient. (Split before it is scaled: a scaled gradient no longer shows
    the lookups it sums.)"""
    found = [tf.IndexedSlices(_scaled(piece.values, scale), piece.indices)
             for piece in pieces(gradient)]
    kinds = [lookup_kind(piece.indices) for piece in found]
    parts = [piece.values if kind == SHARED else piece for piece, kind in zip(found, kinds)]

    def assemble(reduced):
        combined = [tf.IndexedSlices(value, piece.indices) if kind == SHARED else value
                    for value, piece, kind in zip(reduced, found, kinds)]
        return _concatenated(combined, gradient.dense_shape)

    return parts, assemble


def flat_slice(gradient: tf.IndexedSlices, start: int, length: int,
               row_shape) -> tf.IndexedSlices:
    """Elements ``start .. start + length`` of a sparse gradient's weight
    (whose rows have shape ``row_shape``), flattened, as a sparse gradient
    of a 1-D slice: one entry per entry's element in the slice (duplicates
    kept, so an optimizer that squares entries squares the same numbers as
    on the whole weight)."""
    row_elements = 1
    for dimension in row_shape:
        row_elements *= int(dimension)
    values = tf.reshape(gradient.values, [-1])
    elements = tf.reshape(
        tf.cast(gradient.indices, tf.int64)[:, None] * row_elements
        + tf.range(row_elements, dtype=tf.int64)[None, :], [-1])
    inside = (elements >= start) & (elements < start + length)
    return tf.IndexedSlices(tf.boolean_mask(values, inside),
                            tf.boolean_mask(elements, inside) - start,
                            tf.constant([length], tf.int64))


def _scaled(values, scale: float):
    return values if scale == 1.0 else values * tf.cast(scale, values.dtype)


def all_reduce_in_one_device_form(all_reduce, optimizer, grads_and_vars, scale: float = 1.0):
    """``all_reduce(optimizer, grads_and_vars)`` (a Keras optimizer's SUM
    all-reduce of gradients) of the gradients times ``scale``, with sparse
    gradients reduced to one device's form: `split_for_all_reduce`'s parts
    go through ``all_reduce``, whole ones (`mark_whole`) pass as they are."""
    context = tf.distribute.get_replica_context()
    grads_and_vars = list(grads_and_vars)
    sent, plans = [], []
    for gradient, variable in grads_and_vars:
        if is_whole(gradient):
            plans.append((gradient, None, 0))
        elif isinstance(gradient, tf.IndexedSlices) and context is not None and (
                context.num_replicas_in_sync > 1):
            parts, assemble = split_for_all_reduce(gradient, scale)
            plans.append((None, assemble, len(parts)))
            sent.extend((part, variable) for part in parts)
        else:
            plans.append((None, None, 1))
            sent.append((gradient if gradient is None or scale == 1.0
                         else scaled_gradient(gradient, scale), variable))
    received = iter(all_reduce(optimizer, sent) if sent else [])
    reduced = []
    for (gradient, variable), (whole, assemble, count) in zip(grads_and_vars, plans):
        if whole is not None:
            reduced.append((whole, variable))
            continue
        results = [next(received)[0] for _ in range(count)]
        reduced.append((assemble(results) if assemble else results[0], variable))
    return reduced


def scaled_gradient(gradient, scale):
    """``gradient * scale`` (dense or IndexedSlices, whose ids are kept, and
    with them a `mark_whole` mark; None stays None). ``scale`` may be a
    tensor."""
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values * tf.cast(scale, gradient.values.dtype),
                                gradient.indices, gradient.dense_shape)
    return gradient * tf.cast(scale, gradient.dtype)


def form_matters(optimizer) -> bool:
    """Whether ``optimizer``'s update depends on a sparse gradient's form
    (entries, duplicates not summed) beyond the gradient's sum: Adam,
    AdamW, Adamax, RMSprop, Adagrad and the others that square entries or
    take their magnitude. SGD (with or without momentum) and Lion, whose
    updates are linear in the gradient until it is summed, do not; a
    LossScaleOptimizer is judged by its inner optimizer."""
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:
        return form_matters(inner)
    return not isinstance(optimizer, (keras.optimizers.SGD, keras.optimizers.Lion))
