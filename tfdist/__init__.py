"""tfdist: exact, strategy-agnostic distributed training for Keras 3 models.

>>> import tfdist
>>> strategy = tfdist.make_strategy("mirrored", num_replicas=4)
>>> with strategy.scope():
...     model = build_model()
...     model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
...                   metrics=["accuracy"])
>>> history = tfdist.Trainer(model, strategy).fit(train_ds, epochs=3)

The lower layers work on their own in a hand-written loop:
`tfdist.data.distribute`, `tfdist.losses.scaled_loss`, `tfdist.metrics`,
`tfdist.checkpoint`.
"""

from tfdist import checkpoint, cluster, data, losses, metrics, multi_worker
from tfdist.data import EpochDataset, epoch_seed
from tfdist.errors import (
    CheckpointMismatchError,
    ConfigurationError,
    RuntimeAlreadyStartedError,
)
from tfdist.strategy import known_strategies, make_strategy, register_strategy
from tfdist.trainer import Trainer

__version__ = "0.1.0"

__all__ = [
    "CheckpointMismatchError",
    "ConfigurationError",
    "EpochDataset",
    "RuntimeAlreadyStartedError",
    "Trainer",
    "checkpoint",
    "cluster",
    "data",
    "epoch_seed",
    "known_strategies",
    "losses",
    "make_strategy",
    "metrics",
    "register_strategy",
]
