"""The conformance axes beyond model families (`tests.conformance.axes`,
`tests.conformance.containers`), against single-device Keras:

* optimizers x sparse gradient patterns x sharded optimizer state;
* loss forms, metric forms and model forms;
* input containers x feeds (fit, evaluate and predict in each run);

each crossed with the mirrored strategies and the batch shapes.

CI runs a covering design: every pair of values of every two factors in
some row for the optimizer and container axes (`tests.support.covering`),
each form once with the (strategy, batch shape) pairs in turn for the
forms; ``pytest tests/conformance --conformance=full`` runs every product.
"""

import functools
import itertools

import pytest

import tfdist
from conformance import axes, containers, harness
from tests.support import covering, strategy_columns

pytestmark = pytest.mark.conformance

STRATEGIES = {"mirrored_2": 2, "mirrored_3": 3, "mirrored_4": 4}
SHAPES = tuple(harness.BATCH_SHAPES)


def _parameters(factors: dict, short_form: list, name: str):
    """Every row of ``factors``' product, marked full unless in ``short_form``."""
    keys = list(factors)
    short = {tuple(row[key] for key in keys) for row in short_form}
    for values in itertools.product(*factors.values()):
        marks = [] if values in short else [pytest.mark.conformance_full]
        yield pytest.param(*values, marks=marks, id=f"{name}-" + "-".join(map(str, values)))


def _strategy(strategy_name: str):
    return strategy_columns.in_process(STRATEGIES[strategy_name])


# -- optimizers x sparse patterns x sharded state ------------------------------------

OPTIMIZER_FACTORS = {"optimizer": tuple(axes.OPTIMIZERS), "pattern": tuple(axes.SPARSE_PATTERNS),
                     "sharded": (False, True), "strategy": tuple(STRATEGIES), "shape": SHAPES}


@functools.lru_cache(maxsize=None)
def _case_reference(optimizer: str, pattern: str, examples: int):
    return harness.run_keras(axes.optimizer_case(optimizer, pattern), examples)


@pytest.mark.parametrize("optimizer,pattern,sharded,strategy_name,shape", list(_parameters(
    OPTIMIZER_FACTORS, covering.all_pairs(OPTIMIZER_FACTORS), "optimizer")))
def test_optimizer_on_gradient_pattern_equals_one_device(optimizer, pattern, sharded,
                                                         strategy_name, shape):
    case = axes.optimizer_case(optimizer, pattern)
    examples = harness.BATCH_SHAPES[shape]
    initial, reference = _case_reference(optimizer, pattern, examples)
    options = {"communication": tfdist.communication.ShardedOptimizerState()} if sharded else {}
    row = dict(case=f"{optimizer} on {pattern}" + (" (sharded state)" if sharded else ""),
               strategy=strategy_name, shape=shape, entry="attach")
    _checked(row, reference, lambda: harness.run_attached(
        case, _strategy(strategy_name), examples, initial, attach_options=options))


def _checked(row, reference, run) -> None:
    """Runs and compares one combination, recording its row for the table."""
    try:
        result = run()
        harness.assert_matches(reference, result, 1e-5)
    except BaseException as error:
        harness.record(dict(row, outcome="failed", error=f"{type(error).__name__}: {error}"[:300]))
        raise
    harness.record(dict(row, outcome="passed",
                        difference=harness.largest_difference(reference, result)))


# -- loss, metric and model forms ---------------------------------------------------

FORM_FACTORS = {"form": tuple(axes.FORMS), "strategy": tuple(STRATEGIES), "shape": SHAPES}
_PLACES = list(itertools.product(STRATEGIES, SHAPES))
FORMS_SHORT = [{"form": form, "strategy": _PLACES[index % len(_PLACES)][0],
                "shape": _PLACES[index % len(_PLACES)][1]}
               for index, form in enumerate(axes.FORMS)]


@functools.lru_cache(maxsize=None)
def _form_reference(form: str, examples: int):
    return harness.run_keras(axes.FORMS[form], examples)


@pytest.mark.filterwarnings("ignore:Loss '_scalar_function' returns a scalar")
@pytest.mark.parametrize("form,strategy_name,shape",
                         list(_parameters(FORM_FACTORS, FORMS_SHORT, "form")))
def test_form_equals_one_device(form, strategy_name, shape):
    case = axes.FORMS[form]
    examples = harness.BATCH_SHAPES[shape]
    initial, reference = _form_reference(form, examples)
    row = dict(case=form, strategy=strategy_name, shape=shape, entry="attach")
    _checked(row, reference, lambda: harness.run_attached(
        case, _strategy(strategy_name), examples, initial))


# -- input containers x feeds ---------------------------------------------------------

CONTAINER_FACTORS = {"container": containers.CONTAINERS, "feed": containers.FEEDS,
                     "strategy": tuple(STRATEGIES), "shape": SHAPES}


@functools.lru_cache(maxsize=None)
def _container_reference(container: str, feed: str, examples: int):
    return containers.reference(container, feed, examples)


@pytest.mark.parametrize("container,feed,strategy_name,shape", list(_parameters(
    CONTAINER_FACTORS, covering.all_pairs(CONTAINER_FACTORS), "container")))
def test_input_container_equals_one_device(container, feed, strategy_name, shape):
    examples = harness.BATCH_SHAPES[shape]
    initial, reference = _container_reference(container, feed, examples)
    row = dict(case=f"{container} x as {feed}", strategy=strategy_name, shape=shape,
               entry="attach")
    _checked(row, reference, lambda: containers.run(
        container, feed, examples, _strategy(strategy_name), initial))
