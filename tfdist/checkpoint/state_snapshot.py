"""Replica-local state (metric sums, accumulated gradients) checkpointed
through one-copy snapshots under MultiWorkerMirroredStrategy.

A checkpoint stores a replica-local (``ON_READ``) variable as its value
read across replicas: its total. Under MultiWorkerMirroredStrategy
TensorFlow's saver makes that read eagerly, one collective per variable per
save, each with a new instance key whose record every worker keeps
(figures: docs/reliability.md#memory;
`tfdist._internal.collectives.function` explains the keys; one worker
with several replicas keeps them too). So under
MultiWorkerMirroredStrategy the checkpoint tracks a plain
variable per state variable, under the same name, holding the same total:
`before_save` copies the totals in in one traced function whose collective
keys are fixed, and `after_restore` spreads them back (a ``SUM`` variable's
total is divided over the replicas, as TensorFlow's own restore does).
Checkpoints keep the same names and values, so they restore under any
strategy either way.
"""

from typing import Dict

import tensorflow as tf

from tfdist._internal import collectives


def _replica_local(variable) -> bool:
    return (isinstance(variable, tf.distribute.DistributedValues)
            and variable.synchronization == tf.VariableSynchronization.ON_READ)


class TotalsSnapshot:
    """What a checkpoint tracks for ``variables`` (``{name: variable}``)."""

    def __init__(self, variables: Dict[str, tf.Variable]):
        self._pairs = []
        self.tracked = dict(variables)
        for name, variable in variables.items():
            strategy = getattr(variable, "distribute_strategy", None)
            if (_replica_local(variable) and strategy is not None
                    and collectives.uses_instance_keys(strategy)):
                with tf.init_scope():
                    snapshot = tf.Variable(tf.zeros(variable.shape, variable.dtype),
                                           trainable=False, name=f"total_{len(self._pairs)}")
                self._pairs.append((snapshot, variable))
                self.tracked[name] = snapshot
        self._copy_totals = collectives.function(self._copy) if self._pairs else None

    def _copy(self):
        for snapshot, variable in self._pairs:
            snapshot.assign(variable.read_value())  # the total over every replica

    def before_save(self) -> None:
        """Copies every replica-local total into its snapshot (all workers)."""
        if self._copy_totals is not None:
            self._copy_totals()

    def after_restore(self) -> None:
        """Spreads the restored totals over the replicas."""
        for snapshot, variable in self._pairs:
            variable.assign(snapshot.read_value())
