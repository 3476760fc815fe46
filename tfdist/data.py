"""What each replica sees: global-batch datasets made distributed, exactly.

Users hand tfdist datasets that yield GLOBAL batches ``(x, y)`` or
``(x, y, sample_weight)``, or a ``dataset_fn(input_context)`` that yields
per-replica batches, or an `EpochDataset` that builds one dataset per epoch
(for deterministic per-epoch shuffling). `distribute` turns any of them into a
`tf.distribute.DistributedDataset` whose elements are dicts with keys
``x``, ``y`` and, when present, ``sample_weight``, ``mask`` and (for
global-batch datasets) ``global_examples``, the global batch's example count
repeated per example (see `with_global_count`).

Partial final batches follow a policy:

* ``"exact"`` (default): keep the remainder. With 4 replicas a last global
  batch of 2 examples arrives as replica batches of 1, 1, 0 and 0 examples;
  `tfdist.losses` makes empty replicas contribute exactly nothing.
* ``"drop"``: drop batches smaller than the global batch size.
* ``"pad"``: pad every batch to the global batch size (static shapes, for
  XLA and TPUs) and add a ``mask`` of 1.0 for real and 0.0 for padded
  examples, which losses and metrics use as a weight and count.

>>> ds = tf.data.Dataset.from_tensor_slices(([[1.0]] * 5, [0] * 5)).batch(4)
>>> padded = apply_partial_batch_policy(ds, "pad", global_batch_size=4)
>>> [int(sum(e["mask"])) for e in padded]
[4, 1]
"""

import dataclasses
from typing import Callable, Optional, Union

import tensorflow as tf

from tfdist import _keras
from tfdist.errors import ConfigurationError

PARTIAL_BATCH_POLICIES = ("exact", "drop", "pad")

_SHARD_POLICIES = {
    "auto": tf.data.experimental.AutoShardPolicy.AUTO,
    "data": tf.data.experimental.AutoShardPolicy.DATA,
    "file": tf.data.experimental.AutoShardPolicy.FILE,
    "off": tf.data.experimental.AutoShardPolicy.OFF,
}


@dataclasses.dataclass(frozen=True)
class EpochDataset:
    """A dataset built anew for every epoch: ``make_dataset(epoch) -> Dataset``.

    Use it for shuffling that is deterministic per epoch, so a job resumed
    at epoch 3 sees exactly the order an uninterrupted job would:

    >>> base = tf.data.Dataset.range(8)
    >>> data = EpochDataset(
    ...     lambda epoch: base.shuffle(8, seed=epoch_seed(7, epoch)).batch(4))
    """

    make_dataset: Callable[[int], tf.data.Dataset]


def epoch_seed(seed: int, epoch: int) -> int:
    """A distinct, reproducible shuffle seed for each (seed, epoch) pair."""
    return (seed * 1_000_003 + epoch * 7919 + 1) % (2**31 - 1)


DataSource = Union[tf.data.Dataset, EpochDataset, Callable]


def _leaves_with_paths(structure):
    flat = _keras.tree.flatten_with_path(structure)
    return [
        ("/".join(str(p) for p in path) or "<tensor>", leaf) for path, leaf in flat
    ]


def validate_element_spec(element_spec, what: str = "dataset") -> None:
    """Checks that elements are batched ``(x, y)`` or ``(x, y, sample_weight)``.

    Raises:
      ConfigurationError: wrong structure, or a component without a batch
        dimension; the message names the component and its shape.
    """
    if not isinstance(element_spec, tuple) or len(element_spec) not in (2, 3):
        raise ConfigurationError(
            f"The {what} must yield tuples (x, y) or (x, y, sample_weight); "
            f"its element_spec is {element_spec}. Map it, e.g. "
            "`ds.map(lambda e: (e['image'], e['label']))`."
        )
    names = ("x", "y", "sample_weight")
    leading_dims = {}
    for name, part in zip(names, element_spec):
        for path, spec in _leaves_with_paths(part):
            if not isinstance(spec, tf.TensorSpec):
                raise ConfigurationError(
                    f"The {what}'s {name} component {path} is a "
                    f"{type(spec).__name__}; tfdist needs dense tensors."
                )
            if spec.shape.rank == 0:
                raise ConfigurationError(
                    f"The {what}'s {name} component {path} has shape "
                    f"{spec.shape}: it has no batch dimension. Batch the "
                    "dataset, e.g. `ds.batch(global_batch_size)`."
                )
            if spec.shape.rank is not None and spec.shape[0] is not None:
                leading_dims[f"{name}:{path}"] = spec.shape[0]
    if len(set(leading_dims.values())) > 1:
        raise ConfigurationError(
            f"The {what}'s components disagree on the batch dimension "
            f"({leading_dims}); is the dataset batched?"
        )


def to_batch_dict(element) -> dict:
    """``(x, y[, sample_weight])`` -> ``{"x", "y"[, "sample_weight"]}``."""
    batch = {"x": element[0], "y": element[1]}
    if len(element) == 3:
        batch["sample_weight"] = element[2]
    return batch


def batch_size_of(batch: dict) -> tf.Tensor:
    """Number of examples in a batch dict (its leading dimension)."""
    return tf.shape(tf.nest.flatten(batch["x"])[0])[0]


def real_examples(batch: dict) -> tf.Tensor:
    """Examples in a batch dict that are not padding, as float32."""
    if "mask" in batch:
        return tf.reduce_sum(tf.cast(batch["mask"], tf.float32))
    return tf.cast(batch_size_of(batch), tf.float32)


def infer_global_batch_size(dataset: tf.data.Dataset) -> int:
    """The batch size: static from the element_spec, else the first batch's."""
    first_spec = tf.nest.flatten(dataset.element_spec)[0]
    if first_spec.shape.rank and first_spec.shape[0] is not None:
        return int(first_spec.shape[0])
    for element in dataset.take(1):
        return int(tf.shape(tf.nest.flatten(element)[0])[0])
    raise ConfigurationError("The dataset is empty: no batch to train on.")


GLOBAL_EXAMPLES = "global_examples"


def with_global_count(batch: dict) -> dict:
    """Adds the global batch's real-example count as a per-example column.

    Rebatching splits the column with the batch, so every non-empty replica
    learns the global count without a collective (an empty replica contributes
    nothing and needs no count). `tfdist.step` uses it instead of an
    all-reduce wherever the loss's denominators follow from example counts.
    """
    count = real_examples(batch)
    batch = dict(batch)
    batch[GLOBAL_EXAMPLES] = tf.fill(tf.expand_dims(batch_size_of(batch), 0), count)
    return batch


def _pad_to(batch: dict, size: int) -> dict:
    count = batch_size_of(batch)
    missing = size - count

    def pad(tensor):
        paddings = [[0, missing]] + [[0, 0]] * (tensor.shape.rank - 1)
        padded = tf.pad(tensor, paddings)
        return tf.ensure_shape(padded, [size] + tensor.shape[1:].as_list())

    padded = tf.nest.map_structure(pad, batch)
    mask = tf.concat([tf.ones([count]), tf.zeros([missing])], axis=0)
    padded["mask"] = tf.ensure_shape(mask, [size])
    return padded


def apply_partial_batch_policy(
    dataset: tf.data.Dataset,
    policy: str,
    global_batch_size: Optional[int] = None,
    *,
    add_global_count: bool = False,
) -> tf.data.Dataset:
    """Maps ``(x, y[, w])`` batches to batch dicts under ``policy``.

    With ``add_global_count``, batches also get `with_global_count`'s column.
    Each policy is a single ``map`` (plus a ``filter`` for "drop"): every
    stage costs CPU per batch, and tf.data does not fuse maps by default.
    """
    if policy not in PARTIAL_BATCH_POLICIES:
        raise ConfigurationError(
            f"`partial_batch` ({policy!r}) must be one of "
            f"{PARTIAL_BATCH_POLICIES}."
        )
    validate_element_spec(dataset.element_spec)
    finish = with_global_count if add_global_count else (lambda batch: batch)
    if policy == "exact":
        return dataset.map(lambda *e: finish(to_batch_dict(e)))
    size = global_batch_size or infer_global_batch_size(dataset)
    if policy == "drop":
        full = dataset.filter(lambda *e: tf.shape(tf.nest.flatten(e)[0])[0] == size)

        def static(*element):
            batch = tf.nest.map_structure(
                lambda t: tf.ensure_shape(t, [size] + t.shape[1:].as_list()),
                to_batch_dict(element),
            )
            return finish(batch)

        return full.map(static)
    return dataset.map(lambda *e: finish(_pad_to(to_batch_dict(e), size)))


def _options(shard_policy: str) -> tf.data.Options:
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = _SHARD_POLICIES[
        shard_policy
    ]
    options.deterministic = True
    return options


def distribute(
    strategy: tf.distribute.Strategy,
    data: DataSource,
    *,
    epoch: int = 0,
    skip_steps: int = 0,
    partial_batch: str = "exact",
    global_batch_size: Optional[int] = None,
    shard_policy: str = "auto",
):
    """Returns a distributed dataset of batch dicts for ``epoch``.

    Args:
      strategy: where the batches go.
      data: a `tf.data.Dataset` of global batches, an `EpochDataset`, or a
        ``dataset_fn(input_context)`` yielding per-replica batches.
      epoch: passed to an `EpochDataset`.
      skip_steps: training steps of this epoch already taken (for resuming):
        that many global batches of a dataset are skipped, or that many
        steps' worth of per-replica batches of a dataset_fn's dataset.
      partial_batch: ``"exact"``, ``"drop"`` or ``"pad"`` (module docstring).
      global_batch_size: needed by "drop"/"pad" only when the batch size is
        neither static nor the size of the first batch.
      shard_policy: ``"auto"``, ``"data"``, ``"file"`` or ``"off"``: how
        workers split a global-batch dataset. For datasets "auto" is "data"
        (exact: each worker keeps its part of every global batch); "file"
        has each worker read its own files instead.
    """
    if shard_policy not in _SHARD_POLICIES:
        raise ConfigurationError(
            f"`shard_policy` ({shard_policy!r}) must be one of "
            f"{sorted(_SHARD_POLICIES)}."
        )
    replicas = strategy.num_replicas_in_sync
    if isinstance(data, EpochDataset):
        data = data.make_dataset(epoch)
    if isinstance(data, tf.data.Dataset):
        # "auto" means DATA here: every worker reads the global batches and
        # keeps its replicas' slices, so each step trains on exactly the
        # user's global batch. FILE (each worker reads its own files, and a
        # step's examples are the workers' local batches together) only
        # when asked for; then the global count is all-reduced, not carried.
        policy = "data" if shard_policy == "auto" else shard_policy
        options = _options(policy)
        dataset = apply_partial_batch_policy(
            data.skip(skip_steps), partial_batch, global_batch_size,
            add_global_count=policy != "file",
        )
        if partial_batch == "pad":
            size = tf.nest.flatten(dataset.element_spec)[0].shape[0]
            if size % replicas:
                raise ConfigurationError(
                    f"partial_batch='pad' needs a global batch size divisible "
                    f"by the {replicas} replicas; got {size}."
                )
        dataset = dataset.with_options(options).prefetch(tf.data.AUTOTUNE)
        return strategy.experimental_distribute_dataset(dataset)
    if callable(data):
        per_replica_size = (
            None if global_batch_size is None else global_batch_size // replicas
        )

        options = _options(shard_policy)

        def dataset_fn(input_context):
            # One pipeline feeds this many replicas, one batch each per step.
            per_step = (
                input_context.num_replicas_in_sync
                // input_context.num_input_pipelines
            )
            dataset = data(input_context).skip(skip_steps * per_step)
            dataset = apply_partial_batch_policy(
                dataset, partial_batch, per_replica_size
            )
            return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)

        return strategy.distribute_datasets_from_function(dataset_fn)
    raise ConfigurationError(
        f"Expected a tf.data.Dataset, a tfdist.data.EpochDataset or a "
        f"dataset_fn(input_context); got {type(data).__name__}."
    )


def worker_stream(
    dataset: tf.data.Dataset,
    worker: int,
    num_workers: int,
    *,
    skip_steps: int = 0,
    partial_batch: str = "exact",
    global_batch_size: Optional[int] = None,
) -> tf.data.Dataset:
    """One parameter-server worker's endless share of a global-batch dataset.

    The dataset is repeated into one stream of batches; the first
    ``skip_steps`` batches (already trained on) are skipped and worker
    ``worker`` of ``num_workers`` takes batches ``worker, worker +
    num_workers, ...`` of the rest, so workers never train on the same
    batch of a pass. Each batch keeps its own size as its global count:
    under asynchronous training a worker's step is scaled by its own batch.
    Every worker reads the whole stream and keeps its part (as DATA
    sharding does), which costs input CPU but needs no file layout.
    """
    stream = dataset.repeat().skip(skip_steps).shard(num_workers, worker)
    stream = apply_partial_batch_policy(
        stream, partial_batch, global_batch_size, add_global_count=True
    )
    return stream.with_options(_options("off")).prefetch(tf.data.AUTOTUNE)


def load_tfds(name: str, split: str, *, data_dir=None, shuffle_files=False):
    """Unbatched ``(features, label)`` of a TFDS dataset; never downloads.

    tfdist's own datasets (``synthetic_patterns``) are generated locally on
    first use; see `tfdist.datasets.load_supervised`.
    """
    from tfdist.datasets import load_supervised  # pylint: disable=import-outside-toplevel

    return load_supervised(
        name, split, data_dir=data_dir, shuffle_files=shuffle_files
    )
