"""The tf.data options tfdist sets on a user's dataset, and the user's own
options it keeps.

Two options decide what a distributed step trains on:

* ``experimental_distribute.auto_shard_policy``: how workers split a
  dataset. tfdist's ``shard_policy`` argument ("auto" by default) decides
  it; when the argument is "auto" and the dataset's own options name a
  policy (FILE, DATA or OFF), the dataset's is used. When both are given
  and differ, the argument wins and a warning names both.
* ``deterministic``: a dataset that allows a nondeterministic order
  (``options.deterministic = False``) keeps it on one worker (its order
  then varies from run to run, as it would on one device). Across workers
  every worker reads every global batch and keeps its part, so they must
  read the same order: there tfdist sets ``deterministic = True`` and
  warns, because otherwise examples would be trained twice or not at all.

>>> import tensorflow as tf
>>> ds = tf.data.Dataset.range(8)
>>> own = tf.data.Options()
>>> own.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.FILE
>>> shard_policy("auto", ds.with_options(own))
'file'
>>> shard_policy("auto", ds)
'data'
"""

import warnings

import tensorflow as tf

SHARD_POLICIES = {
    "auto": tf.data.experimental.AutoShardPolicy.AUTO,
    "data": tf.data.experimental.AutoShardPolicy.DATA,
    "file": tf.data.experimental.AutoShardPolicy.FILE,
    "off": tf.data.experimental.AutoShardPolicy.OFF,
}
_NAMES = {policy: name for name, policy in SHARD_POLICIES.items()}


def shard_policy(requested: str, dataset: tf.data.Dataset) -> str:
    """The policy to shard ``dataset`` with: ``requested`` (tfdist's
    ``shard_policy`` argument), or the dataset's own when that is "auto";
    "auto" alone means "data" (every worker keeps its part of each global
    batch: exact)."""
    own = _NAMES.get(dataset.options().experimental_distribute.auto_shard_policy, "auto")
    if requested == "auto":
        return "data" if own == "auto" else own
    if own not in ("auto", requested):
        warnings.warn(
            f"The dataset's options set auto_shard_policy={own.upper()}, but tfdist was given "
            f"shard_policy={requested!r}: tfdist shards by {requested!r}. Pass "
            f"shard_policy='auto' to use the dataset's policy.", stacklevel=3)
    return requested


def input_options(dataset: tf.data.Dataset, policy, *, spans_workers: bool,
                  what: str = "dataset") -> tf.data.Options:
    """Options tfdist applies on top of ``dataset``'s own: ``policy`` (a
    `shard_policy` result; None keeps the dataset's) and ``deterministic``
    as the module docstring says."""
    options = tf.data.Options()
    if policy is not None:
        options.experimental_distribute.auto_shard_policy = SHARD_POLICIES[policy]
    if spans_workers and dataset.options().deterministic is False:
        warnings.warn(
            f"The {what}'s options set deterministic=False; tfdist reads it with "
            f"deterministic=True because every worker reads the same global batches and "
            f"keeps its part, which needs one order on all workers (else examples are "
            f"trained twice or never). Per-op `deterministic=False` arguments (e.g. in "
            f"`map`) still apply: remove them for a multi-worker run.", stacklevel=3)
        options.deterministic = True
    return options
