"""Keras callbacks as Keras' own ``fit`` drives them: the callback list,
the begin / end of training, and which hooks a callback overrides. User:
the Trainer (`tfdist.training`).
Tested with Keras 3.15 and 3.16; `tests/_internal/test_keras_contract.py` pins what it reads.
"""

import keras


_TRAIN_BATCH_HOOKS = ("on_train_batch_begin", "on_batch_begin", "on_train_batch_end",
                      "on_batch_end")


class _CallbackList(keras.callbacks.CallbackList):
    """Keras' ``CallbackList``, whose per-execution training hooks return at
    once when no callback has one (Keras marks the base class's empty hooks
    as default): Keras converts the logs for every call, Python work at
    every execution that no callback reads (figures:
    docs/performance.md#measurements-behind-design-choices)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._train_batch_hooks = _overrides_a_hook(self.callbacks, _TRAIN_BATCH_HOOKS)

    def on_train_batch_begin(self, batch, logs=None):
        if self._train_batch_hooks:
            super().on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch, logs=None):
        if self._train_batch_hooks:
            super().on_train_batch_end(batch, logs)


def callback_list(callbacks, model, add_progbar: bool, **params) -> keras.callbacks.CallbackList:
    """``callbacks`` as Keras' fit makes them: a given ``CallbackList`` is
    used as it is; else one with a ``History`` (and Keras' progress bar)."""
    if isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks
    return _CallbackList(
        callbacks, add_history=True, add_progbar=add_progbar, model=model, **params)


def begin_training(model, callbacks, initial_epoch: int) -> int:
    """``on_train_begin`` as Keras' fit calls it; returns the epoch to
    start at: a callback may set ``model._initial_epoch`` there
    (``BackupAndRestore`` does)."""
    model.stop_training = False
    model._initial_epoch = None
    callbacks.on_train_begin()
    return model._initial_epoch or initial_epoch


def end_training(model, callbacks, epochs: int) -> None:
    """What Keras' fit does after its epochs: an optimizer with
    ``use_ema=True`` writes its moving averages into the weights
    (``finalize_variable_values``), then ``on_train_end``."""
    if isinstance(model.optimizer, keras.optimizers.Optimizer) and epochs > 0:
        model.optimizer.finalize_variable_values(model.trainable_weights)
    callbacks.on_train_end()


def _overrides_a_hook(callbacks, hooks, ignore=()) -> bool:
    """Whether one of ``callbacks`` (not of the ``ignore`` types) overrides
    one of ``hooks``: Keras marks the base class's empty hooks as default."""
    from keras.src.utils import python_utils  # pylint: disable=import-outside-toplevel

    return any(not python_utils.is_default(getattr(callback, hook))
               for callback in callbacks if not isinstance(callback, ignore)
               for hook in hooks)


def has_train_batch_hooks(callbacks: keras.callbacks.CallbackList) -> bool:
    """Whether a callback has a training-batch hook (else the Trainer may
    run the executions between log and save points back to back)."""
    if isinstance(callbacks, _CallbackList):
        return callbacks._train_batch_hooks
    return _overrides_a_hook(callbacks.callbacks, _TRAIN_BATCH_HOOKS)


def wants_batch_logs(callbacks: keras.callbacks.CallbackList) -> bool:
    """Whether a callback needs real logs at every training batch: one that
    overrides a batch-end hook. Keras' progress bar is not one: it shows
    the values of the last batch that had logs, so it does not force a
    read per batch."""
    return _overrides_a_hook(
        callbacks.callbacks, ("on_train_batch_end", "on_batch_end"),
        ignore=(keras.callbacks.ProgbarLogger, keras.callbacks.History))
