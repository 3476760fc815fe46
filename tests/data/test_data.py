"""tfdist.data: partial-batch policies, distribution and validation."""

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.data import distributed as data_lib
from tfdist.data.batch import Batch


def _batches(num_examples, batch_size):
    x = np.arange(num_examples, dtype="float32")[:, None]
    y = np.arange(num_examples)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)


def _replica_sizes(strategy, distributed):
    return [
        [int(tf.shape(t["y"])[0]) for t in strategy.experimental_local_results(batch)]
        for batch in distributed
    ]


def _first_step_labels(strategy, distributed):
    batch = next(iter(distributed))
    return [t["y"].numpy().tolist() for t in strategy.experimental_local_results(batch)]


def _real_sizes(strategy, distributed):
    """Real (unmasked) examples per replica and step."""
    return [
        [int(tf.reduce_sum(t["mask"])) if "mask" in t else int(tf.shape(t["y"])[0])
         for t in strategy.experimental_local_results(batch)]
        for batch in distributed
    ]


def test_exact_policy_keeps_remainder_with_empty_replicas(make_strategy):
    strategy = make_strategy(4)
    sizes = _replica_sizes(strategy, data_lib.distribute(strategy, _batches(10, 8)))
    assert sizes == [[2, 2, 2, 2], [1, 1, 0, 0]]


def test_exact_policy_can_pad_empty_replicas_keeping_the_real_split(make_strategy):
    strategy = make_strategy(4)
    distributed = data_lib.distribute(strategy, _batches(10, 8), avoid_empty_replicas=True)
    assert _real_sizes(strategy, distributed) == [[2, 2, 2, 2], [1, 1, 0, 0]]


@pytest.mark.parametrize("replicas,num_examples,batch_size", [
    (4, 10, 8), (4, 66, 8), (3, 11, 6), (4, 6, 6), (4, 3, 2), (2, 5, 4),
])
def test_exact_policy_never_hands_a_replica_an_empty_batch(
    make_strategy, replicas, num_examples, batch_size
):
    """Issue 11, point 9: replicas without real examples get masked padding,
    never a 0-row batch; every real example arrives exactly once."""
    strategy = make_strategy(replicas)
    distributed = data_lib.distribute(
        strategy, _batches(num_examples, batch_size), avoid_empty_replicas=True)
    labels = []
    for batch in distributed:
        for t in strategy.experimental_local_results(batch):
            assert int(tf.shape(t["y"])[0]) >= 1
            keep = t["mask"].numpy() > 0 if "mask" in t else slice(None)
            labels.extend(t["y"].numpy()[keep].tolist())
    assert labels == list(range(num_examples))


def test_exact_policy_adds_no_padding_when_batches_always_split_evenly(make_strategy):
    strategy = make_strategy(2)
    fixed = _batches(8, 4).rebatch(4, drop_remainder=True)
    distributed = data_lib.distribute(strategy, fixed, avoid_empty_replicas=True)
    assert "mask" not in strategy.experimental_local_results(next(iter(distributed)))[0]


def test_drop_policy_drops_the_partial_batch(make_strategy):
    strategy = make_strategy(2)
    distributed = data_lib.distribute(strategy, _batches(10, 4), partial_batch="drop")
    assert _replica_sizes(strategy, distributed) == [[2, 2], [2, 2]]


def test_pad_policy_gives_static_shapes_and_a_mask(make_strategy):
    strategy = make_strategy(2)
    distributed = data_lib.distribute(strategy, _batches(6, 4), partial_batch="pad")
    masks = [
        [t["mask"].numpy().tolist() for t in strategy.experimental_local_results(b)]
        for b in distributed
    ]
    assert masks == [[[1, 1], [1, 1]], [[1, 1], [0, 0]]]


def test_pad_policy_element_spec_is_static():
    padded = data_lib.apply_partial_batch_policy(_batches(6, 4), "pad")
    assert padded.element_spec["x"].shape == (4, 1)
    assert padded.element_spec["mask"].shape == (4,)
    last = list(padded)[-1]
    # (padding: copies of the batch's first row, masked out)
    assert last["x"].numpy()[:, 0].tolist() == [4, 5, 4, 4]
    assert last["mask"].numpy().tolist() == [1, 1, 0, 0]


def test_skip_steps_resumes_inside_an_epoch(make_strategy):
    strategy = make_strategy(2)
    distributed = data_lib.distribute(strategy, _batches(12, 4), skip_steps=2)
    assert _first_step_labels(strategy, distributed) == [[8, 9], [10, 11]]


def test_dataset_fn_gets_input_context_and_skips_per_replica_batches(make_strategy):
    strategy = make_strategy(2)
    contexts = []

    def dataset_fn(context):
        contexts.append(context)
        return _batches(16, 2)

    distributed = data_lib.distribute(strategy, dataset_fn, skip_steps=1)
    first = _first_step_labels(strategy, distributed)
    assert contexts[0].num_replicas_in_sync == 2
    assert first == [[4, 5], [6, 7]]  # step 0 used per-replica batches 0 and 1


def test_epoch_dataset_gets_the_epoch(make_strategy):
    strategy = make_strategy(2)
    seen = []

    def make_dataset(epoch):
        seen.append(epoch)
        return _batches(4, 4)

    data_lib.distribute(strategy, tfdist.data.EpochDataset(make_dataset), epoch=3)
    assert seen == [3]


def test_epoch_seed_differs_per_epoch_and_repeats_per_seed():
    assert tfdist.data.epoch_seed(1, 0) != tfdist.data.epoch_seed(1, 1)
    assert tfdist.data.epoch_seed(1, 2) == tfdist.data.epoch_seed(1, 2)


@pytest.mark.parametrize(
    "dataset, message",
    [
        (tf.data.Dataset.from_tensor_slices((np.zeros((4, 2)), np.zeros(4))), "no batch dimension"),
        (tf.data.Dataset.from_tensors((np.zeros((4, 2)),) * 4), r"tuple of 4"),
        (tf.data.Dataset.from_tensors((np.zeros((4, 2)), np.zeros((3,)))), "disagree on the batch"),
        # Ragged ids from outside the model: refused, naming the fix (pad them
        # outside, make them ragged inside: tests/communication/test_table_lookups.py).
        (tf.data.Dataset.from_tensor_slices((tf.ragged.constant([[1], [2, 3]]), np.zeros(2)))
         .batch(2), r"RaggedTensorSpec; tfdist needs dense .*x.to_tensor\(\).*from_tensor"),
    ],
)
def test_bad_elements_are_rejected(dataset, message):
    with pytest.raises(tfdist.errors.ConfigurationError, match=message):
        data_lib.validate_element_spec(dataset.element_spec)


def test_bad_shard_policy(make_strategy):
    with pytest.raises(tfdist.errors.ConfigurationError, match="`shard_policy` \\('rows'\\)"):
        data_lib.distribute(make_strategy(2), _batches(4, 2), shard_policy="rows")


def test_worker_stream_deals_the_repeated_batches_round_robin():
    # Five batches of 2 and 1 examples; batch k holds x == k.
    sizes = [2, 2, 2, 2, 1]
    x = np.concatenate([np.full(size, k, np.float32) for k, size in enumerate(sizes)])
    dataset = tf.data.Dataset.from_tensor_slices((x[:, None], np.zeros(len(x), np.int32))).batch(2)

    def first_batches(worker):
        stream = data_lib.worker_stream(dataset, worker, 2, skip_steps=1)
        return [(int(b["x"][0, 0]), int(b["global_examples"][0]), len(b["x"]))
                for b in stream.take(5)]

    # After the one batch already trained on, the stream is 1 2 3 4 0 1 2 ...
    assert first_batches(0) == [(1, 2, 2), (3, 2, 2), (0, 2, 2), (2, 2, 2), (4, 1, 1)]
    assert first_batches(1) == [(2, 2, 2), (4, 1, 1), (1, 2, 2), (3, 2, 2), (0, 2, 2)]


def _map_function_ops(dataset):
    """The op types of the functions in ``dataset``'s graph."""
    from tensorflow.core.framework import graph_pb2  # pylint: disable=import-outside-toplevel

    graph = graph_pb2.GraphDef()
    graph.ParseFromString(tf.raw_ops.DatasetToGraphV2(input_dataset=dataset._variant_tensor).numpy())  # pylint: disable=protected-access
    return {node.op for function in graph.library.function for node in function.node_def}


def test_static_size_batches_carry_the_same_global_count_without_a_batch_function(make_strategy):
    """(x, y) batches of one static size get their count from a zipped
    constant column; the structures equal those of the computing map."""
    x = np.arange(12, dtype="float32")[:, None]
    y = np.arange(12)
    static = tf.data.Dataset.from_tensor_slices((x, y)).batch(4, drop_remainder=True)
    assert static.element_spec[0].shape[0] == 4
    fast = data_lib.apply_partial_batch_policy(static, "exact", add_global_count=True)
    computed = static.map(lambda *e: Batch.from_element(e).with_global_count().to_structure())
    assert fast.element_spec == computed.element_spec
    assert int(fast.cardinality()) == 3
    assert _map_function_ops(fast) == {"Identity"}  # the computing map: Shape, Fill, ...
    assert _map_function_ops(computed) - {"Identity"}
    for got, expected in zip(fast, computed):
        assert sorted(got) == ["global_examples", "x", "y"]
        for key in expected:
            np.testing.assert_array_equal(got[key].numpy(), expected[key].numpy())
    # Split over 2 replicas, every replica reads the global count, 4.
    strategy = make_strategy(2)
    distributed = data_lib.distribute(strategy, static)
    counts = [[t["global_examples"].numpy().tolist() for t in strategy.experimental_local_results(b)]
              for b in distributed]
    assert counts == [[[4.0, 4.0], [4.0, 4.0]]] * 3
