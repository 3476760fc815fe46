"""``tfdist.tpu.preflight(model, data)``: will this step run on a TPU? Asked on CPU
(an example: `preflight`).

It checks the data (static, dense, batched, repeatable, TPU dtypes, a batch
size that suits the cores: `tfdist.tpu.data_checks`), the model's dtypes,
and the real training step traced at one core's static shapes, its op
types and shapes, and its XLA compile (`tfdist.tpu.step_checks`). Nothing
trains: the model's weights are left as they are.
"""

from typing import Optional

from tfdist._internal import validation
from tfdist.data.epochs import EpochDataset
from tfdist.tpu.data_checks import check_batch_size, check_data
from tfdist.tpu.report import PreflightReport
from tfdist.tpu.step_checks import check_model_dtypes, check_step

DEFAULT_NUM_REPLICAS = 8


def preflight(model, data, *, num_replicas: int = DEFAULT_NUM_REPLICAS,
              global_batch_size: Optional[int] = None) -> PreflightReport:
    """Checks ``model`` (compiled Keras model) and ``data`` (a dataset of global
    batches ``(x, y[, sample_weight])``, or an `EpochDataset`, whose first
    epoch is checked) for a TPU with ``num_replicas`` cores.

    Args:
      num_replicas: TPU cores the global batch splits over (8 on a v2-8 or
        v3-8; 4 on a v4-8).
      global_batch_size: the batch size when the dataset's is not static
        (tfdist pads the last partial batch to it).

    >>> import keras, numpy as np, tensorflow as tf, tfdist
    >>> model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(2, "softmax")])
    >>> model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    >>> x, y = np.ones((256, 16), "float32"), np.zeros((256,), "int64")
    >>> data = tf.data.Dataset.from_tensor_slices((x, y)).batch(128, drop_remainder=True)
    >>> report = tfdist.tpu.preflight(model, data, num_replicas=8)    # a v2-8 or v3-8
    >>> report.ok, report.per_replica_batch_size, report.compiled
    (True, 16, True)
    >>> data64 = data.map(lambda x, y: (tf.cast(x, tf.float64), y))
    >>> "float64" in [problem.check for problem in tfdist.tpu.preflight(model, data64).problems]
    True
    """
    validation.check_compiled(model)
    validation.positive_int("num_replicas", num_replicas)
    validation.positive_int("global_batch_size", global_batch_size, allow_none=True)
    report = PreflightReport(num_replicas=num_replicas)
    if isinstance(data, EpochDataset):
        data = data.make_dataset(0)
    check_model_dtypes(model, report)
    found = check_data(data, report, global_batch_size)
    if found is None:
        report.notes.append("The step was not compiled: fix the data problems first.")
        return report
    element_spec, global_batch_size = found
    report.per_replica_batch_size = check_batch_size(global_batch_size, report)
    check_step(model, element_spec, report.per_replica_batch_size, report)
    return report
