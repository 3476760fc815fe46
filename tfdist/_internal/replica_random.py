"""Independent random draws on every replica.

Keras' random layers (``Dropout``, ``GaussianNoise``, random augmentation
layers) draw from a ``SeedGenerator`` whose state is one variable, mirrored
on every replica: under a strategy each replica reads the same state, so
every replica drew the SAME mask for its rows (measured: identical dropout
masks on 2 replicas). One device draws independent values for every row
of the global batch; correlated masks across replicas are another
regularizer, silently.

While tfdist traces a replica's step (`independent_draws`), each seed
Keras draws is folded with the replica's index in the sync group
(``tf.random.experimental.stateless_fold_in``): replicas draw independent
streams, the generator's state still advances as Keras advances it (and is
saved with the model's variables), so a run is the same from run to run
with the same seed and replica count, and a resumed run continues the
uninterrupted one's draws. Outside tfdist's steps Keras is unchanged.
Installed on first use, never at import.
"""

import contextlib

import tensorflow as tf

from tfdist._internal.keras import patches
from tfdist._internal.once import once
from tfdist._internal.thread_values import ThreadValue

_DRAWING = ThreadValue(default=0)  # depth of `independent_draws` blocks


def _fold_in_replica(draw_seed):
    def draw(seed):
        drawn = draw_seed(seed)
        if not _DRAWING.get():
            return drawn
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync < 2:
            return drawn
        replica = tf.cast(context.replica_id_in_sync_group, tf.int64)
        return tf.random.experimental.stateless_fold_in(tf.cast(drawn, tf.int64), replica)
    return draw


@once
def install() -> None:
    """Wraps the seed draw of Keras' TensorFlow random ops, once per process."""
    patches.wrap_seed_draw(_fold_in_replica)


@contextlib.contextmanager
def independent_draws():
    """Keras random ops traced inside draw per-replica streams (this thread)."""
    install()
    with _DRAWING.deeper():
        yield
