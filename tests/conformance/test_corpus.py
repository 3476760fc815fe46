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

import pytest

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
