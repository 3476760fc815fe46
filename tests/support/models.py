"""Models several tests train: a model's own Keras step (keras.io
"Customizing what happens in fit()") and a ``compute_loss`` override, on
the reference MLP (`tests.support.reference`)."""

import keras
import tensorflow as tf
from keras import ops

from tests.support import reference as ref


class GuideTrainStep(keras.Model):
    """keras.io's custom ``train_step``: compute_loss, optimizer.apply, metrics."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.apply_step_gradients(gradients)
        return metrics_updated(self, loss, y, y_pred)

    def apply_step_gradients(self, gradients):
        self.optimizer.apply(gradients, self.trainable_variables)


class GuideTestStep(keras.Model):
    """A ``test_step`` override that evaluates with its own loss call."""

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        loss = self.compute_loss(y=y, y_pred=y_pred, training=False)
        return metrics_updated(self, loss, y, y_pred)


def metrics_updated(model, loss, y, y_pred) -> dict:
    """keras.io's metric updates at the end of a step, and their results."""
    for metric in model.metrics:
        if metric.name == "loss":
            metric.update_state(loss)
        else:
            metric.update_state(y, y_pred)
    return {m.name: m.result() for m in model.metrics}


class ReturnsBatchValues(GuideTrainStep):
    """keras.io's distillation pattern: the steps return the batch's values
    beside the metrics, a Keras-scaled loss (``compute_loss``'s result, and
    a loss object's) and a plain mean over the rows (``ops.mean``)."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        self.apply_step_gradients(tape.gradient(loss, self.trainable_variables))
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {**{m.name: m.result() for m in self.metrics}, **self.batch_values(x, y, y_pred)}

    def test_step(self, data):
        logs = super().test_step(data)
        x, y = data
        return {**logs, **self.batch_values(x, y, self(x, training=False))}

    def batch_values(self, x, y, y_pred):
        crossentropy = keras.losses.SparseCategoricalCrossentropy()
        return {"batch_loss": 0.5 * crossentropy(y, y_pred) + 1.0,
                "batch_confidence": keras.ops.mean(keras.ops.max(y_pred, axis=-1)),
                "batch_rows": keras.ops.shape(x)[0] * 0 + 7}  # (an integer scalar, constant)


class GuideApplyGradients(GuideTrainStep):
    """The same step, applying with ``optimizer.apply_gradients(zip(...))``."""

    def apply_step_gradients(self, gradients):
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))


class PenaltyLoss(keras.Model):
    """A ``compute_loss`` override adding a weight penalty (Keras' train_step)."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training)
        return loss + 0.05 * ops.sum(ops.square(self.layers[-1].kernel))


def functional_as(cls, seed=1):
    """The reference MLP (`tests.support.reference.build_mlp`) as a ``cls`` model."""
    base = ref.build_mlp(seed)
    return cls(base.inputs, base.outputs)


def compiled_model(cls):
    """`functional_as` compiled: SGD with momentum, sparse crossentropy, accuracy."""
    model = functional_as(cls)
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
