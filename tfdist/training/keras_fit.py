"""``tfdist.attach(model, strategy)``: the user's Keras code, run exactly by tfdist
(examples: `attach`, `detach`).

After `attach`, the model's ``fit``, ``evaluate`` and ``predict`` take
Keras' arguments and return what Keras returns (a ``History``; a scalar or
list, or a dict with ``return_dict=True``; NumPy arrays in the model's
output structure), but train through a `tfdist.Trainer`, so N replicas
equal one device. The Trainer is made on the first call (the model may be
compiled after `attach`) and again when the model is recompiled.
"""

import dataclasses

import keras
import tensorflow as tf

from tfdist._internal import validation
from tfdist._internal.keras import compiled as keras_compiled, patches as keras_patches
from tfdist.data import keras_inputs
from tfdist.errors import ConfigurationError
from tfdist.training.options import ReportingOptions, check_records, refuse_moved_keywords

_ATTACHMENT = "_tfdist_attachment"
_METHODS = ("fit", "evaluate", "predict", "train_on_batch", "test_on_batch",
            "predict_on_batch")


def _callback_list(model, callbacks, verbose, **params):
    return keras.callbacks.CallbackList(
        callbacks, add_history=False, add_progbar=False, model=model,
        verbose=verbose, **params)


class Attachment:
    """The Keras methods of one attached model, and its Trainer."""

    def __init__(self, model, strategy, trainer_options: dict):
        self._model = model
        self._strategy = strategy
        self._options = trainer_options
        self._trainer = None
        self._compiled_with = None

    def trainer(self):
        """The Trainer for the model as it is compiled now."""
        from tfdist.training.trainer import Trainer  # pylint: disable=import-outside-toplevel

        model = self._model
        validation.check_compiled(model)
        key = keras_compiled.compile_identity(model)
        if self._trainer is None or key != self._compiled_with:
            options = dict(self._options)
            # Keras' progress bar, not tfdist's log lines, as model.fit shows.
            options["reporting"] = dataclasses.replace(
                options.get("reporting") or ReportingOptions(), keras_progress_bar=True)
            self._trainer = Trainer(model, self._strategy, **options)
            self._compiled_with = key
        return self._trainer

    # The signatures are Keras 3's (keras.Model.fit / evaluate / predict).

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto",
            callbacks=None, validation_split=0.0, validation_data=None, shuffle=True,
            class_weight=None, sample_weight=None, initial_epoch=0, steps_per_epoch=None,
            validation_steps=None, validation_batch_size=None, validation_freq=1):
        """Keras ``fit``, exact under the attached strategy."""
        return self.trainer().fit(
            x, y, batch_size=batch_size, epochs=epochs, verbose=verbose, callbacks=callbacks,
            validation_split=validation_split, validation_data=validation_data,
            shuffle=shuffle, class_weight=class_weight, sample_weight=sample_weight,
            initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch,
            validation_steps=validation_steps, validation_batch_size=validation_batch_size,
            validation_freq=validation_freq)

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None,
                 steps=None, callbacks=None, return_dict=False, **kwargs):
        """Keras ``evaluate``: a scalar or list (Keras' order), or a dict."""
        if kwargs:
            raise ConfigurationError(
                f"evaluate got arguments tfdist does not know: {sorted(kwargs)}.")
        callback_list = _callback_list(self._model, callbacks, verbose, steps=steps)
        callback_list.on_test_begin()
        logs = self.trainer().evaluate(x, y, batch_size=batch_size,
                                       sample_weight=sample_weight, steps=steps)
        callback_list.on_test_end(logs)
        return self._returned(logs, return_dict)

    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None):
        """Keras ``predict``: every example's output, in order."""
        callback_list = _callback_list(self._model, callbacks, verbose, steps=steps)
        callback_list.on_predict_begin()
        outputs = self.trainer().predict(x, batch_size=batch_size, steps=steps)
        callback_list.on_predict_end()
        return outputs

    def train_on_batch(self, x, y=None, sample_weight=None, class_weight=None,
                       return_dict=False):
        """Keras ``train_on_batch``: one step on this (global) batch."""
        logs = self.trainer().run_one_batch(
            self._one_batch(x, y, sample_weight, class_weight), training=True)
        return self._returned(logs, return_dict)

    def test_on_batch(self, x, y=None, sample_weight=None, return_dict=False):
        """Keras ``test_on_batch``: loss and metrics of this batch."""
        logs = self.trainer().run_one_batch(self._one_batch(x, y, sample_weight),
                                            training=False)
        return self._returned(logs, return_dict)

    def predict_on_batch(self, x):
        """Keras ``predict_on_batch``: the outputs for this batch."""
        return self.predict(x, batch_size=keras_inputs.num_rows(x), verbose=0)

    @staticmethod
    def _one_batch(x, y, sample_weight, class_weight=None):
        if not keras_inputs.is_arrays(x):
            raise ConfigurationError(
                f"`x` for a *_on_batch call must be arrays (one batch), as in Keras; got "
                f"{type(x).__name__}.")
        return keras_inputs.to_training_data(x, y, sample_weight, class_weight=class_weight,
                                             batch_size=keras_inputs.num_rows(x))

    def _returned(self, logs, return_dict):
        return logs if return_dict else keras_compiled.flatten_metrics_in_order(self._model, logs)


def _check_strategy(model, strategy) -> None:
    created_under = getattr(model, "distribute_strategy", None)
    if created_under is not None and created_under is not strategy:
        raise ConfigurationError(
            f"Model {model.name!r} was created under {type(created_under).__name__}, not "
            f"the {type(strategy).__name__} passed to attach. Build (and compile) the "
            "model inside `with strategy.scope():` of the strategy you attach.")
    if model.built:
        if getattr(model, "compiled", False) and model.optimizer is not None:
            validation.check_created_in_scope(model, strategy)
        else:
            for variable in model.variables:
                if not strategy.extended.variable_created_in_scope(getattr(variable, "value", variable)):
                    raise ConfigurationError(
                        f"Variable {variable.path!r} of model {model.name!r} was created "
                        "outside strategy.scope(). Build the model inside `with "
                        "strategy.scope():` before attaching it.")


@refuse_moved_keywords("tfdist.attach")
def attach(model, strategy=None, *, checkpointing=None, input_pipeline=None, reporting=None,
           static_shapes=None, communication=None, parallel=None):
    """Routes ``model.fit`` / ``evaluate`` / ``predict`` through tfdist.

    Args:
      model: a Keras model built under ``strategy.scope()``.
      strategy: the strategy it was built under (default: that one).
      checkpointing: `tfdist.Trainer`'s option of that name, checked now;
        likewise ``input_pipeline`` (its `tfdist.DataOptions` ``seed`` seeds
        ``shuffle=True`` orders), ``reporting``, ``static_shapes``,
        ``communication`` and ``parallel``. ``steps_per_execution`` and
        ``jit_compile`` are read from ``model.compile``, where Keras takes them.

    Returns the model. Raises `ConfigurationError` for a model built outside
    the strategy's scope or under another strategy.

    >>> import keras, numpy as np, tfdist
    >>> strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    >>> with strategy.scope():
    ...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, "softmax")])
    ...     model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy",
    ...                   metrics=["accuracy"])
    >>> model = tfdist.attach(model, strategy)
    >>> x, y = np.ones((10, 3), "float32"), np.zeros((10,), "int64")
    >>> history = model.fit(x, y, batch_size=4, epochs=2, validation_split=0.2, verbose=0)
    >>> sorted(history.history)                 # Keras code, unchanged
    ['accuracy', 'loss', 'val_accuracy', 'val_loss']
    >>> model.predict(x, batch_size=4, verbose=0).shape
    (10, 2)
    """
    if not isinstance(model, keras.Model):
        raise ConfigurationError(f"`model` must be a keras.Model; got {type(model).__name__}.")
    strategy = strategy or getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
    if not isinstance(strategy, tf.distribute.Strategy):
        raise ConfigurationError(
            f"`strategy` must be a tf.distribute.Strategy (e.g. tfdist.make_strategy("
            f"'mirrored')); got {type(strategy).__name__}.")
    _check_strategy(model, strategy)
    check_records(checkpointing=checkpointing, input_pipeline=input_pipeline, reporting=reporting)
    trainer_options = {"checkpointing": checkpointing, "input_pipeline": input_pipeline,
                       "reporting": reporting, "static_shapes": static_shapes,
                       "communication": communication, "parallel": parallel}
    detach(model)
    attachment = Attachment(model, strategy, trainer_options)
    object.__setattr__(model, _ATTACHMENT, attachment)
    keras_patches.replace_methods_of(model, {name: getattr(attachment, name) for name in _METHODS})
    return model


def detach(model):
    """Gives ``model`` back Keras' own ``fit`` / ``evaluate`` / ``predict``.

    >>> import keras, tfdist
    >>> strategy = tfdist.make_strategy("one_device")
    >>> with strategy.scope():
    ...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> tfdist.attach(model, strategy).fit.__self__ is model    # tfdist's fit
    False
    >>> tfdist.detach(model).fit.__self__ is model              # Keras' own again
    True
    """
    if getattr(model, _ATTACHMENT, None) is not None:
        keras_patches.restore_methods_of(model, _METHODS)
        object.__delattr__(model, _ATTACHMENT)
    return model


def attachment_of(model):
    """The model's `Attachment` (its Trainer is ``.trainer()``), or None."""
    return getattr(model, _ATTACHMENT, None)
