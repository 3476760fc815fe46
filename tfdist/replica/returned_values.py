"""What a model's own ``train_step`` / ``test_step`` returns beside
``model.metrics``: per-row means, reported as one device reports them.

keras.io's knowledge distillation returns ``{"student_loss": ...,
"distillation_loss": ...}`` beside the metrics' results: each a mean over
the batch's rows. On one device Keras reports the last step's returned
value (in the progress bar, ``History`` and callbacks' logs). Under N
replicas each replica returns the mean over its own rows, so tfdist
combines them weighted by rows, ``sum_r(n_r * value_r) / sum_r(n_r)``: the
mean over the global batch, which is one device's value when each value is a
per-row mean (the assumption, stated once in a warning naming the keys). An
empty replica (0 rows) contributes nothing. A value that cannot be combined
so (not a scalar, not a number) is not reported, with a warning naming it.

Keras losses inside the step carry the replica's share of the batch
(`tfdist._internal.replica_share`); a value computed from them is first
taken back to what it is with a share of 1 (`replica_share.unscaled`:
exact for anything affine in those losses, as
``alpha * student_loss + (1 - alpha) * distillation_loss`` is).

Each key gets a `LastStepMean` (two replica-local sums, as Keras metrics
keep theirs, read over all replicas and workers when logs are read), made
when the step is first traced, as Keras builds its compiled metrics.

>>> import tensorflow as tf
>>> kept, refused = split_returned({"student_loss": tf.constant(0.5),
...                                 "logits": tf.zeros([4, 3]), "loss": tf.constant(1.0)},
...                                reported={"loss"})
>>> sorted(kept), refused
(['student_loss'], ['logits'])
"""

from typing import Dict, Iterable, List, Tuple

import keras
import tensorflow as tf


class LastStepMean(keras.metrics.Metric):
    """The last step's value of a per-row mean, combined over replicas by
    their rows; `updated` says whether a step set it since the last reset."""

    def __init__(self, name: str):
        super().__init__(name=name, dtype="float32")
        self.weighted = self.add_variable(shape=(), initializer="zeros", name="weighted")
        self.rows = self.add_variable(shape=(), initializer="zeros", name="rows")
        self.steps = self.add_variable(shape=(), initializer="zeros", name="steps")

    def update_state(self, value, rows):  # pylint: disable=arguments-differ
        """This replica's ``value`` (a mean over its ``rows``) for this step."""
        value = tf.cast(value, tf.float32)
        rows = tf.cast(rows, tf.float32)
        self.weighted.assign(tf.where(rows > 0, value * rows, 0.0))
        self.rows.assign(rows)
        self.steps.assign_add(1.0)

    def result(self):
        return tf.math.divide_no_nan(self.weighted.value, self.rows.value)

    def updated(self):
        """Steps (summed over replicas) that set the value since the last reset."""
        return tf.convert_to_tensor(self.steps.value)


def _flat(logs: dict) -> Dict[str, object]:
    flat = {}
    for key, value in logs.items():
        flat.update(value if isinstance(value, dict) else {key: value})
    return flat


def _combinable(value) -> bool:
    try:
        tensor = tf.convert_to_tensor(value)
    except (TypeError, ValueError):
        return False
    return tensor.shape.rank == 0 and (tensor.dtype.is_floating or tensor.dtype.is_integer)


def split_returned(logs: dict, reported: Iterable[str]) -> Tuple[Dict[str, object], List[str]]:
    """The keys of a step's ``logs`` that ``reported`` (``model.metrics``'
    names) does not cover: ({key: value} that combine as per-row means,
    [keys that cannot]), nested dicts flattened as Keras logs are."""
    reported = set(reported)
    extra = {key: value for key, value in _flat(logs).items() if key not in reported}
    kept = {key: value for key, value in extra.items() if _combinable(value)}
    return kept, sorted(set(extra) - set(kept))


def combined_warning(owner: str, kept: Iterable[str]) -> str:
    """The one warning stating the assumption behind combining ``kept``."""
    return (f"{owner} returns {sorted(kept)} beside `model.metrics`: tfdist reports each as "
            f"the last step's value averaged over the replicas weighted by their rows, which is "
            f"one device's value when it is a mean over the batch's rows (as a batch's loss "
            f"is). A sum, a count or a maximum is not combined right that way: track those with "
            f"a metric (e.g. keras.metrics.Sum) listed in `metrics`.")


def refused_warning(owner: str, refused: Iterable[str]) -> str:
    """The warning naming values that are not reported."""
    return (f"{owner} returns {sorted(refused)}, which are not results of `model.metrics` and "
            f"not scalars: tfdist cannot combine them over replicas, so they are not reported. "
            f"Track them with a metric (e.g. keras.metrics.Mean) listed in `metrics`.")
