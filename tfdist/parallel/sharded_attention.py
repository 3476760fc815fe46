"""A ``MultiHeadAttention`` split by heads (Megatron-LM's attention): its
query, key and value projections split by columns over the heads (each
model device computes its heads' projections, no communication), the
attention of each device's heads computed on that device, and the output
projection split by rows over the heads (the partial products summed
once). Per direction the layer moves its inputs to each model device
and the partial products back, as one column-then-row pair of ``Dense``
layers does; the heads' queries, keys, values and attention never leave
their devices.

The layout asks for it with Keras' paths: the projections are Keras' own
``EinsumDense`` sublayers (``"<attention>/query/kernel"``, ``.../key/...``,
``.../value/...`` split over their heads dimension, ``(None, "model",
None)``, and ``"<attention>/attention_output/kernel"`` over its first,
``("model", None, None)``). The projections run as
`tfdist.parallel.sharded_layers.KernelShards`; this module replaces the
attention between them (`split_by_heads`), which reads the projections'
parts where they are and returns its own parts, kept for the output
projection. A layer whose query, key and value are not all split the
same way computes its attention whole, on the first model device
(correct, not the Megatron form).

Attention dropout draws its random masks on each device for its heads:
training with it does not draw one device's random numbers (said in a
warning); without dropout, and in evaluation and prediction, the
numbers are one device's.
"""

import warnings
from typing import Sequence

import tensorflow as tf

from tfdist._internal.keras import attention as keras_attention, layer_units
from tfdist.parallel import sharded_forms, sharded_sequence
from tfdist.parallel.sharded_layers import KernelShards, SplitActivations


def split_by_heads(layer, projections: Sequence[KernelShards],
                   activations: SplitActivations) -> None:
    """Runs ``layer`` (a ``MultiHeadAttention`` whose query, key and value
    projections are split as ``projections`` are, by columns alike) by
    heads (module doc): its three projections in one unit per model device
    (so the gradient of an input they share is summed there and sent once),
    its attention per device."""
    if layer.dropout > 0:
        warnings.warn(
            f"MultiHeadAttention {layer.name!r} is split by heads and has dropout="
            f"{layer.dropout}: each model device draws the dropout masks of its heads, so "
            "training does not draw one device's random numbers (evaluation and predict are "
            "exact).", stacklevel=4)
    sublayers = (layer.query_dense, layer.key_dense, layer.value_dense)
    query = projections[0]
    axes = layer.attention_axes
    attended = 1 if axes is None else len(axes)
    scores_axis = -(1 + 2 * attended)  # (scores: batch dims, heads, targets, sources)
    heads_axis = query.form.axis

    def project(call):
        def projected_call(query_input, value, key=None, *args, **kwargs):
            inputs = [query_input, value if key is None else key, value]
            distinct = []
            for tensor in inputs:
                if not any(tensor is seen for seen in distinct):
                    distinct.append(tensor)
            index = [next(i for i, seen in enumerate(distinct) if seen is t) for t in inputs]
            per_device = []
            devices = query.devices()
            gathered = [sharded_sequence.whole_on_each(activations, t, devices)
                        for t in distinct]  # (a sequence split input: whole on each device)
            for j, device in enumerate(devices):
                def three(*tensors, j=j):
                    return tuple(shards.column_part(sublayer, j, tensors[index[n]])
                                 for n, (shards, sublayer) in enumerate(zip(projections,
                                                                            sublayers)))
                per_device.append(sharded_forms.on_device(
                    device, three, [t if g is None else g[j] for t, g in zip(distinct, gathered)]))
            for n, (shards, tensor) in enumerate(zip(projections, inputs)):
                activations.precompute(shards, tensor, [parts[n] for parts in per_device])
            return call(query_input, value, key, *args, **kwargs)
        return projected_call

    def attend(original):
        def compute_attention(q, k, v, *args, **kwargs):
            count = len(query.kernels)
            parts = [activations.parts_of(t, heads_axis, count) for t in (q, k, v)]
            if any(p is None for p in parts):
                return original(q, k, v, *args, **kwargs)
            devices = query.devices()
            results = []
            for device, q_j, k_j, v_j in zip(devices, *parts):
                def heads(*tensors):
                    return tuple(t for t in original(*tensors, *args, **kwargs) if t is not None)
                results.append(sharded_forms.on_device(device, heads, [q_j, k_j, v_j]))
            output = activations.join([r[0] for r in results], heads_axis, devices[0])
            scores = None
            if len(results[0]) > 1:
                with tf.device(devices[0]):
                    scores = tf.concat([r[1] for r in results], axis=scores_axis)
            return output, scores
        return compute_attention

    layer_units.wrap_call(layer, "shard", project)
    keras_attention.replace_compute_attention(layer, attend)
