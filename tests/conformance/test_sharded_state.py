"""Sharded optimizer state (`tfdist.communication.ShardedOptimizerState`)
and fully sharded weights (`tfdist.communication.FullySharded`) against
single-device Keras: the zoo's dense, convolutional, embedding,
mixed-precision and gradient-accumulation families, on partial and
empty-replica batches.

CI runs the short form (sharded state: the embedding family on every batch
shape over 3 replicas, a transformer, a model's own step and mixed
precision on a partial batch over 2; fully sharded weights: every other
family once, taking turns over 2, 3 and 4 replicas with a partial batch
and empty replicas); ``--conformance=full`` runs every listed family
on 2, 3 and 4 replicas and every batch shape.
"""

import functools
import itertools

import numpy as np
import pytest

import tfdist
from conformance import harness, zoo
from tests.support import strategy_columns

pytestmark = pytest.mark.conformance

FAMILIES = ("embedding_pooling", "embedding_global_clipnorm", "embedding_lstm_masked",
            "transformer_encoder", "cnn_sync_batch_norm", "kernel_regularizer", "dict_multi_io",
            "own_train_step", "mixed_float16_embedding", "gradient_accumulation")
FULLY_SHARDED_FAMILIES = FAMILIES

# (sync-BN runs fully sharded in CI, below: its statistics do not depend on
# which of the two stages shards the optimizer's state)
IN_SHORT_FORM = ("transformer_encoder", "own_train_step", "mixed_float16_embedding")
FULLY_SHARDED_PLACES = ((3, "partial"), (4, "tiny_last"), (2, "partial"))
# CI: every other family (the others in the full form), the places in turn.
FULLY_SHARDED_SHORT_FORM = dict(zip(FULLY_SHARDED_FAMILIES[::2],
                                    itertools.cycle(FULLY_SHARDED_PLACES)))

STAGES = {"sharded_state": tfdist.communication.ShardedOptimizerState,
          "fully_sharded": tfdist.communication.FullySharded}


def in_short_form(stage: str, case_name: str, replicas: int, shape: str) -> bool:
    if stage == "fully_sharded":
        return FULLY_SHARDED_SHORT_FORM.get(case_name) == (replicas, shape)
    if case_name == "embedding_pooling":
        return replicas == 3
    return case_name in IN_SHORT_FORM and (replicas, shape) == (2, "partial")


def _matrix():
    for stage, families in (("sharded_state", FAMILIES),
                            ("fully_sharded", FULLY_SHARDED_FAMILIES)):
        for case_name in families:
            for replicas in (2, 3, 4):
                for shape in harness.BATCH_SHAPES:
                    marks = [] if in_short_form(stage, case_name, replicas, shape) else [
                        pytest.mark.conformance_full]
                    yield pytest.param(stage, case_name, replicas, shape, marks=marks,
                                       id=f"{stage}-{case_name}-mirrored_{replicas}-{shape}")


@functools.lru_cache(maxsize=None)
def _tolerance(case_name: str, examples: int) -> float:
    _, reference = harness.reference_of(case_name, examples)
    return harness.tolerance(zoo.BY_NAME[case_name], examples, reference)


@pytest.mark.parametrize("stage,case_name,replicas,shape", list(_matrix()))
def test_each_sharding_stage_equals_one_device(stage, case_name, replicas, shape):
    case = zoo.BY_NAME[case_name]
    examples = harness.BATCH_SHAPES[shape]
    initial, reference = harness.reference_of(case_name, examples)
    strategy = strategy_columns.in_process(replicas)
    sharding = STAGES[stage]()
    result = harness.run_attached(case, strategy, examples, initial,
                                  attach_options={"communication": sharding})
    harness.assert_matches(reference, result, _tolerance(case_name, examples))


def test_each_replica_holds_one_slice_of_the_one_device_state():
    """SGD's momentum: a slice of 1/N of every weight's per replica, and each
    weight's slices in replica order are the momentum one device keeps."""
    case = zoo.BY_NAME["embedding_pooling"]
    examples = harness.BATCH_SHAPES["partial"]
    reference_model = case.build()
    case.compile(reference_model)
    initial = reference_model.get_weights()
    reference_model.fit(case.dataset(examples, harness.GLOBAL_BATCH), epochs=case.epochs,
                        verbose=0)
    strategy = strategy_columns.in_process(3)
    with strategy.scope():
        model = case.build()
        case.compile(model)
    model.set_weights(initial)
    tfdist.attach(model, strategy, communication=tfdist.communication.ShardedOptimizerState())
    model.fit(case.dataset(examples, harness.GLOBAL_BATCH), epochs=case.epochs, verbose=0)

    sizes = [int(np.prod(v.shape)) for v in model.trainable_variables]
    slice_sizes = [-(-size // 3) for size in sizes]  # each weight in 3 slices, the last padded
    optimizer, expected_optimizer = model.optimizer, reference_model.optimizer
    state = [v for v in optimizer.variables if v.shape != ()]
    assert [tuple(v.shape) for v in state] == [(n,) for n in slice_sizes]  # the momentum's slices
    expected = [np.asarray(v) for v in expected_optimizer.variables if v.shape != ()]
    assert [e.size for e in expected] == sizes
    for index, momentum in enumerate(expected):
        slices = [np.asarray(piece) for piece in state[index].value.values]
        assert len(slices) == 3  # one per replica, each a different part of the state
        joined = np.concatenate(slices)[:sizes[index]]
        np.testing.assert_allclose(joined, momentum.ravel(), rtol=0, atol=1e-5,
                                   err_msg=f"weight {index}")
