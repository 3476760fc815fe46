"""Preflight checks on the training data: what a TPU's static shapes need.

A TPU step is compiled once for fixed shapes, so the data must be dense,
batched, with a known batch size that splits evenly over the cores, in
dtypes the TPU supports, and repeatable (every epoch iterates it again).
"""

import collections.abc
from typing import Optional

import tensorflow as tf

from tfdist._internal.keras import compiled as keras_compiled
from tfdist.tpu.report import PreflightReport

_NAMES = ("x", "y", "sample_weight")


def _components(element_spec):
    for name, part in zip(_NAMES, element_spec):
        for path, spec in keras_compiled.tree.flatten_with_path(part):
            yield f"{name}/" + "/".join(str(p) for p in path) if path else name, spec


def _check_component(where, spec, global_batch_size, report):
    """Checks one component; returns (its static batch size or None,
    whether the step can be traced with it at static shapes)."""
    if isinstance(spec, (tf.RaggedTensorSpec, tf.SparseTensorSpec)):
        report.add("dynamic shape", f"data {where}",
                   f"is a {type(spec).__name__}: rows of different lengths.",
                   "Pad to a fixed length in the input pipeline "
                   "(e.g. `.to_tensor(shape=[None, L])` or `padded_batch`).")
        return None, False
    if not isinstance(spec, tf.TensorSpec):
        report.add("data", f"data {where}", f"is a {type(spec).__name__}.",
                   "Yield dense tensors.")
        return None, False
    if spec.dtype == tf.string:
        report.add("host-only op", f"data {where}",
                   "is a string tensor; TPUs run no string ops.",
                   "Turn strings into ids in the input pipeline (e.g. a "
                   "`keras.layers.StringLookup` or `TextVectorization` in `dataset.map`).")
    if spec.dtype == tf.float64:
        report.add("float64", f"data {where}",
                   "is float64; TPUs have no float64.",
                   "Cast in the input pipeline: `ds.map(lambda x, y: (tf.cast(x, tf.float32), y))`.")
    if spec.shape.rank == 0:
        report.add("unbatched data", f"data {where}",
                   "has no batch dimension (shape ()).",
                   "Batch the dataset: `ds.batch(global_batch_size, drop_remainder=True)`.")
        return None, False
    inner_known = spec.shape.rank is not None and None not in spec.shape.as_list()[1:]
    if not inner_known:
        report.add("dynamic shape", f"data {where}",
                   f"has shape {spec.shape}: a dimension after the batch is unknown.",
                   "Give every example the same shape (pad or crop in the pipeline), "
                   "e.g. `padded_batch(n, padded_shapes=...)` with fixed sizes.")
    batch = spec.shape[0] if spec.shape.rank else None
    if batch is None and global_batch_size is None:
        report.add("dynamic shape", f"data {where}",
                   f"has shape {spec.shape}: no static batch dimension "
                   "(`drop_remainder` missing), so the step's shape is unknown.",
                   "Batch with `ds.batch(n, drop_remainder=True)`, or keep the last "
                   "partial batch and pass `global_batch_size=n` (here and to the "
                   "Trainer): tfdist pads it to n with a mask.")
    return batch, inner_known


def _check_repeatable(dataset: tf.data.Dataset, report: PreflightReport) -> None:
    """Reading the first element twice must work: every epoch re-iterates."""
    for attempt in ("first", "second"):
        if not any(True for _ in dataset.take(1)):
            detail = ("yields nothing." if attempt == "first" else
                      "yields nothing the second time it is iterated (e.g. built "
                      "from a Python generator object that is now exhausted).")
            report.add("not repeatable", "data", f"The dataset {detail}",
                       "Build it so each iteration starts over: "
                       "`tf.data.Dataset.from_generator(make_generator, ...)` with a "
                       "function, not a generator object; or from tensors or files.")
            return


def check_data(data, report: PreflightReport, global_batch_size: Optional[int]):
    """Checks ``data`` (a dataset of global batches ``(x, y[, w])``).

    Returns the element_spec when the step can be traced from it, else None.
    """
    if isinstance(data, collections.abc.Iterator) or not isinstance(data, tf.data.Dataset):
        kind = type(data).__name__
        report.add("not repeatable", "data",
                   f"is a {kind}, not a tf.data.Dataset: a Python iterator is read "
                   "once and its shapes are unknown to the compiler.",
                   "Wrap it: `tf.data.Dataset.from_generator(make_generator, "
                   "output_signature=...)` with fixed shapes, then "
                   "`.batch(n, drop_remainder=True)`.")
        return None
    spec = data.element_spec
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        report.add("data", "data", f"elements are {spec}, not (x, y) or (x, y, sample_weight).",
                   "Map the dataset to tuples, e.g. `ds.map(lambda e: (e['image'], e['label']))`.")
        return None
    if global_batch_size is None:
        global_batch_size = _first_batch_size(data, spec, report)
    checked = {where: _check_component(where, s, global_batch_size, report)
               for where, s in _components(spec)}
    batches = {where: batch for where, (batch, _) in checked.items()}
    static = {b for b in batches.values() if b is not None}
    if len(static) > 1:
        report.add("data", "data", f"components disagree on the batch size: {batches}.",
                   "Batch every component together: `ds.batch(n)` on (x, y).")
        return None
    if global_batch_size is None and static:
        global_batch_size = static.pop()
    _check_repeatable(data, report)
    if global_batch_size is None or not all(ok for _, ok in checked.values()):
        return None
    return spec, global_batch_size


def _first_batch_size(data: tf.data.Dataset, spec, report: PreflightReport) -> Optional[int]:
    """The global batch size of a dataset batched without ``drop_remainder``,
    read from its first batch, as the Trainer reads it (None when the batch
    dimension is static, or there is no first batch to read)."""
    shapes = [s.shape for _, s in _components(spec) if isinstance(s, tf.TensorSpec)]
    if not shapes or any(not shape.rank or shape[0] is not None for shape in shapes):
        return None
    for element in data.take(1):
        size = int(tf.shape(tf.nest.flatten(element)[0])[0])
        report.notes.append(
            f"The batch dimension is not static (batched without drop_remainder): the "
            f"global batch size, {size}, is read from the first batch, as the Trainer "
            f"reads it; on a TPU tfdist pads a partial last batch to {size} rows with a "
            f"mask (`static_shapes=True`).")
        return size
    return None


def check_batch_size(global_batch_size: int, report: PreflightReport) -> int:
    """The per-replica batch size. A problem when the global batch does not
    split evenly over the cores (the cores' shapes would differ); advice
    when the per-core batch is not a multiple of 8, or of 128: it runs, but
    a TPU core's matrix unit works on tiles of 8 x 128 and pads the rest."""
    replicas = report.num_replicas
    if global_batch_size % replicas:
        report.add("batch size", "data",
                   f"the global batch of {global_batch_size} does not split over "
                   f"{replicas} TPU cores.",
                   f"Use a multiple of {replicas}, e.g. {replicas * 8 * max(1, round(global_batch_size / replicas / 8))}.")
        return global_batch_size // replicas or 1
    per_replica = global_batch_size // replicas
    if per_replica % 8:
        padded = 8 * (per_replica // 8 + 1)
        report.advise("batch size", "data",
                      f"the per-core batch is {per_replica} ({global_batch_size} / {replicas} "
                      f"cores), not a multiple of 8: each core pads it to {padded} rows, so "
                      f"{padded - per_replica} of every {padded} rows of its work are wasted.",
                      f"a global batch of {replicas * 8 * max(1, round(per_replica / 8))} "
                      f"(a multiple of {replicas * 8}).")
    elif per_replica % 128:
        report.advise("batch size", "data",
                      f"the per-core batch is {per_replica}; the 128 x 128 matrix unit "
                      "is partly idle.",
                      f"a multiple of 128 per core (a global batch of {replicas * 128} or more).")
    return per_replica
