"""What each replica sees: global-batch datasets made distributed, exactly.

Users hand tfdist datasets that yield GLOBAL batches ``(x, y)`` or
``(x, y, sample_weight)``, or a ``dataset_fn(input_context)`` that yields
per-replica batches, or an `EpochDataset` that builds one dataset per epoch
(for deterministic per-epoch shuffling). `distribute` turns any of them into a
`tf.distribute.DistributedDataset` of `tfdist.data.batch.Batch` records (carried
as dicts: see `tfdist.data.batch`).

Partial final batches follow a policy:

* ``"exact"`` (default): keep the remainder. With 4 replicas a last global
  batch of 2 examples arrives as replica batches of 1, 1, 0 and 0 examples.
  With ``avoid_empty_replicas=True`` (what the Trainer uses: TensorFlow's
  oneDNN convolutions fail on 0 rows) a batch whose size is not a multiple
  of the replica count is padded up to the next multiple, with a ``mask``
  of 0.0 on the padding, so those replicas get 1, 1, 0 and 0 real examples
  plus padding; padding then contributes nothing to losses, gradients,
  metrics or batch statistics.
* ``"drop"``: drop batches smaller than the global batch size.
* ``"pad"``: pad every batch to the global batch size (static shapes, for
  XLA and TPUs) and add a ``mask`` of 1.0 for real and 0.0 for padded
  examples, which losses and metrics use as a weight and count.

>>> import tensorflow as tf
>>> from tfdist.data.distributed import apply_partial_batch_policy
>>> ds = tf.data.Dataset.from_tensor_slices(([[1.0]] * 5, [0] * 5)).batch(4)
>>> padded = apply_partial_batch_policy(ds, "pad", global_batch_size=4)
>>> [int(sum(e["mask"])) for e in padded]
[4, 1]
"""

import math
from typing import Optional

import tensorflow as tf

from tfdist.data import epochs, options as options_lib, service
from tfdist.data.batch import Batch, validate_element_spec
from tfdist._internal import collectives
from tfdist.data.epochs import EpochDataset, epoch_seed  # noqa: F401  (public names)
from tfdist.errors import ConfigurationError

PARTIAL_BATCH_POLICIES = ("exact", "drop", "pad")



def infer_global_batch_size(dataset: tf.data.Dataset) -> int:
    """The batch size: static from the element_spec, else the first batch's.

    >>> import tensorflow as tf, tfdist
    >>> tfdist.data.infer_global_batch_size(tf.data.Dataset.range(10).batch(4))
    4
    """
    first_spec = tf.nest.flatten(dataset.element_spec)[0]
    if first_spec.shape.rank and first_spec.shape[0] is not None:
        return int(first_spec.shape[0])
    for element in dataset.take(1):
        return int(tf.shape(tf.nest.flatten(element)[0])[0])
    raise ConfigurationError("The dataset is empty: no batch to train on.")


def apply_partial_batch_policy(
    dataset: tf.data.Dataset,
    policy: str,
    global_batch_size: Optional[int] = None,
    *,
    add_global_count: bool = False,
    pad_to_multiple_of: int = 1,
) -> tf.data.Dataset:
    """Maps ``(x, y[, w])`` batches to `Batch` structures under ``policy``.

    With ``add_global_count``, batches also carry their real-example count
    (`Batch.with_global_count`). With ``pad_to_multiple_of`` > 1 ("exact"
    only), a batch whose size is not a multiple of it is padded up to one,
    with a mask, so no replica of that many gets an empty batch. Each policy
    is a single ``map`` (plus a ``filter`` for "drop"): every stage costs CPU
    per batch, and tf.data does not fuse maps by default.

    >>> import tensorflow as tf, tfdist
    >>> ds = tf.data.Dataset.from_tensor_slices(([[1.0]] * 5, [0] * 5)).batch(4)
    >>> exact = tfdist.data.apply_partial_batch_policy(ds, "exact", add_global_count=True,
    ...                                                pad_to_multiple_of=2)
    >>> [(b["mask"].numpy().tolist(), float(b["global_examples"][0])) for b in exact]
    [([1.0, 1.0, 1.0, 1.0], 4.0), ([1.0, 0.0], 1.0)]
    """
    if policy not in PARTIAL_BATCH_POLICIES:
        raise ConfigurationError(
            f"`partial_batch` ({policy!r}) must be one of "
            f"{PARTIAL_BATCH_POLICIES}."
        )
    validate_element_spec(dataset.element_spec)

    def finish(batch: Batch) -> dict:
        return (batch.with_global_count() if add_global_count else batch).to_structure()

    if policy == "exact":
        if pad_to_multiple_of > 1:
            return dataset.map(lambda *e: finish(
                Batch.from_element(e).padded_to_multiple(pad_to_multiple_of)))
        counted = _with_constant_global_count(dataset) if add_global_count else None
        if counted is not None:
            return counted
        return dataset.map(lambda *e: finish(Batch.from_element(e)))
    size = global_batch_size or infer_global_batch_size(dataset)
    if policy == "drop":
        full = dataset.filter(lambda *e: tf.shape(tf.nest.flatten(e)[0])[0] == size)

        def static(*element):
            fields = tf.nest.map_structure(
                lambda t: tf.ensure_shape(t, [size] + t.shape[1:].as_list()),
                Batch.from_element(element).to_structure(),
            )
            return finish(Batch.from_structure(fields))

        return full.map(static)
    return dataset.map(lambda *e: finish(Batch.from_element(e).padded_to(size)))


def _with_constant_global_count(dataset: tf.data.Dataset) -> Optional[tf.data.Dataset]:
    """``(x, y)`` batches of one static size as `Batch` structures carrying
    their global count, without running a function per batch; None when
    the size is not static or the batches carry sample weights.

    Every batch has the same count, so its column comes from a repeated
    one-element dataset zipped in front, and the map only names the parts
    in the order tf.data already holds them (the dict's sorted keys:
    global_examples, x, y). tf.data skips such an identity map, where a map
    that computes the column runs a function per batch, which about doubles
    the CPU a batch costs to read (figures:
    docs/performance.md#measurements-behind-design-choices).
    """
    spec = dataset.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2):
        return None
    size = tf.nest.flatten(spec)[0].shape
    if not size.rank or size[0] is None:
        return None
    columns = tf.data.Dataset.from_tensors(
        tf.fill([size[0]], tf.constant(float(size[0]), tf.float32))).repeat()

    @tf.autograph.experimental.do_not_convert
    def name_parts(global_examples, element):
        return Batch(element[0], element[1], global_examples=global_examples).to_structure()

    return tf.data.Dataset.zip((columns, dataset)).map(name_parts)


def _needs_padding(dataset: tf.data.Dataset, replicas: int) -> int:
    """``replicas`` when some batch may not split into non-empty replica
    batches (its size is unknown or not a multiple), else 1."""
    if replicas == 1:
        return 1
    size = tf.nest.flatten(dataset.element_spec)[0].shape[0]
    return 1 if size is not None and size % replicas == 0 else replicas


def distribute(strategy: tf.distribute.Strategy, data, **options):
    """Returns a distributed dataset of `Batch` structures.

    Arguments (``epoch``, ``skip_steps``, ``partial_batch``, ``data_service``,
    ``global_batch_size``, ``shard_policy``, ``avoid_empty_replicas``) as
    `distribute_counted`, which also says how many steps the dataset
    certainly has.

    >>> import tensorflow as tf, tfdist
    >>> strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    >>> dataset = tf.data.Dataset.from_tensor_slices((tf.ones([10, 3]), tf.zeros([10]))).batch(4)
    >>> for element in tfdist.data.distribute(strategy, dataset, partial_batch="pad"):
    ...     batch = tfdist.Batch.from_structure(element)
    ...     print([int(tf.reduce_sum(m)) for m in strategy.experimental_local_results(batch.mask)])
    [2, 2]
    [2, 2]
    [2, 0]
    """
    return distribute_counted(strategy, data, **options)[0]


def distribute_counted(
    strategy: tf.distribute.Strategy,
    data,
    *,
    epoch: int = 0,
    skip_steps: int = 0,
    partial_batch: str = "exact",
    global_batch_size: Optional[int] = None,
    shard_policy: str = "auto",
    avoid_empty_replicas: bool = False,
    data_service: Optional[str] = None,
):
    """``(distributed dataset, guaranteed steps)`` for ``epoch``.

    ``guaranteed steps`` is how many steps an iterator of it certainly
    yields: ``math.inf`` for an endless dataset (``repeat()``), the
    dataset's cardinality on one worker when tf.data knows it, else 0. A
    loop that reads no further than that needs no end-of-data check per
    step (`tfdist.loops.runners.device_loop`'s ``check_end``).

    >>> import tensorflow as tf, tfdist
    >>> strategy = tfdist.make_strategy("one_device")
    >>> ds = tf.data.Dataset.from_tensor_slices((tf.ones([10, 3]), tf.zeros([10]))).batch(4)
    >>> distributed, steps = tfdist.data.distribute_counted(strategy, ds)
    >>> steps
    3

    Args:
      strategy: where the batches go.
      data: a `tf.data.Dataset` of global batches, an `EpochDataset`, a
        ``dataset_fn(input_context)`` yielding per-replica batches, or a
        `tfdist.data.epochs.Source` of one of them.
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
      avoid_empty_replicas: under "exact", pad a global batch that does not
        split evenly over the replicas up to a multiple of their number,
        with a ``mask`` (0.0 on padding), so no replica gets a 0-row batch
        (the Trainer does; a hand-written loop must then weight by the mask).
      data_service: a tf.data service dispatcher's address, or ``"auto"``
        (``TFDIST_DATA_SERVICE``): the global batches are produced there
        (`tfdist.data.service`), in order, so results do not change.
    """
    if shard_policy not in options_lib.SHARD_POLICIES:
        raise ConfigurationError(
            f"`shard_policy` ({shard_policy!r}) must be one of "
            f"{sorted(options_lib.SHARD_POLICIES)}."
        )
    source = epochs.as_source(data)
    replicas = strategy.num_replicas_in_sync
    address = service.resolve(data_service)
    if address:
        service.check_synchronous(type(strategy).__name__)
        if source.per_replica:
            raise ConfigurationError(
                "data_service takes a dataset of global batches (or an EpochDataset); "
                "a dataset_fn builds per-replica pipelines on the training workers. "
                "Pass the global-batch dataset, or data_service=None.")
    if source.per_replica:  # its length is the dataset_fn's: unknown here
        return _distribute_dataset_fn(
            strategy, source, skip_steps, partial_batch, global_batch_size, shard_policy
        ), 0
    data = source.global_batches(epoch)
    # "auto" means DATA here (unless the dataset's own options name a
    # policy): every worker reads the global batches and keeps its
    # replicas' slices, so each step trains on exactly the user's global
    # batch. Under FILE (each worker reads its own files) and OFF (each
    # worker reads everything) a step's examples are the workers' local
    # batches together: the global count is all-reduced, not carried.
    policy = options_lib.shard_policy(shard_policy, data)
    carried = policy not in ("file", "off")
    remaining = data.skip(skip_steps)
    if address:  # produced on the service, in order (one job per iterator)
        remaining = service.read_through(remaining, address)
    dataset = apply_partial_batch_policy(
        remaining, partial_batch, global_batch_size,
        add_global_count=carried,
        pad_to_multiple_of=(_needs_padding(data, replicas)
                            if avoid_empty_replicas and carried else 1),
    )
    if partial_batch == "pad":
        size = tf.nest.flatten(dataset.element_spec)[0].shape[0]
        if size % replicas:
            raise ConfigurationError(
                f"partial_batch='pad' needs a global batch size divisible by the "
                f"{replicas} replicas; got {size}. Batch the dataset with a "
                f"multiple of {replicas}, or use partial_batch='exact'."
            )
    dataset = dataset.with_options(options_lib.input_options(
        data, policy, spans_workers=collectives.spans_workers(strategy), what=source.what,
    )).prefetch(tf.data.AUTOTUNE)
    return (strategy.experimental_distribute_dataset(dataset),
            _guaranteed_steps(strategy, dataset))


def _guaranteed_steps(strategy, dataset: tf.data.Dataset):
    """Steps an iterator of ``dataset`` distributed over ``strategy``
    certainly yields: inf when endless, the cardinality on one worker (each
    global batch is one step), else 0 (unknown; across workers a step
    count depends on how TensorFlow splits the last batches, and a TPU pod
    has several input hosts)."""
    cardinality = int(dataset.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        return math.inf
    one_input_worker = not (collectives.spans_workers(strategy) or isinstance(
        strategy, (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)))
    return cardinality if cardinality >= 0 and one_input_worker else 0


def _distribute_dataset_fn(strategy, source, skip_steps, partial_batch,
                           global_batch_size, shard_policy):
    """A dataset_fn's per-replica batches, distributed."""
    replicas = strategy.num_replicas_in_sync
    per_replica_size = None if global_batch_size is None else global_batch_size // replicas
    def dataset_fn(input_context):
        # One pipeline feeds this many replicas, one batch each per step.
        per_step = input_context.num_replicas_in_sync // input_context.num_input_pipelines
        own = source.call_dataset_fn(input_context)
        dataset = apply_partial_batch_policy(own.skip(skip_steps * per_step), partial_batch,
                                             per_replica_size)
        # Each pipeline reads its own examples (its order is its own
        # affair); "auto" leaves the dataset's own shard policy.
        options = options_lib.input_options(
            own, None if shard_policy == "auto" else shard_policy, spans_workers=False,
            what=source.what)
        return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)

    return strategy.distribute_datasets_from_function(dataset_fn)


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

    >>> import tensorflow as tf, tfdist
    >>> ds = tf.data.Dataset.from_tensor_slices((tf.range(6.0)[:, None], tf.zeros(6))).batch(2)
    >>> stream = tfdist.data.worker_stream(ds, worker=1, num_workers=2)
    >>> [float(b["x"][0, 0]) for b in stream.take(3)]  # batches 1, 3 (= 0), 5 (= 2)
    [2.0, 0.0, 4.0]
    """
    stream = dataset.repeat().skip(skip_steps).shard(num_workers, worker)
    stream = apply_partial_batch_policy(
        stream, partial_batch, global_batch_size, add_global_count=True
    )
    options = options_lib.input_options(dataset, "off", spans_workers=num_workers > 1)
    return stream.with_options(options).prefetch(tf.data.AUTOTUNE)


def load_tfds(name: str, split: str, *, data_dir=None, shuffle_files=False):
    """Unbatched ``(features, label)`` of a TFDS dataset; never downloads.

    tfdist's own datasets (``synthetic_patterns``) are generated locally on
    first use (TFDS reports it); see `tfdist.data.datasets.load_supervised`.
    Any other dataset must already be prepared in ``data_dir``.

    >>> import shutil, tempfile, tfdist
    >>> data_dir = tempfile.mkdtemp()
    >>> test = tfdist.data.load_tfds("synthetic_patterns", "test", data_dir=data_dir)
    Downloading and preparing dataset ...
    Dataset synthetic_patterns downloaded and prepared to .... Subsequent calls will reuse ...
    >>> image, label = next(iter(test))
    >>> int(test.cardinality()), image.shape.as_list(), image.dtype.name, label.dtype.name
    (2000, [16, 16, 1], 'uint8', 'int64')
    >>> tfdist.data.load_tfds("mnist", "train", data_dir=data_dir)
    Traceback (most recent call last):
    ...
    tfdist.errors.ConfigurationError: TFDS dataset 'mnist' is not prepared ... does not download...
    >>> shutil.rmtree(data_dir)
    """
    from tfdist.data.datasets import load_supervised  # pylint: disable=import-outside-toplevel

    return load_supervised(
        name, split, data_dir=data_dir, shuffle_files=shuffle_files
    )
