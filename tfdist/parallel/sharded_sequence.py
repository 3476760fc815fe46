"""Megatron-LM's sequence parallelism on one replica's model devices: a
``"<path>/output"`` rule of a `LayoutMap` that puts the model axis on a
sequence dimension, e.g.

    layout_map["block/norm1/output"] = ("batch", "model", None)

splits that layer's output into chunks of the sequence, chunk i on model
device i, where plain tensor parallelism keeps it whole on the replica's
first model device. Between a row-split layer and the next column-split
one (Megatron's "replicated region": layer norms, residual sums,
dropout), each device then computes and holds only its chunk, so the
activations there take 1/k of the memory on each of k devices instead of
all of it on the first.

What a layer with such a rule runs:

- a ``Dense`` or ``EinsumDense`` split by rows (the output projection of
  an attention split by heads too: its rule on the attention's path or on
  ``".../attention_output"``): its partial products are
  reduce-scattered (`reduce_scatter`): device i sums chunk i of every
  device's product and adds the bias to it. Backward: the chunks'
  gradients are all-gathered to each device;
- a position-wise layer (`POSITION_WISE`: normalizations over the
  features, dropout, activations, merges such as ``Add``): its original
  call on each chunk, on the chunk's device. An input that is not split
  yet is cut on its own device first (`scatter`), once however many
  layers read it.

A layer split by columns reading a split tensor gathers the chunks to
each model device (`gather_to_each`, an all-gather; backward a
reduce-scatter), where plain tensor parallelism sends the whole input from
the first device. Any other layer reads the whole tensor, joined on the
first model device (each chunk sent there once).

A column-then-row pair framed by such rules therefore moves, per
direction, one chunk per pair of devices for each all-gather and each
reduce-scatter, never a weight; a chunk's sums are the same numbers as a
whole one's, so results are one device's (1e-5; the gradient of a
normalization's weights sums the chunks' parts). Chunks divide the
sequence as evenly as they can (``numpy.array_split``'s sizes).
``Dropout`` draws its mask chunk by chunk: training with it does not draw
one device's random numbers (a warning says so).

>>> import numpy as np, tensorflow as tf, tfdist
>>> devices = tfdist.strategies.configure_logical_cpus(2)
>>> products = [tf.constant(np.full((1, 3, 2), j + 1.0, "float32")) for j in range(2)]
>>> chunks = reduce_scatter(products, devices[:2], axis=-2)
>>> [tuple(c.shape) for c in chunks], float(chunks[0][0, 0, 0])
([(1, 2, 2), (1, 1, 2)], 3.0)
>>> [tuple(w.shape) for w in gather_to_each(chunks, devices[:2], axis=-2)]
[(1, 3, 2), (1, 3, 2)]
"""

import warnings
from typing import Callable, Dict, List, Optional, Sequence

import keras
import tensorflow as tf

from tfdist._internal.keras import layer_units
from tfdist._internal.tensorflow import placed_gradients
from tfdist.errors import ConfigurationError
from tfdist.parallel import sharded_forms

# Layers computed position by position along every dimension but their
# features' (a sequence split leaves each position's numbers unchanged).
POSITION_WISE = (keras.layers.LayerNormalization, keras.layers.RMSNormalization,
                 keras.layers.Dropout, keras.layers.Activation, keras.layers.ReLU,
                 keras.layers.LeakyReLU, keras.layers.ELU, keras.layers.Identity,
                 keras.layers.Add, keras.layers.Subtract, keras.layers.Multiply,
                 keras.layers.Average, keras.layers.Maximum, keras.layers.Minimum)


def sequence_axis(axes: tuple, data_axis: str, model_axis: str) -> Optional[int]:
    """The dimension (counted from the last, negative) an output rule's
    ``axes`` split over ``model_axis`` when it is a sequence parallel one:
    the batch (dimension 0) on ``data_axis`` or on none, the model axis on
    one dimension between the batch and the features, nothing else split.
    None for any other layout."""
    axes = tuple(axes)
    if len(axes) < 3 or axes[0] not in (None, data_axis) or axes[-1] is not None:
        return None
    middle = axes[1:-1]
    if list(middle).count(model_axis) != 1 or any(
            a is not None and a != model_axis for a in middle):
        return None
    return 1 + middle.index(model_axis) - len(axes)


def chunk_sizes(length: int, count: int) -> List[int]:
    """``length`` positions cut into ``count`` chunks as evenly as they go
    (the first ``length % count`` one longer), as ``numpy.array_split``."""
    return [length // count + (1 if i < length % count else 0) for i in range(count)]


def _sizes(tensor: tf.Tensor, axis: int, count: int, where: str) -> List[int]:
    length = tensor.shape[axis]
    if length is None:
        raise ConfigurationError(
            f"{where}: its sequence dimension ({axis}) has no static length in this step, so "
            "it cannot be cut into chunks; give the model's input a fixed sequence length.")
    if length < count:
        raise ConfigurationError(
            f"{where}: its sequence dimension has {length} positions, fewer than the {count} "
            "model devices it would be split over.")
    return chunk_sizes(length, count)


def scatter(whole: tf.Tensor, devices: Sequence[str], axis: int,
            where: str = "a sequence parallel layer") -> List[tf.Tensor]:
    """``whole`` (on ``devices[0]``) cut along ``axis``, chunk i on
    ``devices[i]`` (each sent once); backward, the chunks' gradients
    joined on ``devices[0]``."""
    sizes = _sizes(whole, axis, len(devices), where)

    @placed_gradients.custom_gradient
    def cut(tensor):
        with tf.device(devices[0]):
            pieces = tf.split(tensor, sizes, axis=axis)
        chunks = []
        for device, piece in zip(devices, pieces):
            with tf.device(device):
                chunks.append(tf.identity(piece))

        def backward(*upstream):
            with tf.device(devices[0]):
                return [tf.concat([tf.zeros_like(c) if g is None else g
                                   for c, g in zip(chunks, upstream)], axis=axis)]
        return chunks, backward

    return list(cut(whole))


def gather_to_each(chunks: Sequence[tf.Tensor], devices: Sequence[str],
                   axis: int) -> List[tf.Tensor]:
    """The whole tensor on each of ``devices`` from its ``chunks`` (chunk i
    on ``devices[i]``): an all-gather, each chunk sent once to each other
    device. Backward: a reduce-scatter of the copies' gradients."""
    sizes = [int(c.shape[axis]) for c in chunks]

    @placed_gradients.custom_gradient
    def gather(*parts):
        copies = []
        for device in devices:
            with tf.device(device):
                copies.append(tf.concat(list(parts), axis=axis))

        def backward(*upstream):
            upstream = [tf.zeros_like(c) if g is None else g for c, g in zip(copies, upstream)]
            return _reduce_scatter(upstream, devices, axis, sizes)
        return copies, backward

    return list(gather(*chunks))


def reduce_scatter(products: Sequence[tf.Tensor], devices: Sequence[str],
                   axis: int) -> List[tf.Tensor]:
    """Chunk i of ``sum(products)`` on ``devices[i]`` (``products[j]`` on
    ``devices[j]``, each cut where it is): a reduce-scatter, each chunk
    sent once to its device. Backward: the chunks' gradients gathered to
    each device (an all-gather)."""
    sizes = _sizes(products[0], axis, len(devices), "a row-split layer's output")

    @placed_gradients.custom_gradient
    def summed(*parts):
        chunks = _reduce_scatter(parts, devices, axis, sizes)

        def backward(*upstream):
            upstream = [tf.zeros_like(c) if g is None else g for c, g in zip(chunks, upstream)]
            return gather_to_each(upstream, devices, axis)
        return chunks, backward

    return list(summed(*products))


def _reduce_scatter(tensors, devices, axis, sizes) -> List[tf.Tensor]:
    pieces = []
    for device, tensor in zip(devices, tensors):
        with tf.device(device):
            pieces.append(tf.split(tensor, sizes, axis=axis))
    chunks = []
    for i, device in enumerate(devices):
        with tf.device(device):
            chunks.append(tf.add_n([own[i] for own in pieces]))
    return chunks


def by_chunks(layer, original: Callable, activations, devices_of: Callable,
              axis: int) -> Callable:
    """``layer``'s call (``original``) made to run chunk by chunk (module
    doc): each input's chunks (kept by ``activations``, or cut by
    `scatter`), the original call on each device's chunks there, the
    output joined on the first device and its chunks kept.
    ``devices_of(tensor)``: the model devices of the replica a whole
    tensor belongs to."""
    where = f"layer {layer.path!r} (sequence parallel)"

    def call(inputs, *args, **kwargs):
        if args or kwargs.get("mask") is not None or any(
                isinstance(v, tf.Tensor) for k, v in kwargs.items() if k != "training"):
            raise ConfigurationError(
                f"{where} is called with more than its inputs (masks or other tensors): a "
                "sequence parallel rule takes layers called on their inputs alone. Drop the "
                "rule.")
        kwargs.pop("mask", None)
        tensors = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        chunked = [chunks_of(activations, t, axis, devices_of, where) for t in tensors]
        devices = chunked[0][1]
        def one(*pieces):
            return original(list(pieces) if isinstance(inputs, (list, tuple)) else pieces[0],
                            **kwargs)
        outputs = on_each(devices, one, [[c[0][j] for c in chunked] for j in range(len(devices))])
        return activations.join_sequence(outputs, axis, devices[0])

    return call


def on_each(devices: Sequence[str], function: Callable, inputs: Sequence[Sequence[tf.Tensor]]):
    """``function(*inputs[j])`` on ``devices[j]`` for each j, each a unit of
    its own (`sharded_forms.on_device`) that reads the weights ``function``
    reads for itself, so each chunk's gradient reaches them (fully sharded
    weights: gathered per chunk)."""
    outputs = []
    for device, own in zip(devices, inputs):
        with layer_units.separate_weight_reads():
            outputs.append(sharded_forms.on_device(device, function, list(own)))
    return outputs


def chunks_of(activations, tensor, axis: int, devices_of: Callable, where: str):
    """``tensor``'s chunks along ``axis`` and their devices: those kept, or
    ``tensor`` cut on its own device (and kept, for the next layer reading
    it)."""
    kept = activations.sequence_of(tensor)
    if kept is not None and kept[1] == axis:
        return kept[0], [c.device for c in kept[0]]
    devices = devices_of(tensor)
    chunks = scatter(tensor, devices, axis, where)
    activations.keep_sequence(tensor, chunks, axis)
    return chunks, devices


def whole_on_each(activations, tensor, devices: Sequence[str]) -> Optional[List[tf.Tensor]]:
    """For a layer split by columns: ``tensor`` whole on each of
    ``devices`` gathered from its chunks when it is split by sequence
    (`gather_to_each`), else None (the layer sends it whole)."""
    kept = activations.sequence_of(tensor)
    if kept is None or len(kept[0]) != len(devices):
        return None
    return gather_to_each(kept[0], devices, kept[1])


def devices_by_first(rows: Sequence[Sequence[str]], canonical: Callable) -> Callable:
    """``devices_of`` for `by_chunks`: the row of model devices whose first
    is the device a tensor was computed on (a replica's device: the
    mesh's first column); the only row when there is one."""
    by_first: Dict[str, List[str]] = {canonical(row[0]): list(row) for row in rows}

    def devices_of(tensor) -> List[str]:
        device = getattr(tensor, "device", "") or ""
        if device and canonical(device) in by_first:
            return by_first[canonical(device)]
        if len(by_first) == 1:
            return next(iter(by_first.values()))
        raise ConfigurationError(
            f"a sequence parallel layer's input is on {device or 'no device'}, which starts "
            f"none of the mesh's rows {[list(r) for r in rows]}: make the strategy over the "
            "mesh's first column.")

    return devices_of


def check_position_wise(layer, path: str, axis: int, rank: int, what) -> None:
    """Refuses a rule on a layer `by_chunks` cannot run (one that is not
    position-wise, a normalization over the split dimension); warns for
    dropout (module doc)."""
    where = f"parallel={what!r}: the rule for {path + '/output'!r} ({type(layer).__name__})"
    if not isinstance(layer, POSITION_WISE):
        raise ConfigurationError(
            f"{where} splits its output by sequence; tfdist runs that for layers split by "
            "rows (a reduce-scatter) and for position-wise layers "
            f"({', '.join(t.__name__ for t in POSITION_WISE)}). Drop the rule.")
    normalized = getattr(layer, "axis", None)
    if isinstance(layer, (keras.layers.LayerNormalization, keras.layers.RMSNormalization)):
        normalized = [normalized] if isinstance(normalized, int) else list(normalized)
        if any((a - rank if a >= 0 else a) == axis for a in normalized):
            raise ConfigurationError(
                f"{where} normalizes over the dimension the rule splits; split another.")
    if isinstance(layer, keras.layers.Dropout) and layer.rate > 0:
        warnings.warn(
            f"{where}: dropout over sequence chunks draws each chunk's mask on its device, so "
            "training does not draw one device's random numbers (evaluation and predict are "
            "exact).", stacklevel=5)


def apply_rules(rules, layers: Dict[str, object], split: Dict[int, object], activations,
                devices_of: Callable, what) -> None:
    """Makes each sequence rule's layer run split by sequence (module doc):
    ``rules`` as (layer path, axes, axis); ``layers`` by path; ``split``:
    the split layers' shards by layer id."""
    for path, axes, axis in rules:
        layer = layers[path]
        target = layer.output_dense if isinstance(layer, keras.layers.MultiHeadAttention) \
            else layer
        shards = split.get(id(target))
        if shards is not None:
            if getattr(getattr(shards, "form", None), "form", None) != "row":
                raise ConfigurationError(
                    f"parallel={what!r}: the rule for {path + '/output'!r} splits by sequence "
                    "the output of a layer whose own split already divides its output (by "
                    "columns, heads or vocabulary): put the rule on the row-split layer that "
                    "follows it, or on a position-wise layer. Drop the rule.")
            shards.sequence_axis = axis
            continue
        check_position_wise(layer, path, axis, len(axes), what)
        layer_units.wrap_call(layer, "sequence", lambda original, layer=layer, axis=axis: (
            by_chunks(layer, original, activations, devices_of, axis)))
