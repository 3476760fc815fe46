"""A step that reads and updates only the rows of an embedding table that
its batch touches, under MirroredStrategy, MultiWorkerMirroredStrategy
and one device (`tfdist.attach`, `tfdist.Trainer`).

A recommender's table has millions of rows and a batch touches a few
thousand. Keras on TensorFlow reads a table whole at every lookup, and
once the optimizer has updated it sparsely that read copies the whole
table; Keras' Adagrad also divides over the whole table. tfdist looks ids
up with a gather on the table's variable and lets Adagrad read the
accumulator's touched rows only
(`tfdist._internal.keras.embedding_rows`): the numbers are Keras' on one
device (the same rows, the same sparse gradient with duplicates kept, the
same element-wise update), and the step's time no longer grows with the
table's rows for SGD (without momentum) and Adagrad (the Recommenders
guide's table).

Unchanged, as Keras runs them: optimizers whose state decays every row
at every step (momentum, Adam, RMSprop, ...; reading only the touched rows
would change their numbers), ids given as a ``tf.SparseTensor``, LoRA and
quantized embeddings, a subclass of ``Embedding`` with its own ``call``,
and ParameterServerStrategy and TPUStrategy.

>>> import keras, numpy as np, tfdist
>>> model = keras.Sequential([keras.Input((3,), dtype="int32"),
...                           keras.layers.Embedding(100, 4), keras.layers.Flatten()])
>>> model.compile(optimizer=keras.optimizers.Adagrad(0.1), loss="mse")
>>> _ = tfdist.attach(model)
>>> history = model.fit(np.array([[1, 2, 2]]), np.ones((1, 12)), verbose=0)
>>> int(np.count_nonzero(model.optimizer.variables[-1].numpy() != 0.1))  # accumulator rows 1, 2
8
"""

import tensorflow as tf

from tfdist._internal.keras import embedding_rows, model_state
from tfdist.replica import static_shapes


def read_only_touched_rows(model, strategy: tf.distribute.Strategy) -> None:
    """Makes ``model``'s plain ``Embedding`` layers look ids up by rows and
    its Adagrad update the touched rows only (module doc). Call before the
    model is split (a pipeline's stage wraps the lookup, fully sharded
    weights read their table through their slices)."""
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy) or \
            static_shapes.is_tpu(strategy):
        return
    embedding_rows.read_rows_in_lookups(model_state.all_layers(model))
    embedding_rows.update_touched_rows(model.optimizer)
