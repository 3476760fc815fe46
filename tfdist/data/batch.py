"""The batch record passed between the data layer, the replica step and losses.

A `Batch` names what a replica trains on: features ``x``, targets ``y`` and,
when present, ``sample_weight``, ``mask`` (1.0 real, 0.0 padding) and
``global_examples`` (the global batch's real-example count, one copy per
example, so it splits with the batch and every non-empty replica reads it
without a collective).

tf.data and distributed iterators can not carry ``None`` fields, so inside a
dataset a batch travels as a dict of its present fields (`to_structure`);
`from_structure` turns it back into a `Batch` at the replica step. Nothing
outside this module spells those keys.
"""

import dataclasses
from typing import Any, Optional

import tensorflow as tf

from tfdist._internal.keras import compiled as keras_compiled
from tfdist.errors import ConfigurationError

_FIELDS = ("x", "y", "sample_weight", "mask", "global_examples")


@dataclasses.dataclass(frozen=True)
class Batch:
    """One replica's (or one global) batch; optional fields are None.

    A replica step gets one from each element of `tfdist.data.distribute`
    (``Batch.from_structure(element)``; `tfdist.loops.host_loop.HostLoop`
    does it for you) and reads its fields by name:

    >>> import tensorflow as tf, tfdist
    >>> batch = tfdist.Batch.from_element((tf.ones([3, 2]), tf.constant([0, 1, 1])))
    >>> padded = batch.padded_to(4)            # what partial_batch="pad" does to a last batch
    >>> padded.x.shape.as_list(), padded.mask.numpy().tolist(), float(padded.real_examples())
    ([4, 2], [1.0, 1.0, 1.0, 0.0], 3.0)

    In a dataset it travels as the dict of its present fields; a global
    batch carries its real-example count on every row, which each replica
    reads back from its rows:

    >>> structure = padded.with_global_count().to_structure()
    >>> sorted(structure), structure["global_examples"].numpy().tolist()
    (['global_examples', 'mask', 'x', 'y'], [3.0, 3.0, 3.0, 3.0])
    >>> replica = tfdist.Batch.from_structure(structure)
    >>> int(replica.size()), float(replica.carried_global_examples())
    (4, 3.0)
    >>> weighted = batch.replace(sample_weight=tf.constant([1.0, 2.0, 1.0]))
    >>> even = weighted.padded_to_multiple(2)    # "exact" with avoid_empty_replicas, 2 replicas
    >>> even.sample_weight.numpy().tolist(), even.mask.numpy().tolist()
    ([1.0, 2.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0])
    """

    x: Any
    y: Optional[Any] = None
    sample_weight: Optional[Any] = None
    mask: Optional[tf.Tensor] = None
    global_examples: Optional[tf.Tensor] = None

    @classmethod
    def from_element(cls, element) -> "Batch":
        """From a dataset element ``x``, ``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)``
        (Keras' ``unpack_x_y_sample_weight``)."""
        if not isinstance(element, tuple):
            element = (element,)
        return cls(*element)

    @classmethod
    def from_structure(cls, structure: dict) -> "Batch":
        """From the dict a dataset carries (see `to_structure`)."""
        return cls(**structure)

    def __iter__(self):
        raise ConfigurationError(
            "A tfdist.Batch is not a tuple: read its fields (`batch.x`, `batch.y`, "
            "`batch.sample_weight`, `batch.mask`, `batch.global_examples`) instead of "
            "`x, y = batch`. `batch.mask` (when set) marks padding rows that must not count."
        )

    def to_structure(self) -> dict:
        """The present fields as a dict, for tf.data and ``strategy.run``."""
        values = {name: getattr(self, name) for name in _FIELDS}
        return {name: value for name, value in values.items() if value is not None}

    def replace(self, **changes) -> "Batch":
        """A copy with the fields named in ``changes`` replaced."""
        return dataclasses.replace(self, **changes)

    def size(self) -> tf.Tensor:
        """Rows in the batch (its leading dimension), padding included."""
        return tf.shape(tf.nest.flatten(self.x)[0])[0]

    def real_examples(self) -> tf.Tensor:
        """Rows that are not padding, as float32."""
        if self.mask is not None:
            return tf.reduce_sum(tf.cast(self.mask, tf.float32))
        return tf.cast(self.size(), tf.float32)

    def without_padding(self) -> "Batch":
        """This replica's batch without its padding rows (order kept).

        Padding keeps uneven replica batches the same size and no replica
        empty; masked, it counts in no loss or metric, but a model that
        computes over its whole batch (an activity regularizer, a layer's
        ``add_loss(ops.mean(...))``) would average it in. A replica with no
        real row keeps its first row, masked, so no layer sees 0 rows
        (oneDNN convolutions fail on them). A batch without padding is
        returned as it is (no copy).

        >>> import tensorflow as tf, tfdist
        >>> padded = tfdist.Batch(tf.constant([[1.0], [2.0], [0.0]]), mask=tf.constant([1.0, 1.0, 0.0]))
        >>> padded.without_padding().x.numpy().tolist()
        [[1.0], [2.0]]
        >>> empty = tfdist.Batch(tf.constant([[0.0]]), mask=tf.constant([0.0]))
        >>> empty.without_padding().mask.numpy().tolist()
        [0.0]
        """
        if self.mask is None:
            return self
        real = self.mask > 0
        first = tf.equal(tf.range(tf.size(real)), 0)
        keep = real | (first & tf.logical_not(tf.reduce_any(real)))
        structure = self.to_structure()
        kept = tf.cond(
            tf.reduce_all(real), lambda: structure,
            lambda: tf.nest.map_structure(lambda leaf: tf.boolean_mask(leaf, keep), structure))
        return Batch.from_structure(kept)

    def carried_global_examples(self) -> Optional[tf.Tensor]:
        """The global count the batch carries: 0 on a replica without rows
        (it contributes nothing, so needs no count); None if not carried."""
        if self.global_examples is None:
            return None
        return tf.reduce_sum(self.global_examples[:1])

    def with_global_count(self) -> "Batch":
        """Adds this (global) batch's real-example count as a per-row column."""
        count = self.real_examples()
        return self.replace(global_examples=tf.fill(tf.expand_dims(self.size(), 0), count))

    def padded_to(self, size: int) -> "Batch":
        """Pads every field to ``size`` rows (static) and sets the mask:
        1.0 for this batch's rows (or their old mask), 0.0 for the new ones."""
        count = self.size()
        return self._padded(count, size - count, static_size=size)

    def padded_to_multiple(self, multiple: int) -> "Batch":
        """Pads up to the next multiple of ``multiple`` rows (shapes stay
        dynamic) with a mask; a batch already a multiple gains only the mask."""
        count = self.size()
        missing = (multiple - count % multiple) % multiple
        return self._padded(count, missing, static_size=None)

    def _padded(self, count, missing, static_size):
        def fix(tensor):
            if static_size is None:
                return tensor
            return tf.ensure_shape(tensor, [static_size] + tensor.shape[1:].as_list())

        def pad(tensor):
            # Copies of the first row (zeros if there is none): rows a model
            # computes on as on real ones. Zeros could make a NaN the mask
            # cannot cancel (0 * NaN): ids all 0 under ``mask_zero``, masked
            # out whole, average to 0 / 0.
            first = tf.pad(tensor[:1], [[0, 1 - tf.shape(tensor[:1])[0]]]
                           + [[0, 0]] * (tensor.shape.rank - 1))
            copies = tf.tile(first, tf.concat([[missing], tf.ones([tensor.shape.rank - 1],
                                                                  tf.int32)], 0))
            return fix(tf.concat([tensor, copies], 0))

        def pad_with_zeros(tensor):
            paddings = [[0, missing]] + [[0, 0]] * (tensor.shape.rank - 1)
            return fix(tf.pad(tensor, paddings))

        mask = tf.ones([count]) if self.mask is None else tf.cast(self.mask, tf.float32)
        fields = tf.nest.map_structure(
            pad, self.replace(mask=None, sample_weight=None).to_structure())
        if self.sample_weight is not None:  # (0 on padding, beside the mask: no NaN to fear)
            fields["sample_weight"] = tf.nest.map_structure(pad_with_zeros, self.sample_weight)
        fields["mask"] = fix(tf.concat([mask, tf.zeros([missing])], 0))
        return Batch.from_structure(fields)


def require_batch(batch, function: str) -> Batch:
    """``batch`` if it is a `Batch`; a clear error naming the fix if not."""
    if isinstance(batch, Batch):
        return batch
    if isinstance(batch, dict) and set(batch) <= set(_FIELDS):
        fix = "wrap the dataset element first: `batch = tfdist.Batch.from_structure(element)`"
    else:
        fix = ("pass the `tfdist.Batch` of the step (`tfdist.Batch.from_structure(element)` "
               "for an element of `tfdist.data.distribute`'s dataset)")
    raise ConfigurationError(
        f"`batch` of {function} is a {type(batch).__name__}, not a tfdist.Batch: {fix}.")


def _leaves_with_paths(structure):
    flat = keras_compiled.tree.flatten_with_path(structure)
    return [
        ("/".join(str(p) for p in path) or "<tensor>", leaf) for path, leaf in flat
    ]


_DENSE_FIX = {
    "RaggedTensorSpec": (
        " Pad it (`dataset.map(lambda x, y: (x.to_tensor(), y))`, ids padded with 0) "
        "and make it ragged inside the model (`tf.RaggedTensor.from_tensor(t, padding=0)` "
        "in a layer): docs/guides/recommenders.md."),
    "SparseTensorSpec": (
        " Make it dense (`tf.sparse.to_dense`), or ragged inside the model from padded "
        "ids (`tf.RaggedTensor.from_tensor(t, padding=0)`)."),
}


def validate_element_spec(element_spec, what: str = "dataset") -> None:
    """Checks that elements are batched ``x``, ``(x,)``, ``(x, y)`` or
    ``(x, y, sample_weight)``, as Keras reads them (x-only data serves models
    whose own ``train_step`` needs no targets, e.g. a GAN).

    Raises:
      ConfigurationError: wrong structure, or a component without a batch
        dimension; the message names the component and its shape.
    """
    if not isinstance(element_spec, tuple):
        element_spec = (element_spec,)
    if len(element_spec) not in (1, 2, 3):
        raise ConfigurationError(
            f"The {what} must yield x, (x, y) or (x, y, sample_weight); its element_spec "
            f"is a tuple of {len(element_spec)}: {element_spec}. Map it, e.g. "
            "`ds.map(lambda e: (e['image'], e['label']))`."
        )
    names = ("x", "y", "sample_weight")
    leading_dims = {}
    for name, part in zip(names, element_spec):
        for path, spec in _leaves_with_paths(part):
            if not isinstance(spec, tf.TensorSpec):
                raise ConfigurationError(
                    f"The {what}'s {name} component {path} is a "
                    f"{type(spec).__name__}; tfdist needs dense tensors (it splits, pads "
                    "and masks each batch by rows)." + _DENSE_FIX.get(type(spec).__name__, "")
                )
            if spec.shape.rank == 0:
                raise ConfigurationError(
                    f"The {what}'s {name} component {path} has shape "
                    f"{spec.shape}: it has no batch dimension. Batch the "
                    "dataset, e.g. `ds.batch(global_batch_size)`."
                )
            if spec.shape.rank is not None and spec.shape[0] is not None:
                leading_dims[f"{name}:{path}"] = spec.shape[0]
    if len(set(leading_dims.values())) > 1:
        raise ConfigurationError(
            f"The {what}'s components disagree on the batch dimension "
            f"({leading_dims}); is the dataset batched?"
        )
