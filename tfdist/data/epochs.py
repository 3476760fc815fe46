"""What the user handed over, decided once: data sources and epoch iterators.

`as_source` takes what ``fit`` / ``evaluate`` received (a `tf.data.Dataset`
of global batches, a `tfdist.data.EpochDataset`, or a
``dataset_fn(input_context)`` of per-replica batches), classifies it, and
raises one error per mistake, naming the argument. Everything downstream (the
Trainer, the runners, `tfdist.data`) asks the resulting `Source` instead of
re-deciding with ``isinstance``.

`epoch_iterators` then yields, epoch by epoch, the iterator to train on and
the epoch's length when known, resuming mid-epoch by skipping the batches a
checkpoint says were already trained on.
"""

import dataclasses
from typing import Callable, Iterator, Optional

import tensorflow as tf

from tfdist.data.batch import validate_element_spec
from tfdist.errors import ConfigurationError


@dataclasses.dataclass(frozen=True)
class EpochDataset:
    """A dataset built anew for every epoch: ``make_dataset(epoch) -> Dataset``.

    Use it for shuffling that is deterministic per epoch, so a job resumed
    at epoch 3 sees exactly the order an uninterrupted job would:

    >>> import tensorflow as tf
    >>> from tfdist.data import EpochDataset, epoch_seed
    >>> base = tf.data.Dataset.range(8)
    >>> data = EpochDataset(
    ...     lambda epoch: base.shuffle(8, seed=epoch_seed(7, epoch)).batch(4))
    """

    make_dataset: Callable[[int], tf.data.Dataset]


def epoch_seed(seed: int, epoch: int) -> int:
    """A distinct, reproducible shuffle seed for each (seed, epoch) pair.

    >>> import tfdist
    >>> [tfdist.data.epoch_seed(7, epoch) for epoch in range(3)]
    [7000022, 7007941, 7015860]
    """
    return (seed * 1_000_003 + epoch * 7919 + 1) % (2**31 - 1)


@dataclasses.dataclass(frozen=True)
class Source:
    """User data, classified: global batches or a per-replica dataset_fn.

    ``original`` is the object the user passed (runners key caches on it);
    ``what`` names the argument in errors ("dataset", "validation_data").
    """

    original: object
    what: str = "dataset"

    @property
    def per_replica(self) -> bool:
        """A ``dataset_fn(input_context)`` yielding per-replica batches."""
        return not isinstance(self.original, (tf.data.Dataset, EpochDataset))

    @property
    def per_epoch(self) -> bool:
        """Built anew every epoch (an `EpochDataset`)."""
        return isinstance(self.original, EpochDataset)

    def global_batches(self, epoch: int = 0) -> tf.data.Dataset:
        """The dataset of global batches for ``epoch``."""
        if self.per_epoch:
            dataset = self.original.make_dataset(epoch)
            if not isinstance(dataset, tf.data.Dataset):
                raise ConfigurationError(
                    f"The {self.what}'s EpochDataset.make_dataset({epoch}) returned "
                    f"{type(dataset).__name__}; it must return a tf.data.Dataset."
                )
            return dataset
        return self.original

    def call_dataset_fn(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
        """The per-replica dataset the ``dataset_fn`` builds for ``context``."""
        dataset = self.original(context)
        if not isinstance(dataset, tf.data.Dataset):
            raise ConfigurationError(
                f"The {self.what}'s dataset_fn(input_context) returned "
                f"{type(dataset).__name__}; it must return a tf.data.Dataset of "
                "per-replica batches."
            )
        return dataset

    def element_spec(self, num_replicas: int):
        """The ``(x, y[, sample_weight])`` spec, validated."""
        if self.per_replica:
            context = tf.distribute.InputContext(
                num_input_pipelines=1, input_pipeline_id=0,
                num_replicas_in_sync=num_replicas,
            )
            spec = self.call_dataset_fn(context).element_spec
        else:
            spec = self.global_batches(0).element_spec
        validate_element_spec(spec, self.what)
        return spec

    def known_steps(self, epoch: int) -> Optional[int]:
        """Global batches in ``epoch`` when the dataset knows, else None."""
        if self.per_replica:
            return None
        cardinality = int(self.global_batches(epoch).cardinality())
        return cardinality if cardinality >= 0 else None


def as_source(data, what: str = "dataset") -> Source:
    """Classifies ``data`` (idempotent on a `Source`); raises if it is none
    of the kinds tfdist trains on, naming ``what`` and the type received."""
    if isinstance(data, Source):
        return data
    if isinstance(data, (tf.data.Dataset, EpochDataset)) or callable(data):
        return Source(data, what)
    raise ConfigurationError(
        f"The {what} must be a tf.data.Dataset of global batches "
        f"(x, y[, sample_weight]), a tfdist.data.EpochDataset or a "
        f"dataset_fn(input_context); got {type(data).__name__}. For arrays, "
        "use tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size)."
    )


@dataclasses.dataclass(frozen=True)
class EpochData:
    """One epoch's data, from `epoch_iterators`.

    Attributes:
      epoch: the epoch's index (0-based).
      iterator: what the runner trains on.
      total_steps: the epoch's length when known (``steps_per_epoch``, or
        a dataset's known cardinality); None: it ends with its data.
      outlives_epoch: the iterator runs on into the next epoch (with
        ``steps_per_epoch``, as Keras'): its running out ends training.
    """

    epoch: int
    iterator: object
    total_steps: Optional[int]
    outlives_epoch: bool


def epoch_iterators(
    source: Source,
    make_iterator: Callable[[int, int], Iterator],
    position,
    *,
    epochs: int,
    steps_per_epoch: Optional[int],
    first_epoch: int = 0,
    fresh_each_epoch: bool = False,
) -> Iterator[EpochData]:
    """Yields each epoch's `EpochData` until ``epochs``.

    ``position`` (with ``epoch`` and ``step_in_epoch``) is read before each
    epoch, so the caller advances it as it trains. ``make_iterator(epoch,
    skip_steps)`` builds an iterator past the batches already trained on.
    With ``steps_per_epoch`` and a fixed dataset, one iterator runs on
    across epochs (``persistent``, as in Keras) from its start at
    ``first_epoch`` (Keras' ``initial_epoch``: ``outlives_epoch``); otherwise, or with
    ``fresh_each_epoch`` (the tf.data service's per-epoch jobs under
    parameter servers), every epoch is a fresh pass. A finished iterator is released (see `_release`) when the
    next one is made and when the generator ends.

    A shuffled dataset (``shuffle(..., reshuffle_each_iteration=True)``,
    tf.data's default) draws a new order for every iterator made of it, so
    the order an epoch sees depends on how many iterators were made before.
    Here that count is one-device Keras ``fit``'s (`spare_iterators`), also
    after a resume, so a seeded shuffle gives Keras' order on any number
    of replicas and workers.
    """
    persistent = steps_per_epoch is not None and not source.per_epoch and not fresh_each_epoch
    spare = 0 if persistent else spare_iterators(source)
    iterator = None
    try:
        # Resumed at a later epoch: the orders the earlier epochs drew.
        draw_orders(source, (position.epoch - first_epoch) * (1 + spare) if not persistent else 0)
        while position.epoch < epochs:
            epoch = position.epoch
            if iterator is None or not persistent:
                _release(iterator)
                skip = position.step_in_epoch + (
                    (epoch - first_epoch) * steps_per_epoch if persistent else 0)
                iterator = make_iterator(epoch, skip)
            yield EpochData(epoch, iterator, steps_per_epoch or source.known_steps(epoch),
                            outlives_epoch=persistent)
            if position.epoch > epoch:  # the epoch ran to its end
                draw_orders(source, spare)
    finally:  # the epochs are over, or the caller closed (or dropped) the generator
        _release(iterator)


def spare_iterators(source: Source) -> int:
    """Iterators one-device Keras ``fit`` makes of the dataset after each
    full epoch and never reads (1 or 0).

    Keras 3.15's epoch iterator (``keras.src.trainers.epoch_iterator``),
    without ``steps_per_epoch``, makes a fresh iterator at each epoch's
    start and, when the dataset's cardinality is known, one more at its
    end: a shuffled dataset's epoch ``e`` then sees the order of the
    ``2e``-th iterator, not the ``e``-th. tfdist makes the same number, so
    its epochs see Keras' orders (tests/data/test_data_order.py holds Keras to
    this count).
    """
    if source.per_replica or source.per_epoch:
        return 0
    return 1 if int(source.original.cardinality()) > 0 else 0


def draw_orders(source: Source, count: int) -> None:
    """Makes ``count`` iterators of a fixed dataset and drops them unread:
    each draws the next shuffle order (tf.data draws at creation, before
    reading anything), as the iterators Keras makes do."""
    if count and not (source.per_replica or source.per_epoch):
        for _ in range(count):
            iter(source.original)


def _release(iterator) -> None:
    """Calls a finished iterator's ``release``, if it has one (the
    synchronous runner's iterators are freed off the training thread:
    `tfdist.data.iterator_release`)."""
    release = getattr(iterator, "release", None)
    if release is not None:
        release()
