"""What each replica sees: Keras inputs -> global batches -> distributed batches.

`distribute` turns a dataset of global batches (or a ``dataset_fn``, or an
`EpochDataset`) into a distributed dataset of `tfdist.data.batch.Batch`
records, with an exact policy for the partial final batch
(`tfdist.data.distributed`). `tfdist.data.keras_inputs` reads what
``model.fit`` accepts; `tfdist.data.epochs` makes one pass per epoch;
`tfdist.data.datasets` holds the embedded default dataset (the example
programs' pipelines and models are theirs: strategies/recipes.py).

>>> import tensorflow as tf, tfdist
>>> strategy = tfdist.make_strategy("one_device")
>>> ds = tf.data.Dataset.from_tensor_slices(([[1.0]] * 5, [0] * 5)).batch(4)
>>> [int(b["global_examples"][0]) for b in tfdist.data.distribute(strategy, ds)]
[4, 1]

The policies for a partial last batch (``partial_batch=``), by the rows
of each batch they make:

>>> {policy: [int(b["x"].shape[0]) for b in tfdist.data.apply_partial_batch_policy(ds, policy)]
...  for policy in tfdist.data.PARTIAL_BATCH_POLICIES}
{'exact': [4, 1], 'drop': [4], 'pad': [4, 4]}
"""

from tfdist._internal import lazy

_NAMES = {name: "tfdist.data.distributed" for name in (
    "PARTIAL_BATCH_POLICIES", "EpochDataset", "apply_partial_batch_policy", "distribute",
    "distribute_counted", "epoch_seed", "infer_global_batch_size", "load_tfds", "worker_stream",
)}
__all__ = sorted(_NAMES)
__getattr__ = lazy.attributes(__name__, _NAMES)
