"""The corpus of published programs (`tests.conformance.corpus`), each on
2 and 3 replicas after ``tfdist.attach`` against the same program on one
device with plain Keras: weights, the History and ``evaluate`` to 1e-5.

A program tfdist cannot make exact (``EXACT = False``) must give the
warning that says why (``WARNS``); so must a program that is exact but
leans on an assumption tfdist states (a loss that returns a scalar).
CI runs each program on one of the two replica counts, 2 and 3 in turn;
``--conformance=full`` runs both.
"""

import functools
import warnings

import keras
import pytest
import tensorflow as tf

import tfdist
from conformance import corpus
from tests.support import short_form, strategy_columns

pytestmark = pytest.mark.conformance


@functools.lru_cache(maxsize=None)
def _reference(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return corpus.reference(name)


@pytest.mark.parametrize("name,replicas", short_form.in_turn(
    corpus.PROGRAMS, (2, 3), mark=pytest.mark.conformance_full, ids=corpus.PROGRAMS))
def test_published_program_equals_one_device(name, replicas):
    module = corpus.program(name)
    initial, reference = _reference(name)
    strategy = strategy_columns.in_process(replicas)
    expected_warning = getattr(module, "WARNS", None)
    if expected_warning:
        with pytest.warns(UserWarning, match=expected_warning):
            result = corpus.run(name, strategy, initial)
    else:
        result = corpus.run(name, strategy, initial)
    if getattr(module, "EXACT", True):
        corpus.assert_equal(reference, result, 1e-5)
    else:
        with pytest.raises(AssertionError):
            corpus.assert_equal(reference, result, 1e-5)


def _fully_sharded(model):
    return {"communication": tfdist.communication.FullySharded()}


def _two_stages(model):
    """A pipeline cut after the first top-level layer that is not an input
    (the program's layers, known before Keras builds it)."""
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    return {"parallel": tfdist.parallel.Pipeline(cuts=[layers[0].name], micro_batches=2)}


# (replicas, options); a pipeline under no strategy, as its guide writes it
# (a model built under a one-device strategy's scope is not placed yet:
# docs/known-limits.md).
SPLITS = {"fully_sharded": (3, _fully_sharded), "pipeline": (None, _two_stages)}
# What each way of splitting refuses in the corpus, and why (a change here is
# a change users see): the rest equal one device.
REFUSED = {
    "fully_sharded": {"knowledge_distillation": "has no call"},   # (its optimizer built in-step)
    "pipeline": {"knowledge_distillation": "overrides train_step"},
}
# Run, with a warning naming why they are not one device's.
WARNED = {"pipeline": {"siamese_contrastive": "normalize each micro-batch"}}
# Known defects this test found, open (docs/known-limits.md): strict, so a
# fix shows here.
KNOWN_DEFECTS = {}


# CI: a subclassed program (built on its first batch, its layers unbuilt
# after `model.build`) under a pipeline and fully sharded with its tables;
# --conformance=full runs every pair (tests/communication/test_fully_sharded.py
# holds fully sharded weights to one device in CI).
IN_CI = {("collaborative_filtering", "pipeline"), ("collaborative_filtering", "fully_sharded")}


def _marks(name, split) -> list:
    marks = [] if (name, split) in IN_CI else [pytest.mark.conformance_full]
    if (name, split) in KNOWN_DEFECTS:
        marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_DEFECTS[(name, split)]))
    return marks


@pytest.mark.parametrize("name,split", [
    pytest.param(name, split, marks=_marks(name, split))
    for name in corpus.PROGRAMS for split in sorted(SPLITS)])
def test_published_program_with_a_split_model_equals_one_device(name, split):
    """The one added line with ``communication=FullySharded()`` (3 replicas)
    or a two-stage ``parallel=Pipeline`` (one replica), programs Keras
    builds on their first batch included: equal to one device, or refused
    for a reason listed in `REFUSED`, never for being built late."""
    module = corpus.program(name)
    if not getattr(module, "EXACT", True):
        pytest.skip("not exact by design (test_published_program_equals_one_device)")
    initial, reference = _reference(name)
    replicas, options = SPLITS[split]
    strategy = (tf.distribute.get_strategy() if replicas is None
                else strategy_columns.in_process(replicas))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = corpus.run(name, strategy, initial, split=options)
        except tfdist.errors.ConfigurationError as error:
            assert name in REFUSED[split], f"{name} refused under {split}: {error}"
            assert REFUSED[split][name] in str(error), error
            return
    assert name not in REFUSED[split], f"{name} now runs under {split}: update REFUSED"
    warned = WARNED.get(split, {}).get(name)
    if warned:
        assert any(warned in str(w.message) for w in caught), [str(w.message) for w in caught]
        return
    corpus.assert_equal(reference, result, 1e-5)
