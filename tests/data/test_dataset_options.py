"""A dataset's own tf.data options are kept, or a warning says what tfdist
overrides and why (issue 33, point 5; `tfdist.data.options`)."""

import warnings

import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tfdist.data import options as options_lib

POLICY = tf.data.experimental.AutoShardPolicy


def _with_options(dataset, *, shard=None, deterministic=None):
    options = tf.data.Options()
    if shard is not None:
        options.experimental_distribute.auto_shard_policy = shard
    if deterministic is not None:
        options.deterministic = deterministic
    return dataset.with_options(options)


@pytest.mark.parametrize("own, requested, used", [
    (None, "auto", "data"), (POLICY.FILE, "auto", "file"), (POLICY.OFF, "auto", "off"),
    (POLICY.DATA, "auto", "data"), (None, "file", "file"), (POLICY.FILE, "file", "file"),
])
def test_shard_policy_is_the_argument_or_else_the_datasets_own(own, requested, used):
    dataset = _with_options(tf.data.Dataset.range(4), shard=own)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert options_lib.shard_policy(requested, dataset) == used


def test_a_shard_policy_argument_that_overrides_the_datasets_own_is_a_warning():
    dataset = _with_options(tf.data.Dataset.range(4), shard=POLICY.FILE)
    with pytest.warns(UserWarning, match=r"auto_shard_policy=FILE.*shard_policy='data'"):
        assert options_lib.shard_policy("data", dataset) == "data"


def test_nondeterministic_order_is_kept_on_one_worker():
    dataset = _with_options(tf.data.Dataset.range(4), deterministic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        options = options_lib.input_options(dataset, "data", spans_workers=False)
    assert dataset.with_options(options).options().deterministic is False


def test_nondeterministic_order_across_workers_is_overridden_with_a_warning_saying_why():
    dataset = _with_options(tf.data.Dataset.range(4), deterministic=False)
    with pytest.warns(UserWarning, match="deterministic=False.*same global batches"):
        options = options_lib.input_options(dataset, "data", spans_workers=True)
    assert dataset.with_options(options).options().deterministic is True


@pytest.mark.parametrize("own", [POLICY.OFF, POLICY.FILE], ids=["OFF", "FILE"])
def test_training_on_a_dataset_with_its_own_shard_policy_equals_one_device(own, make_strategy):
    """OFF and FILE: a step's examples are what each worker read, so the
    global count is all-reduced instead of carried; still exact (70 rows,
    batch 16 on 3 replicas: partial and uneven last batch)."""
    expected, expected_history = ref.keras_fit(ref.global_batches(70, 16), 2, "adam")
    strategy = make_strategy(3)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    dataset = _with_options(ref.global_batches(70, 16), shard=own)
    history = tfdist.Trainer(model, strategy).fit(dataset, epochs=2, verbose=0).history
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history, history)
