"""tfdist: exact, strategy-agnostic distributed training for Keras 3 models.

>>> import keras, numpy as np, tfdist
>>> strategy = tfdist.make_strategy("mirrored", num_replicas=2)
>>> with strategy.scope():
...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
...     model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
>>> x, y = np.ones((8, 4), "float32"), np.zeros(8, "int64")
>>> history = tfdist.Trainer(model, strategy).fit(x, y, batch_size=4, epochs=2, verbose=0)
>>> len(history.history["loss"])
2

Keras code runs unchanged after ``tfdist.attach(model, strategy)``:
``model.fit(x, y, batch_size=64, validation_split=0.1)``, ``model.evaluate``,
``model.predict`` (see `tfdist.training.keras_fit`).

The lower layers make a hand-written loop exact (docs/guides/custom-loops.md,
strategies/custom_loop.py): `tfdist.data.distribute` (batches as
`tfdist.Batch`), `tfdist.replica.losses.replica_loss`, `tfdist.replica.metrics`
(``update_loss_mean``, ``update_metrics``), `tfdist.replica.gradients`
(``apply_gradients``: exact clipping), `tfdist.replica.accumulation`,
`tfdist.checkpoint` (``TrainingCheckpoint.for_strategy``), `tfdist.loops.host_loop`
(``HostLoop``: k steps per host call) and `tfdist.loops.preemption`.

Names load on first use, so ``import tfdist`` (and the ``tfdist-run``
launcher, which needs no TensorFlow) starts in milliseconds; TensorFlow is
imported by the first name that needs it, without its C++ start-up noise
(`tfdist.import_tensorflow`; ``TFDIST_TF_LOGS=1`` shows it).
"""

from tfdist._internal import lazy, runtime_start, tf_logs

tf_logs.quiet_environment()
# Observes (changes nothing) where TensorFlow's runtime starts, so a
# strategy asked for too late can name the line: `tfdist._internal.runtime_start`.
runtime_start.watch()

__version__ = "0.1.0"

_NAMES = {
    "Batch": "tfdist.data.batch",
    "CheckpointOptions": "tfdist.training.options",
    "DataOptions": "tfdist.training.options",
    "Preempted": "tfdist.cluster.stop_signals",
    "ReportingOptions": "tfdist.training.options",
    "Trainer": "tfdist.training.trainer",
    "attach": "tfdist.training.keras_fit",
    "detach": "tfdist.training.keras_fit",
    "import_tensorflow": "tfdist.tensorflow_import",
    "make_strategy": "tfdist.strategies.registry",
}
_PACKAGES = (
    "checkpoint", "cluster", "communication", "data", "errors", "integrations", "launch", "loops",
    "parallel", "replica", "strategies", "tpu", "training", "versions",
)

__all__ = sorted(list(_NAMES) + list(_PACKAGES))
__getattr__ = lazy.attributes(__name__, _NAMES)
