"""keras.io "Knowledge Distillation" (its train_step form): a Distiller
model with no ``call()``, its own ``compile`` and ``train_step`` around a
trained teacher and a student, and compiled metrics updated in the step;
Adam.

Changes: the MNIST convnets -> one hidden Dense layer each, 6 features
for the images, temperature 10 -> 3, the teacher not pre-trained (its
weights are fixed either way), epochs 3 -> 2. The step returns
``student_loss`` and ``distillation_loss`` beside the metrics, as the
example does: per-row means of the batch, which tfdist reports as the
row-weighted mean over replicas (one device's value; a warning states it).
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

SOURCE = "https://keras.io/examples/vision/knowledge_distillation/"
FIT = dict(epochs=2)
EVALUATES = False  # (the Distiller has no call(); the example evaluates the student)
WARNS = "returns \\['distillation_loss', 'student_loss'\\] beside `model.metrics`"


class Distiller(keras.Model):
    def __init__(self, student, teacher):
        super().__init__()
        self.teacher = teacher
        self.student = student

    def compile(self, optimizer, metrics, student_loss_fn, distillation_loss_fn,  # pylint: disable=arguments-differ
                alpha=0.1, temperature=3):
        super().compile(optimizer=optimizer, metrics=metrics)
        self.student_loss_fn = student_loss_fn
        self.distillation_loss_fn = distillation_loss_fn
        self.alpha = alpha
        self.temperature = temperature

    def train_step(self, data):
        x, y = data
        teacher_predictions = self.teacher(x, training=False)
        with tf.GradientTape() as tape:
            student_predictions = self.student(x, training=True)
            student_loss = self.student_loss_fn(y, student_predictions)
            distillation_loss = self.distillation_loss_fn(
                tf.nn.softmax(teacher_predictions / self.temperature, axis=1),
                tf.nn.softmax(student_predictions / self.temperature, axis=1),
            ) * self.temperature ** 2
            loss = self.alpha * student_loss + (1 - self.alpha) * distillation_loss
        trainable_vars = self.student.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        self.optimizer.apply_gradients(zip(gradients, trainable_vars))
        for metric in self.metrics:
            if metric.name != "loss":
                metric.update_state(y, student_predictions)
        results = {m.name: m.result() for m in self.metrics}
        results.update({"student_loss": student_loss, "distillation_loss": distillation_loss})
        return results


def build():
    keras.utils.set_random_seed(14)
    teacher = keras.Sequential([keras.Input(shape=(6,)), layers.Dense(16, activation="relu"),
                                layers.Dense(3)], name="teacher")
    student = keras.Sequential([keras.Input(shape=(6,)), layers.Dense(4, activation="relu"),
                                layers.Dense(3)], name="student")
    distiller = Distiller(student=student, teacher=teacher)
    distiller.compile(
        optimizer=keras.optimizers.Adam(),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
        student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        distillation_loss_fn=keras.losses.KLDivergence(),
        alpha=0.1, temperature=3)
    return distiller


def data(examples):
    rng = np.random.RandomState(3)
    x = rng.randn(examples, 6).astype("float32")
    return x, ((x[:, 0] > 0).astype("int64") + (x[:, 1] > 0.5))
