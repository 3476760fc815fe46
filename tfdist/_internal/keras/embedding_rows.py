"""Embedding lookups that read only the batch's rows of a table, and an
Adagrad update that reads and writes only the rows a gradient touches.

Keras' ``Embedding.call`` looks ids up with ``ops.take(self.embeddings,
ids)``, which first converts the table to a tensor: a read of the whole
variable. Once an optimizer has updated the table sparsely (a scatter),
TensorFlow keeps the variable in its copy-on-read mode, so that whole read
is a copy of the table at every step: a step's time grows with the
table's rows, not with the ids a batch holds. `read_rows_in_lookups`
makes each ``Embedding`` look its ids up with a gather on the variable
(``ResourceGather``: the rows, nothing else), the same values and the same
sparse gradient (``tf.IndexedSlices``: one row per id, duplicates kept).

Keras' ``Adagrad.update_step`` adds the squared entries of a sparse
gradient to the accumulator in place, but then divides by
``sqrt(accumulator + epsilon)`` computed over the whole table (and checks
it for zeros). `update_touched_rows` computes the same division on the
gathered rows of the accumulator only: the same numbers, element by
element, wherever ``epsilon > 0`` and ``initial_accumulator_value >= 0``
(then no divisor is zero, so Keras' extra indices for zeros and NaNs add
nothing; otherwise Keras' own update runs). Optimizers whose update
changes every row (momentum, Adam, RMSprop: their state decays on every
step) keep Keras' update: reading only the touched rows would change the
numbers.

>>> import keras, numpy as np, tensorflow as tf
>>> layer = keras.layers.Embedding(1000, 4)
>>> read_rows_in_lookups([layer])
>>> @tf.function
... def look_up(ids):
...     return layer(ids)
>>> ops = look_up.get_concrete_function(tf.TensorSpec([2], tf.int32)).graph.get_operations()
>>> sorted({op.type for op in ops} & {"ResourceGather", "ReadVariableOp"})
['ResourceGather']
"""

import functools

import keras
import tensorflow as tf

from tfdist._internal import once
from tfdist._internal.keras import patches, sliced_weights
from tfdist._internal.tensorflow import distributed_variables

_LOOKUP = "_tfdist_rows_lookup"  # (a layer's attribute: its lookup by rows)


def read_rows_in_lookups(layers) -> None:
    """Makes each ``keras.layers.Embedding`` among ``layers`` look its ids
    up by rows (module doc): a subclass too, where its own ``call`` looks
    ids up through ``super().call(ids)`` (keras-rs' ``EmbedReduce``, which
    then applies its combiner). Keras' own lookup still runs where the
    table is not one ordinary variable (a LoRA or quantized layer, a table
    tfdist keeps in slices or shards) or the ids are a
    ``tf.SparseTensor``."""
    _install()
    for layer in layers:
        if isinstance(layer, keras.layers.Embedding) and _LOOKUP not in vars(layer):
            object.__setattr__(layer, _LOOKUP, functools.partial(_by_rows, layer))


def tables_looked_up_by_rows(layers) -> list:
    """The Keras variables of the tables whose lookups `read_rows_in_lookups`
    made, among ``layers``: what a sharding may keep in slices of whole
    rows, looked up where they live (`sliced_weights.rows`). A subclass's
    call that reads its table another way reads it whole, as any weight
    kept in slices is read."""
    return [layer.embeddings for layer in layers
            if isinstance(layer, keras.layers.Embedding) and layer.built
            and _LOOKUP in vars(layer) and isinstance(layer.embeddings, keras.Variable)]


@once.once
def _install() -> None:
    """Routes ``Embedding.call`` (the class's) to the lookup by rows of the
    layers `read_rows_in_lookups` chose; every other layer runs Keras'
    call as it is."""
    def by_layer(keras_call):
        def call(self, inputs, *args, **kwargs):
            lookup = vars(self).get(_LOOKUP)
            if lookup is None:
                return keras_call(self, inputs, *args, **kwargs)
            return lookup(functools.partial(keras_call, self))(inputs, *args, **kwargs)
        return call

    patches.wrap_embedding_call(by_layer)


def _by_rows(layer, keras_call):
    def call(inputs, *args, **kwargs):
        if args or kwargs or isinstance(inputs, tf.SparseTensor) or _computed_table(layer):
            return keras_call(inputs, *args, **kwargs)
        table = _ordinary_table(layer)
        sliced = table is None and sliced_weights.is_sliced(layer.embeddings)
        if table is None and not sliced:
            return keras_call(inputs, *args, **kwargs)
        ids = inputs if inputs.dtype in (tf.int32, tf.int64) else \
            tf.cast(inputs, tf.int32)  # (as Keras' call casts them)
        rows = layer.embeddings.shape[0]

        def wrapped(ids):  # (a negative id counts from the end, as ops.take does)
            return tf.where(ids < 0, ids + tf.cast(rows, ids.dtype), ids)

        if sliced:
            found = _sliced_rows(layer.embeddings, ids, wrapped)
            if found is None:  # (not here: the table read whole, by Keras' call)
                return keras_call(inputs)
        elif isinstance(ids, tf.RaggedTensor):
            found = tf.nn.embedding_lookup(table, ids.with_values(wrapped(ids.values)))
        else:
            found = tf.gather(table, wrapped(ids))
        return tf.cast(found, layer.compute_dtype)

    return call


def _sliced_rows(table, ids, wrapped):
    """The rows of ``ids`` (dense or ragged) of a table kept in slices of
    whole rows, looked up where they live; None where that is not built
    (`sliced_weights.rows`)."""
    flat = ids.values if isinstance(ids, tf.RaggedTensor) else tf.reshape(ids, [-1])
    found = sliced_weights.rows(table, wrapped(flat))
    if found is None:
        return None
    if isinstance(ids, tf.RaggedTensor):
        return ids.with_values(found)
    shaped = tf.reshape(found, tf.concat([tf.shape(ids), tf.shape(found)[1:]], 0))
    shaped.set_shape(ids.shape.concatenate(found.shape[1:]))
    return shaped


def _computed_table(layer) -> bool:
    """Whether ``layer.embeddings`` is computed from its weights (a LoRA
    sum, a quantized table unpacked), not one variable: Keras' lookup
    reads it (the property is not read here: each read computes it)."""
    return bool(getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None)) \
        or not isinstance(vars(layer).get("_embeddings"), keras.Variable)


def _ordinary_table(layer):
    """The TensorFlow variable of ``layer``'s table when it is one ordinary
    variable (under a mirrored strategy: this replica's copy, which a gather
    reads by rows; a gather on the mirrored variable reads it whole); else
    None."""
    table = layer.embeddings
    if sliced_weights.is_sliced(table):
        return None
    value = table.value
    if distributed_variables.is_distributed(value):
        if tf.distribute.in_cross_replica_context():
            return None
        return distributed_variables.running_copy(value)
    return value if isinstance(value, tf.Variable) else None


def update_touched_rows(optimizer) -> None:
    """Makes a ``keras.optimizers.Adagrad`` (or a LossScaleOptimizer's
    inner one; a subclass that keeps its ``update_step``) update a sparse
    gradient's rows reading only them (module doc)."""
    inner = patches.inner_optimizer(optimizer)
    if not isinstance(inner, keras.optimizers.Adagrad) or \
            type(inner).update_step is not keras.optimizers.Adagrad.update_step or \
            patches.has_own_method(inner, "update_step"):
        return
    keras_update_step = inner.update_step

    def update_step(gradient, variable, learning_rate):
        if not (isinstance(gradient, tf.IndexedSlices) and inner.epsilon > 0
                and inner.initial_accumulator_value >= 0):
            return keras_update_step(gradient, variable, learning_rate)
        # pylint: disable-next=protected-access
        accumulator = inner._accumulators[inner._get_variable_index(variable)]
        _add_then_divide_rows(_updated_copy(accumulator, variable),
                              _updated_copy(variable, variable), gradient,
                              learning_rate, inner.epsilon)

    patches.replace_methods_of(inner, {"update_step": update_step})


def _updated_copy(variable, updated):
    """The TensorFlow variable of ``variable`` that this update writes: under a
    mirrored strategy, its copy on ``updated``'s device (the one the
    strategy's ``update`` runs for)."""
    value = variable.value if isinstance(variable, keras.Variable) else variable
    if not isinstance(value, tf.distribute.DistributedValues):
        return value
    device = (updated.value if isinstance(updated, keras.Variable) else updated).device
    for copy in distributed_variables.local_copies(value):
        if copy.device == device:
            return copy
    return value


def _add_then_divide_rows(accumulator, variable, gradient, learning_rate, epsilon) -> None:
    """Keras' Adagrad step on ``gradient``'s rows: the squared entries added
    to the accumulator (duplicates one by one), then each entry times the
    learning rate divided by ``sqrt(accumulator row + epsilon)`` subtracted."""
    dtype = variable.dtype
    values = tf.cast(gradient.values, dtype)
    rate = tf.cast(learning_rate, dtype)
    accumulator.scatter_add(tf.IndexedSlices(tf.square(values), gradient.indices,
                                             gradient.dense_shape))
    rows = tf.gather(accumulator, gradient.indices)  # (after the scatter: the same resource)
    step = tf.divide(tf.multiply(rate, values), tf.sqrt(tf.add(rows, epsilon)))
    variable.scatter_sub(tf.IndexedSlices(step, gradient.indices, gradient.dense_shape))
