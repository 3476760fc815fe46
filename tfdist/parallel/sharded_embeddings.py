"""An ``Embedding`` split over one replica's model devices, in either form
`tfdist.parallel.layouts` reads from a rule on its ``embeddings``:

- ``"vocabulary"`` (``("model", None)``: rows in ranges, device j holds
  rows ``[j*V/k, (j+1)*V/k)``): the ids are sent to every model device,
  each looks up the ids in its range (zeros for the others) and the
  partial vectors are summed once on the first model device; backward,
  the output's gradient is sent to each device, which writes its rows'
  gradient in place (a sparse one: only the ids' rows).
- ``"embedding_columns"`` (``(None, "model")``): each device looks up its
  columns of every id's vector; the parts are joined on the first model
  device and kept (`tfdist.parallel.sharded_layers.SplitActivations`), so
  a ``Dense`` split by rows reading them uses them where they are.

Ids are Keras' (negative ids count from the end, as ``ops.take`` does);
an id outside the vocabulary is an error, as a lookup on one CPU is
(silently zeros would change results). Dense ids only: sparse or ragged
ids are refused.

>>> import numpy as np, tensorflow as tf, tfdist
>>> devices = tfdist.strategies.configure_logical_cpus(2)
>>> table = np.arange(12, dtype="float32").reshape(6, 2)
>>> tables = []
>>> for device, rows in zip(devices, np.split(table, 2)):
...     with tf.device(device):
...         tables.append(tf.Variable(rows))
>>> split = EmbeddingShards("vocabulary", tables, 6, None)
>>> split.lookup(tf.constant([[0, 5, -1]]), "float32").numpy().tolist()
[[[0.0, 1.0], [10.0, 11.0], [10.0, 11.0]]]
"""

import dataclasses
from typing import Optional, Sequence

import keras
import tensorflow as tf

from tfdist._internal.keras import placed_weights
from tfdist.errors import ConfigurationError
from tfdist.parallel import sharded_forms
from tfdist.parallel.sharded_layers import SplitActivations, read_by_form


@dataclasses.dataclass
class EmbeddingShards:
    """One ``Embedding`` layer's table shards and its form (module doc).

    Attributes:
      form: ``"vocabulary"`` or ``"embedding_columns"``.
      tables: the table's shards, in order (each replica's copy on that
        replica's model device).
      vocabulary: the whole table's rows.
      activations: the table column parts are kept in (None: not kept).
    """

    form: str
    tables: Sequence
    vocabulary: int
    activations: Optional[SplitActivations]

    def call(self, layer, inputs):
        """What ``layer`` (an ``Embedding``) returns for ``inputs``, sharded."""
        return self.lookup(inputs, layer.compute_dtype, name=layer.name)

    def lookup(self, ids, dtype, name: str = "embedding"):
        """The vectors of ``ids`` in ``dtype``."""
        if isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
            raise ConfigurationError(
                f"Embedding {name!r} is split over the model axis and got "
                f"{type(ids).__name__} ids: split tables take dense ids (pad them, with "
                "mask_zero=True to mask the padding).")
        tables = [read_by_form(t) for t in self.tables]
        devices = [placed_weights.device_of(t) for t in self.tables]
        ids = tf.convert_to_tensor(ids)
        with tf.device(devices[0]):
            if ids.dtype not in (tf.int32, tf.int64):
                ids = tf.cast(ids, tf.int32)
            ids = tf.where(ids < 0, ids + tf.cast(self.vocabulary, ids.dtype), ids)
        ids = _in_vocabulary(ids, self.vocabulary, devices[0], name)
        if self.form == "embedding_columns":
            parts = [sharded_forms.on_device(device, lambda t=table: _cast(tf.gather(_rows(t), ids),
                                                                           dtype), [])
                     for table, device in zip(tables, devices)]
            if self.activations is None:
                with tf.device(devices[0]):
                    return tf.concat(parts, axis=-1)
            return self.activations.join(parts, -1, devices[0])
        rows = self.vocabulary // len(tables)

        def in_range(table, offset):
            local = ids - tf.cast(offset, ids.dtype)
            inside = tf.logical_and(local >= 0, local < rows)
            vectors = tf.gather(_rows(table), tf.where(inside, local, tf.zeros_like(local)))
            return _cast(vectors * tf.cast(inside, vectors.dtype)[..., None], dtype)

        partials = [sharded_forms.on_device(device, lambda t=table, o=j * rows: in_range(t, o), [])
                    for j, (table, device) in enumerate(zip(tables, devices))]
        with tf.device(devices[0]):
            return tf.add_n(partials)


def _in_vocabulary(ids, vocabulary: int, device: str, name: str):
    """``ids``, or an error naming the layer when one is outside
    ``[0, vocabulary)``: the ids looked up in ``range(vocabulary)`` on a
    CPU (``device``, or its host's), whose gather fails on an index out of
    range ("indices[...] = 20 is not in [0, 16)"), as one CPU's lookup
    does. (A gather, not a ``tf.debugging.assert_*``: TensorFlow runs
    asserts in the order they were traced, whichever replica traced them,
    which with collectives in a replica's step can wait forever:
    `tfdist._internal.state_writes`.)"""
    spec = tf.DeviceSpec.from_string(device)
    if spec.device_type not in (None, "CPU"):
        device = spec.replace(device_type="CPU", device_index=0).to_string()
    with tf.device(device), tf.name_scope(f"{name}_ids_in_vocabulary"):
        return tf.gather(tf.range(vocabulary, dtype=ids.dtype), ids)


def _rows(table):
    """What a lookup gathers rows from: ``table`` (a ``tf.Variable``: only
    the ids' rows are read), or the whole shard a fully sharded table's
    read gathers (`read_by_form`; TensorFlow's gather would read the
    Keras variable's storage, one replica's slice)."""
    return tf.convert_to_tensor(table) if isinstance(table, keras.Variable) else table


def _cast(value: tf.Tensor, dtype) -> tf.Tensor:
    return value if value.dtype == dtype else tf.cast(value, dtype)
