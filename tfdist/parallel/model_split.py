"""When a pipeline's split of a model takes effect: at once, or when Keras
builds the model.

Pipeline stages (``parallel=Pipeline(...)``) place the model's weights on
the stages' devices, so they need them built. A model that Keras builds on
its first batch (a subclassed model, a ``Sequential`` without an
``Input``) has none yet when it is attached: `ModelSplit` then holds the
pipeline back until tfdist builds the model from the first batch's element
spec, as the data-parallel path builds it (`when_built`), and attaches it
to the new weights before the optimizer makes their state. The same
program with the one added line runs where plain ``fit`` runs.

Fully sharded weights still need a built model (``FullySharded`` refuses
one that is not, naming the fix): on a subclassed model of embeddings
built this way the sharded update received whole gradients, so it waits
for that to be found and tested (docs/known-limits.md).

>>> import keras, numpy as np, tfdist
>>> model = keras.Sequential([keras.layers.Dense(4, name="encoder"), keras.layers.Dense(2)])
>>> model.compile(optimizer="adam", loss="mse")                 # no Input: built on the first batch
>>> _ = tfdist.attach(model, parallel=tfdist.parallel.Pipeline(cuts=["encoder"], micro_batches=2))
>>> history = model.fit(np.ones((8, 3), "float32"), np.ones((8, 2), "float32"), verbose=0)
>>> model.built
True
"""

import tensorflow as tf

from tfdist._internal.keras import model_state as keras_model_state


class ModelSplit:
    """A pipeline over one model's layers, attached once the weights exist
    (``parallel``: a `tfdist.parallel.Pipeline` or None)."""

    def __init__(self, parallel, model, strategy: tf.distribute.Strategy):
        self._parallel = parallel
        self._model = model
        self._strategy = strategy
        self._waiting = parallel is not None and not model.built
        if parallel is not None and not self._waiting:
            parallel.attach_to(model, strategy)

    def when_built(self, element_spec) -> None:
        """Before the model's state is first built from ``element_spec``:
        builds its weights and attaches the pipeline that waited for them
        (a no-op when none waited)."""
        if not self._waiting:
            return
        with self._strategy.scope():
            keras_model_state.build_layers(self._model, element_spec)
        self._parallel.attach_to(self._model, self._strategy)
        self._waiting = False
