"""The outer loop and the Keras surface: ``Trainer`` (``fit`` / ``evaluate``
/ ``predict``, cadence, checkpoints, logs), `tfdist.training.keras_fit`
(``attach``: ``model.fit`` unchanged), `tfdist.training.predict` and
`tfdist.training.progress`."""

from tfdist._internal import lazy

__all__ = []  # public modules: none (tfdist.Trainer, tfdist.attach)
__getattr__ = lazy.attributes(__name__, {})
