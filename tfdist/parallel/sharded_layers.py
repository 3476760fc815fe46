"""What a Keras layer split by a `LayoutMap` runs: its ``call`` replaced
by the Megatron-LM form of `tfdist.parallel.sharded_forms` on the
layer's shards (`tfdist.parallel.tensor_parallel` makes the shards and
wraps the layers).

A ``Dense`` or ``EinsumDense`` layer split by columns (a dimension of its
kernel that is one of the output's: an ``EinsumDense`` projecting to
attention heads split by heads) computes its output's parts on the model
devices and returns them joined on the replica's first model device, for
the layers that read the whole output (a ``Dropout``, a replicated
layer). The parts are kept too, in `SplitActivations`, with the axis
they split: a layer split by rows (a contracted dimension) whose input is
exactly that output, split on the same axis, reads the parts where they
are, so a column layer followed by a row layer moves the batch's
activations once per model device and direction, and the join, which
nothing else reads, is not computed (TensorFlow runs only the ops a
step's results need). A row layer given any other input cuts it into its
parts first (one piece sent to each model device).
`tfdist.parallel.sharded_attention` keeps an attention's heads split
between its projections the same way.

>>> import keras, numpy as np, tensorflow as tf, tfdist
>>> devices = tfdist.strategies.configure_logical_cpus(2)
>>> layer = keras.layers.Dense(4, use_bias=False)
>>> layer.build((None, 3))
>>> kernels = []
>>> for device, part in zip(devices, np.split(layer.kernel.numpy(), 2, axis=1)):
...     with tf.device(device):
...         kernels.append(tf.Variable(part))
>>> split = KernelShards(KernelForm.of(layer, 1), kernels, None, SplitActivations())
>>> x = np.ones((2, 3), "float32")
>>> np.allclose(split.call(layer, tf.constant(x)), x @ layer.kernel.numpy())
True
"""

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import keras
import tensorflow as tf

from tfdist._internal.keras import model_state as keras_model_state, placed_weights
from tfdist._internal.keras import sliced_weights
from tfdist.errors import ConfigurationError
from tfdist.parallel import sharded_forms, sharded_sequence


class SplitActivations:
    """The parts of each whole output a split layer returned, by tensor,
    with the axis they split: what a row layer reading that output uses
    instead (module doc). Kept for the last few outputs traced (a step's
    trace reads them at once)."""

    def __init__(self, limit: int = 256):
        self._limit = limit
        self._parts: Dict[int, Tuple[tf.Tensor, List[tf.Tensor], int]] = {}
        self._precomputed: Dict[Tuple[int, int], Tuple[tf.Tensor, List[tf.Tensor]]] = {}
        self._sequences: Dict[int, Tuple[tf.Tensor, List[tf.Tensor], int]] = {}

    def keep(self, whole: tf.Tensor, parts: List[tf.Tensor], axis: int) -> None:
        """Records that ``whole`` joins ``parts`` along ``axis`` (negative:
        counted from the last dimension)."""
        self._remember(self._parts, whole, parts, axis)

    def keep_sequence(self, whole: tf.Tensor, chunks: List[tf.Tensor], axis: int) -> None:
        """Records that ``whole`` is split by sequence into ``chunks``, one
        per model device, along ``axis`` (`tfdist.parallel.sharded_sequence`)."""
        self._remember(self._sequences, whole, chunks, axis)

    def _remember(self, table: dict, whole, parts, axis: int) -> None:
        """``whole``'s ``parts`` along ``axis`` in ``table``, newest last, the
        oldest dropped past the limit."""
        table.pop(id(whole), None)
        table[id(whole)] = (whole, list(parts), axis)
        if len(table) > self._limit:
            del table[next(iter(table))]

    def sequence_of(self, tensor) -> Optional[Tuple[List[tf.Tensor], int]]:
        """``tensor``'s sequence chunks and their axis, when kept; else None."""
        whole, chunks, axis = self._sequences.get(id(tensor), (None, None, None))
        return None if whole is not tensor else (chunks, axis)

    def join_sequence(self, chunks: List[tf.Tensor], axis: int, device: str) -> tf.Tensor:
        """``chunks`` joined along ``axis`` on ``device`` (for the layers that
        read the whole tensor), and kept as its sequence chunks."""
        with tf.device(device):
            whole = tf.concat(chunks, axis=axis)
        self.keep_sequence(whole, chunks, axis)
        return whole

    def parts_of(self, tensor, axis: int, count: int) -> Optional[List[tf.Tensor]]:
        """``tensor``'s ``count`` parts along ``axis`` when a split layer
        returned it so, else None."""
        whole, parts, split_axis = self._parts.get(id(tensor), (None, None, None))
        if whole is not tensor or split_axis != axis or len(parts) != count:
            return None
        return parts

    def precompute(self, layer_shards, inputs, parts: List[tf.Tensor]) -> None:
        """Records ``parts`` as what ``layer_shards`` (a column form)
        computes from ``inputs`` (an attention's projections computed in
        one unit per device), for its next call with ``inputs``."""
        self._precomputed[(id(layer_shards), id(inputs))] = (inputs, list(parts))

    def precomputed(self, layer_shards, inputs) -> Optional[List[tf.Tensor]]:
        """The parts `precompute` recorded for ``layer_shards`` and ``inputs``
        (taken), else None."""
        given, parts = self._precomputed.pop((id(layer_shards), id(inputs)), (None, None))
        return parts if given is inputs else None

    def join(self, parts: List[tf.Tensor], axis: int, device: str) -> tf.Tensor:
        """``parts`` joined along ``axis`` on ``device``, and kept."""
        with tf.device(device):
            whole = tf.concat(parts, axis=axis)
        self.keep(whole, parts, axis)
        return whole


def read_by_form(shard):
    """What a split layer's form reads for ``shard`` (a Keras variable):
    its TensorFlow variable; or, when fully sharded weights keep the shard
    in slices over the data axis (`tfdist.communication.FullySharded`
    with the model axis), the Keras variable itself, whose read inside
    the step gathers the slices where the form reads it (on the shard's
    device, inside the form's unit, which then differentiates the slices)."""
    if sliced_weights.is_sliced(shard):
        return shard
    return keras_model_state.tensorflow_variable(shard)


@dataclasses.dataclass(frozen=True)
class KernelForm:
    """How a ``Dense`` or ``EinsumDense`` layer runs with its kernel split
    along one dimension.

    Attributes:
      form: ``"column"`` (the split dimension is one of the output's) or
        ``"row"`` (contracted).
      axis: the activation axis the split divides, counted from the last
        (negative): the output's (column), the input's (row).
      times: the layer's product of an input and a kernel (shard).
      bias_dimension: the bias' dimension a column split divides (None
        for a row split: the bias is added whole).
    """

    form: str
    axis: int
    times: Optional[Callable]
    bias_dimension: Optional[int]

    @classmethod
    def of(cls, layer, dimension: int, *, where: str = "") -> "KernelForm":
        """The form of ``layer`` with its kernel split along ``dimension``;
        a split it cannot run (an equation whose ellipsis follows the split
        letter, a bias broadcast over the split axis) is refused, naming
        ``where``."""
        where = where or f"layer {layer.name!r}"
        if isinstance(layer, keras.layers.EinsumDense):
            inputs, rest = layer.equation.split(",")
            kernel, output = rest.split("->")
            letter = kernel[dimension]
            form = "column" if letter in output else "row"
            axis = _axis(letter, output if form == "column" else inputs, layer.equation, where)
            times = sharded_forms.einsum(layer.equation)
        else:
            form, axis, times = ("column" if dimension == 1 else "row"), -1, None
        bias_dimension = None
        bias = getattr(layer, "bias", None)
        if form == "column" and bias is not None:
            bias_dimension = len(bias.shape) + axis
            if bias_dimension < 0 or bias.shape[bias_dimension] != layer.kernel.shape[dimension]:
                raise ConfigurationError(
                    f"{where}: its bias {tuple(bias.shape)} is broadcast over the output axis "
                    "the kernel's split divides, so each device would add all of it: not built. "
                    "Split another dimension, or give the layer no bias.")
        return cls(form, axis, times, bias_dimension)


def _axis(letter: str, spec: str, equation: str, where: str) -> int:
    """``letter``'s axis in one side of an einsum ``equation``, from the last."""
    if "..." in spec and spec.index("...") < spec.index(letter):
        return spec.index(letter) - len(spec)
    if "..." in spec:
        raise ConfigurationError(
            f"{where}: equation {equation!r} puts its ellipsis after the split dimension "
            f"{letter!r}; tfdist splits dimensions counted from the last. Split another "
            "dimension, or write the equation with a leading ellipsis.")
    return spec.index(letter) - len(spec)


@dataclasses.dataclass
class KernelShards:
    """One ``Dense`` or ``EinsumDense`` layer's shards and its form.

    Attributes:
      form: how the split runs (`KernelForm`).
      kernels: the kernel's shards, in order (Keras variables, or
        TensorFlow ones; under a strategy each replica's copy on that
        replica's model device).
      biases: the bias' shards (column form), the whole bias (row form:
        a list of one), or None.
      activations: the table split outputs are kept in.
      sequence_axis: for a row form whose output a rule splits by
        sequence, the output's axis it splits (negative): its products are
        reduce-scattered (`tfdist.parallel.sharded_sequence`); else None.
    """

    form: KernelForm
    kernels: Sequence
    biases: Optional[Sequence]
    activations: SplitActivations
    sequence_axis: Optional[int] = None

    def devices(self) -> List[str]:
        """This replica's model devices (where its copies of the shards are)."""
        return [placed_weights.device_of(keras_model_state.tensorflow_variable(k))
                for k in self.kernels]

    def column_part(self, layer, index: int, inputs) -> tf.Tensor:
        """Shard ``index``'s part of ``layer``'s output (column form), where
        it is called (`sharded_forms.column_part`)."""
        bias = None if self.biases is None else self.biases[index]
        return sharded_forms.column_part(
            inputs, read_by_form(self.kernels[index]),
            None if bias is None else read_by_form(bias),
            layer.activation, self.form.times)

    def call(self, layer, inputs, training=None):
        """What ``layer`` computes from ``inputs``, sharded."""
        del training  # (Dense and EinsumDense compute the same in both phases)
        kernels = [read_by_form(k) for k in self.kernels]
        devices = self.devices()
        biases = (None if self.biases is None
                  else [read_by_form(b) for b in self.biases])
        form = self.form
        if form.form == "column":
            parts = self.activations.precomputed(self, inputs)
            if parts is None:
                gathered = sharded_sequence.whole_on_each(self.activations, inputs, devices)
                parts = sharded_forms.column(inputs if gathered is None else gathered, kernels,
                                             biases, devices, layer.activation, times=form.times)
            return self.activations.join(parts, form.axis, devices[0])
        parts = self.activations.parts_of(inputs, form.axis, len(kernels))
        if parts is None:
            with tf.device(devices[0]):
                parts = tf.split(inputs, len(kernels), axis=form.axis)
        bias = None if biases is None else biases[0]
        if self.sequence_axis is None:
            return sharded_forms.row(parts, kernels, bias, devices[0], layer.activation,
                                     devices=devices, times=form.times)
        chunks = sharded_sequence.reduce_scatter(
            sharded_forms.row_products(parts, kernels, devices, form.times), devices,
            self.sequence_axis)
        outputs = sharded_sequence.on_each(
            devices, lambda c: sharded_forms.row_finish(c, bias, layer.activation),
            [[chunk] for chunk in chunks])
        return self.activations.join_sequence(outputs, self.sequence_axis, devices[0])
