"""The conformance matrix: every model family of the zoo x every in-process
strategy x every batch shape x every entry point that applies, against
single-device Keras on the same data and order.

CI runs the short form (every family on an uneven partial batch over 3
replicas, the embedding families also with empty replicas, every entry
point at least once; token lookups on every strategy and batch shape are
the optimizer axis' rows, `tests.conformance.test_axes`);
``pytest tests/conformance --conformance=full``
runs the whole matrix (`scripts/conformance.py` writes its table for the docs).
"""

import functools

import pytest

from conformance import harness, zoo
from tests.support import strategy_columns

pytestmark = pytest.mark.conformance

STRATEGIES = strategy_columns.IN_PROCESS
# Where CI runs each family with `tfdist.attach`: the next of these in turn
# (the families in zoo order), so every family runs once and every strategy
# and batch shape with a third of them; the 4-replica column on a last batch
# of one row leaves replicas empty.
SHORT_FORM_PLACES = (("mirrored_3", "partial"), ("mirrored_4", "tiny_last"),
                     ("mirrored_2", "partial"))


def in_short_form(case, strategy: str, shape: str, entry: str) -> bool:
    """The combinations CI runs (the rest run with ``--conformance=full``)."""
    if entry == "attach":
        turn = [c.name for c in zoo.CASES].index(case.name)
        return (strategy, shape) == SHORT_FORM_PLACES[turn % len(SHORT_FORM_PLACES)]
    if case.name == "embedding_pooling" and (strategy, shape) == ("mirrored_3", "partial"):
        return True  # every entry point
    return (strategy, shape) == ("mirrored_2", "partial") and (
        case.name in {"dict_multi_io", "transformer_encoder"})


def _applies(case, strategy: str, entry: str):
    """None, or why this combination does not apply."""
    if entry == "trainer" and not case.trainer:
        return "the model's own step runs through `attach` (Trainer takes compiled losses)"
    if entry == "custom_loop" and not case.custom_loop:
        return "the hand-written loop is run on a few families (a plain compiled loss)"
    return None


def _matrix():
    for case in zoo.CASES:
        for strategy in STRATEGIES:
            for shape in harness.BATCH_SHAPES:
                for entry in harness.ENTRY_POINTS:
                    marks = []
                    if not in_short_form(case, strategy, shape, entry):
                        marks.append(pytest.mark.conformance_full)
                    yield pytest.param(case.name, strategy, shape, entry, marks=marks,
                                       id=f"{case.name}-{strategy}-{shape}-{entry}")


@functools.lru_cache(maxsize=None)
def _tolerance(case_name: str, examples: int) -> float:
    _, reference = harness.reference_of(case_name, examples)
    return harness.tolerance(zoo.BY_NAME[case_name], examples, reference)


@pytest.mark.parametrize("case_name,strategy_name,shape,entry", list(_matrix()))
def test_equals_one_device(case_name, strategy_name, shape, entry):
    case = zoo.BY_NAME[case_name]
    row = dict(case=case_name, strategy=strategy_name, shape=shape, entry=entry)
    reason = _applies(case, strategy_name, entry)
    if reason:
        harness.record(dict(row, outcome="n/a"))
        pytest.skip(reason)
    replicas = STRATEGIES[strategy_name]
    examples = harness.BATCH_SHAPES[shape]
    strategy = strategy_columns.in_process(replicas)
    initial, reference = harness.reference_of(case_name, examples)
    tolerance = _tolerance(case_name, examples)
    if case.not_exact_over_replicas and replicas > 1:
        with pytest.warns(UserWarning, match="synchronized"):
            harness.ENTRY_POINTS[entry](case, strategy, examples, initial)
        harness.record(dict(row, outcome="warned"))
        pytest.skip(f"not exact by design, warned: {case.not_exact_over_replicas}")
    try:
        result = harness.ENTRY_POINTS[entry](case, strategy, examples, initial)
        harness.assert_matches(reference, result, tolerance)
    except BaseException as error:
        harness.record(dict(row, outcome="failed", error=f"{type(error).__name__}: {error}"[:300]))
        raise
    difference = max(float(abs(a - b).max()) for a, b in zip(reference.weights, result.weights))
    harness.record(dict(row, outcome="passed", difference=difference, tolerance=tolerance))
