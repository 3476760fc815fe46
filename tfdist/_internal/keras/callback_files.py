"""Keras callbacks that write files, under several workers: the chief
writes to the paths the user gave, the other workers to a private
temporary directory removed when training ends (TensorFlow's own
``write_filepath`` pattern). Every worker still runs each save, since
saving may read values that are reduced across workers.

Handled: ``ModelCheckpoint`` (``filepath``), ``CSVLogger`` (``filename``),
``TensorBoard`` (``log_dir``) and ``BackupAndRestore``, which every worker
restores from the user's ``backup_dir`` (read only: the chief alone copies
its ``.bkp`` files) and then saves to its private directory. User: the
Trainer's ``fit`` (``attach``'s too). Reads Keras
3.15's private paths of ``BackupAndRestore`` and ``TensorBoard``;
`tests/_internal/test_keras_contract.py` pins them.

>>> import keras
>>> from tfdist._internal.keras.callback_files import ChiefOnlyFiles
>>> logger = keras.callbacks.CSVLogger("/shared/run/log.csv")
>>> with ChiefOnlyFiles([logger], is_chief=False):
...     logger.filename.startswith("/shared/")
False
>>> logger.filename
'/shared/run/log.csv'
"""

import os
import shutil
import tempfile
from typing import Callable, List

import keras

_BACKUP_PATHS = ("_weights_path", "_training_metadata_path", "_prev_weights_path",
                 "_prev_training_metadata_path")


class ChiefOnlyFiles:
    """On a worker that is not the chief: each file-writing callback writes
    under a private temporary directory until exit, which restores the
    callbacks' paths and removes the directory. On the chief: nothing.
    Made before the callbacks meet the model (Keras' ``CallbackList``)."""

    def __init__(self, callbacks, is_chief: bool):
        """``callbacks``: ``fit``'s argument (a list, a CallbackList or None)."""
        self._undo: List[Callable[[], None]] = []
        self._directory = None
        if is_chief:
            return
        if isinstance(callbacks, keras.callbacks.CallbackList):
            callbacks = callbacks.callbacks
        for number, callback in enumerate(callbacks or []):
            redirect = next(
                (how for kind, how in _REDIRECTS.items() if isinstance(callback, kind)), None)
            if redirect is not None:
                self._undo.append(redirect(callback, self._private(f"{number}")))

    def _private(self, name: str) -> str:
        if self._directory is None:
            self._directory = tempfile.mkdtemp(prefix="tfdist-worker-files-")
        path = os.path.join(self._directory, name)
        os.makedirs(path, exist_ok=True)
        return path

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None


def _model_checkpoint(callback, private: str):
    original = callback.filepath
    callback.filepath = os.path.join(private, os.path.basename(original))

    def undo():
        callback.filepath = original

    return undo


def _csv_logger(callback, private: str):
    original = callback.filename
    callback.filename = os.path.join(private, os.path.basename(original))

    def undo():
        if callback.csv_file is not None and not callback.csv_file.closed:
            callback.csv_file.close()
        callback.filename = original

    return undo


def _tensorboard(callback, private: str):
    """Before the callback list is made: ``set_model`` (called then) writes
    the model's graph into the log directory at once."""
    original = callback.log_dir
    callback.log_dir = private
    callback._log_write_dir = private  # what set_model computes, if it ran already
    callback._train_dir = os.path.join(private, "train")
    callback._val_dir = os.path.join(private, "validation")

    def undo():
        callback.log_dir = original
        callback._log_write_dir = original
        callback._train_dir = os.path.join(original, "train")
        callback._val_dir = os.path.join(original, "validation")

    return undo


def _backup_and_restore(callback, private: str):
    """Restores from the user's directory without writing there (the chief
    copies a ``.bkp`` over a damaged file; this worker reads the ``.bkp``),
    then saves to ``private``."""
    originals = {name: getattr(callback, name) for name in ("backup_dir",) + _BACKUP_PATHS}

    def on_train_begin(logs=None):
        try:
            callback._load_model()
        except OSError:
            if not os.path.exists(callback._prev_weights_path):
                raise
            callback._weights_path = callback._prev_weights_path
            callback._training_metadata_path = callback._prev_training_metadata_path
            callback._load_model()
        callback.backup_dir = private
        for name in _BACKUP_PATHS:
            setattr(callback, name, os.path.join(private, os.path.basename(originals[name])))

    callback.on_train_begin = on_train_begin

    def undo():
        del callback.on_train_begin  # the class's own again
        for name, value in originals.items():
            setattr(callback, name, value)

    return undo


_REDIRECTS = {
    keras.callbacks.ModelCheckpoint: _model_checkpoint,
    keras.callbacks.CSVLogger: _csv_logger,
    keras.callbacks.TensorBoard: _tensorboard,
    keras.callbacks.BackupAndRestore: _backup_and_restore,
}
