"""``predict``: every example's output, in the data's order, on every worker.

Global batches are distributed as for training (a batch that does not split
evenly over the replicas is padded with a mask, so no replica is empty; on
the static-shape path every batch is padded to the full size), each
replica runs the model on its slice, and the slices are concatenated in replica
order, which is the batch's order; padded rows are then dropped by their
mask. On one machine every replica's slice is already local, so the step
returns them and the host concatenates them (no collective); under
MultiWorkerMirroredStrategy ``strategy.gather`` (an all-gather) joins them,
so every worker gets the full result, as Keras users expect of
``model.predict``. The gather joins them in replica order, which is not
the batch's order when each worker has several replicas: TensorFlow cuts a
global batch into one slice per replica and deals them out to the workers
in turn (worker w's i-th replica gets slice ``w + i * workers``), so the
slices are put back in the batch's order (`slice_order`). Under parameter servers the coordinator runs the model
itself, batch by batch (it can read every variable).
"""

import types
from typing import List, Optional

import keras
import numpy as np
import tensorflow as tf

from tfdist import data as data_lib
from tfdist._internal import collectives
from tfdist._internal.keras import compiled as keras_compiled
from tfdist.data import iterator_release
from tfdist.data.batch import Batch
from tfdist.errors import ConfigurationError


def as_prediction_batches(dataset: tf.data.Dataset, what: str = "predict data"):
    """Global batches as ``(x, placeholder y)``: a dataset may yield ``x``,
    ``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)`` (targets are ignored)."""
    spec = dataset.element_spec
    if isinstance(spec, tuple):
        if len(spec) not in (1, 2, 3):
            raise ConfigurationError(
                f"The {what} must yield x, (x,), (x, y) or (x, y, sample_weight); "
                f"its elements have {len(spec)} parts."
            )
        # (x,): an x that is itself a tuple (several inputs) stays one value.
        dataset = dataset.map(lambda *e: (e[0],))

    def with_placeholder(x):
        rows = tf.shape(tf.nest.flatten(x)[0])[0]
        return x, tf.zeros([rows])

    return dataset.map(with_placeholder)


def _gather(strategy, values):
    """``strategy.gather(values, axis=0)``; bfloat16 outputs (a
    ``mixed_bfloat16`` model's last layer) travel as float32, which holds
    every bfloat16 value exactly: collectives have no bfloat16 kernel."""
    if strategy.experimental_local_results(values)[0].dtype != tf.bfloat16:
        return strategy.gather(values, axis=0)
    widened = strategy.run(lambda t: tf.cast(t, tf.float32), args=(values,))
    return tf.cast(strategy.gather(widened, axis=0), tf.bfloat16)


def slice_order(replicas: int, local_replicas: int) -> Optional[List[int]]:
    """For each slice of a global batch, in the batch's order, the replica
    that ran it, when ``replicas`` are spread ``local_replicas`` to a worker
    (module doc); None when replica order is the batch's order.

    >>> slice_order(4, 2)  # worker 0: slices 0 and 2, worker 1: 1 and 3
    [0, 2, 1, 3]
    """
    workers = replicas // local_replicas
    if local_replicas == 1 or workers == 1:
        return None
    return [(index % workers) * local_replicas + index // workers for index in range(replicas)]


def _in_batch_order(gathered: np.ndarray, order: Optional[List[int]]) -> np.ndarray:
    """Equal per-replica slices, joined in replica order, put in ``order``."""
    if order is None:
        return gathered
    slices = gathered.reshape((len(order), -1) + gathered.shape[1:])
    return slices[order].reshape(gathered.shape)


def _concatenate(chunks):
    """Per-batch output structures -> one structure of NumPy arrays."""
    if not chunks:
        raise ConfigurationError("predict got no data: the dataset yielded no batch.")
    return keras_compiled.tree.map_structure(lambda *parts: np.concatenate(parts, axis=0), *chunks)


class Predictor:
    """Runs ``model`` in inference mode over global batches under ``strategy``."""

    def __init__(self, model, strategy: tf.distribute.Strategy, *, coordinator_inline: bool,
                 static_shapes: bool = False):
        self._model = model
        self._strategy = strategy
        self._inline = coordinator_inline
        # Static shapes (TPU): the last batch is padded to the full size.
        self._partial_batch = "pad" if static_shapes else "exact"
        self._gathers = collectives.spans_workers(strategy)
        self._order = (slice_order(strategy.num_replicas_in_sync,
                                   len(strategy.extended.worker_devices))
                       if self._gathers else None)
        self._step = tf.function(self._distributed_step, reduce_retracing=True)
        self._inline_step = tf.function(self._forward, reduce_retracing=True)

    def _forward(self, x):
        """The model's outputs for ``x``: its own ``predict_step`` if it overrides it."""
        if type(self._model).predict_step is not keras.Model.predict_step:
            # As Keras' predict hands it: a lone input as is, else a tuple.
            return self._model.predict_step(x if tf.is_tensor(x) else (x,))
        return self._model(x, training=False)

    def _distributed_step(self, structure):
        strategy = self._strategy

        def replica(structure):
            batch = Batch.from_structure(structure)
            mask = batch.mask if batch.mask is not None else tf.ones([batch.size()])
            return self._forward(batch.x), mask

        outputs, mask = strategy.run(replica, args=(structure,))
        if not self._gathers:  # every slice is on this machine: the host joins them
            local = strategy.experimental_local_results
            return [tf.nest.map_structure(lambda t, i=i: local(t)[i], (outputs, mask))
                    for i in range(strategy.num_replicas_in_sync)]
        return [tf.nest.map_structure(lambda t: _gather(strategy, t), (outputs, mask))]

    def predict(self, dataset: tf.data.Dataset, steps: Optional[int] = None):
        """The model's outputs for every example of ``dataset`` (global
        batches), in order, as NumPy arrays in the model's output structure."""
        dataset = as_prediction_batches(dataset)
        if steps is not None:
            dataset = dataset.take(steps)
        chunks = []
        if self._inline:
            for x, _ in dataset:
                chunks.append(tf.nest.map_structure(np.asarray, self._inline_step(x)))
            return _concatenate(chunks)
        distributed = data_lib.distribute(self._strategy, dataset, avoid_empty_replicas=True,
                                          partial_batch=self._partial_batch)
        # The pass's iterator is freed on the release thread, also when the
        # step fails (freed here, it could stall for up to a minute:
        # `tfdist.data.iterator_release`).
        owner = types.SimpleNamespace(iterator=iter(distributed))
        try:
            for structure in owner.iterator:
                # The replicas' slices (or the one gathered whole) joined in
                # the batch's order (module doc).
                outputs, mask = tf.nest.map_structure(
                    lambda *slices: _in_batch_order(
                        np.concatenate([np.asarray(s) for s in slices], axis=0), self._order),
                    *self._step(structure))
                keep = mask > 0
                chunks.append(tf.nest.map_structure(lambda t: t[keep], outputs))
        finally:
            iterator_release.release(owner, "iterator")
        return _concatenate(chunks)
