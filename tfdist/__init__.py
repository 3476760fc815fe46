"""tfdist: exact, strategy-agnostic distributed training for Keras 3 models.

>>> import tfdist
>>> strategy = tfdist.make_strategy("mirrored", num_replicas=4)
>>> with strategy.scope():
...     model = build_model()
...     model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
...                   metrics=["accuracy"])
>>> history = tfdist.Trainer(model, strategy).fit(train_ds, epochs=3)

Keras code runs unchanged after ``tfdist.attach(model, strategy)``:
``model.fit(x, y, batch_size=64, validation_split=0.1)``, ``model.evaluate``,
``model.predict`` (see `tfdist.keras_fit`).

The lower layers make a hand-written loop exact (README "Custom training
loops", strategies/custom_loop.py): `tfdist.data.distribute` (batches as
`tfdist.Batch`), `tfdist.losses.replica_loss`, `tfdist.metrics`
(``update_loss_mean``, ``update_metrics``), `tfdist.gradients`
(``apply_gradients``: exact clipping), `tfdist.accumulation`,
`tfdist.checkpoint` (``TrainingCheckpoint.for_strategy``), `tfdist.loop`
(``HostLoop``: k steps per host call) and `tfdist.preemption`.

Names load on first use, so ``import tfdist`` (and the ``tfdist-run``
launcher, which needs no TensorFlow) starts in milliseconds; TensorFlow is
imported by the first name that needs it, without its C++ start-up noise
(`tfdist.tf_logs`; ``TFDIST_TF_LOGS=1`` shows it).
"""

from tfdist import tf_logs

tf_logs.quiet_environment()

__version__ = "0.1.0"

_NAMES = {
    "Batch": "tfdist.batch",
    "CheckpointMismatchError": "tfdist.errors",
    "ConfigurationError": "tfdist.errors",
    "RuntimeAlreadyStartedError": "tfdist.errors",
    "EpochDataset": "tfdist.epochs",
    "epoch_seed": "tfdist.epochs",
    "Preempted": "tfdist.preemption",
    "Trainer": "tfdist.trainer",
    "attach": "tfdist.keras_fit",
    "detach": "tfdist.keras_fit",
    "known_strategies": "tfdist.strategy",
    "make_strategy": "tfdist.strategy",
    "register_strategy": "tfdist.strategy",
}
_MODULES = (
    "accumulation", "batch", "cadence", "checkpoint", "cluster", "collectives", "data",
    "datasets", "epochs", "gradients", "keras_fit", "keras_inputs", "launch",
    "local_devices", "loop", "losses", "metrics", "multi_worker", "parameter_server",
    "predict", "preemption", "recipes", "server", "sharded", "static_shapes", "strategy",
    "tf_logs", "tpu",
)

__all__ = sorted(list(_NAMES) + list(_MODULES))


def __getattr__(name):
    if name in _NAMES:
        return getattr(tf_logs.import_module(_NAMES[name]), name)
    if name in _MODULES:
        return tf_logs.import_module(f"tfdist.{name}")
    raise AttributeError(f"module 'tfdist' has no attribute {name!r}")
