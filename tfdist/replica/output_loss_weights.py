"""How much each batch counts in a multi-output model's per-output losses
(``<name>_loss``), as Keras reports them on one device.

Keras adds each batch's per-output loss to a mean weighted by the step's
static batch size, or by 1 where the traced step does not know it. Under
Keras 3.15 every batch counts 1 (the mean of batch means). Under Keras 3.16
with ``steps_per_execution=1``, the step is traced first on the first
batch's shape: every batch of that many rows counts its rows and any other
counts 1 (16, 16, 16, 16, 1 for 66 rows in batches of 16). Training and
evaluation each have their first batch, kept from one ``fit`` to the next
as Keras keeps its traced functions
(`tfdist._internal.keras.compiled.output_loss_weighs_first_shape`).

`FirstBatchRows` keeps, in each replica, the first batch's global row
count per phase; `batch_weight` is what this batch counts.
"""

import keras
import tensorflow as tf

from tfdist._internal.keras import compiled as keras_compiled

PHASES = ("train", "test")


class FirstBatchRows:
    """The global row count of the first batch of each phase (0 until it ran).

    Create it inside ``strategy.scope()``: one replica-local copy each, as
    every replica sees the same global count (an empty replica sees 0 and
    waits for a batch with rows; its losses count nothing meanwhile)."""

    def __init__(self, model: keras.Model):
        self._model = model
        self._rows = {phase: tf.Variable(
            0.0, trainable=False, name=f"first_{phase}_batch_rows",
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA) for phase in PHASES}

    def batch_weight(self, phase: str, global_examples) -> tf.Tensor:
        """What the batch of ``global_examples`` rows counts in the
        per-output losses (replica context; records the phase's first batch)."""
        if not keras_compiled.output_loss_weighs_first_shape(self._model):
            return tf.constant(1.0)
        rows = tf.cast(global_examples, tf.float32)
        first = self._rows[phase]
        unset = tf.logical_and(tf.equal(first.read_value(), 0.0), rows > 0)
        with tf.control_dependencies([first.assign(tf.where(unset, rows, first.read_value()))]):
            return tf.where(tf.equal(rows, first.read_value()), rows, 1.0)
