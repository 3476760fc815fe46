"""The conformance axes beyond model families (`tests.conformance.axes`,
`tests.conformance.containers`), against single-device Keras:

* optimizers x sparse gradient patterns x sharding (none, the optimizer's
  state, the weights too);
* loss forms, metric forms and model forms;
* input containers x feeds (fit, evaluate and predict in each run);

each crossed with the mirrored strategies and the batch shapes, the
optimizers and the forms also with the entry points (`tfdist.attach`,
`tfdist.Trainer`, and for the optimizers a hand-written loop on
`tfdist.replica`) where they apply.

CI runs a covering design (`tests.support.covering`): for the optimizer
axis each optimizer on two sparse patterns (one table's lookups, one table
read twice), for the container axis the dict and nested containers
through every feed, and every value of every factor in some row;
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


def _parameters(factors: dict, short_form: list, name: str, applies=None):
    """Every row of ``factors``' product that ``applies``, marked full unless
    in ``short_form``."""
    keys = list(factors)
    short = {tuple(row[key] for key in keys) for row in short_form}
    for values in itertools.product(*factors.values()):
        if applies is not None and not applies(dict(zip(keys, values))):
            continue
        marks = [] if values in short else [pytest.mark.conformance_full]
        yield pytest.param(*values, marks=marks, id=f"{name}-" + "-".join(map(str, values)))


def _strategy(strategy_name: str):
    return strategy_columns.in_process(STRATEGIES[strategy_name])


# -- optimizers x sparse patterns x sharding -----------------------------------------

SHARDINGS = {"state": tfdist.communication.ShardedOptimizerState,
             "weights": tfdist.communication.FullySharded}
OPTIMIZER_FACTORS = {"optimizer": tuple(axes.OPTIMIZERS), "pattern": tuple(axes.SPARSE_PATTERNS),
                     "sharding": ("none", "state", "weights"), "strategy": tuple(STRATEGIES),
                     "shape": SHAPES,
                     "entry": tuple(harness.ENTRY_POINTS)}


def _optimizer_applies(row: dict) -> bool:
    """Sharding is an option of `tfdist.attach` and `tfdist.Trainer`, which
    a hand-written loop does not take."""
    if row["sharding"] == "none":
        return True
    return row["entry"] != "custom_loop"


@functools.lru_cache(maxsize=None)
def _case_reference(optimizer: str, pattern: str, examples: int):
    return harness.run_keras(axes.optimizer_case(optimizer, pattern), examples)


# CI: each optimizer on one table's lookups (IndexedSlices) and on one
# table read twice (duplicate rows within a batch), and every value of the
# other factors in some row; the full form every product.
CORE_PATTERNS = ("tokens", "one_table_twice")


def _pair_needed(pair: tuple) -> bool:
    first, _, second, second_value = pair
    return (first, second) == ("optimizer", "pattern") and second_value in CORE_PATTERNS


# Where a row is free, the short form spreads the sharding, the entry
# points and the batch shapes evenly; the strategy stays the first (the
# cheapest: 2 replicas).
OPTIMIZER_SHORT_FORM = covering.all_pairs(OPTIMIZER_FACTORS, _optimizer_applies,
                                          balance=("sharding", "entry", "shape"),
                                          needed=_pair_needed)


@pytest.mark.parametrize("optimizer,pattern,sharding,strategy_name,shape,entry", list(_parameters(
    OPTIMIZER_FACTORS, OPTIMIZER_SHORT_FORM, "optimizer", _optimizer_applies)))
def test_optimizer_on_gradient_pattern_equals_one_device(optimizer, pattern, sharding,
                                                         strategy_name, shape, entry):
    case = axes.optimizer_case(optimizer, pattern)
    examples = harness.BATCH_SHAPES[shape]
    initial, reference = _case_reference(optimizer, pattern, examples)
    options = {} if sharding == "none" else {"communication": SHARDINGS[sharding]()}
    row = dict(case=f"{optimizer} on {pattern}" + (
                   "" if sharding == "none" else f" (sharded {sharding})"),
               strategy=strategy_name, shape=shape, entry=entry)
    strategy = _strategy(strategy_name)
    runs = {
        "attach": lambda: harness.run_attached(case, strategy, examples, initial,
                                               attach_options=options),
        "trainer": lambda: harness.run_trainer(case, strategy, examples, initial,
                                               trainer_options=options),
        "custom_loop": lambda: harness.run_custom_loop(case, strategy, examples, initial,
                                                       compiled_optimizer=True),
    }
    _checked(row, reference, runs[entry])


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

FORM_ENTRIES = ("attach", "trainer")  # the hand-written loop writes its own loss
FORM_FACTORS = {"form": tuple(axes.FORMS), "strategy": tuple(STRATEGIES), "shape": SHAPES,
                "entry": FORM_ENTRIES}
_PLACES = list(itertools.product(STRATEGIES, SHAPES, FORM_ENTRIES))


def _form_applies(row: dict) -> bool:
    """A model with its own step runs through `tfdist.attach` (the Trainer
    takes compiled losses)."""
    return row["entry"] == "attach" or axes.FORMS[row["form"]].trainer


def _forms_short() -> list:
    """Each form once, at the next (strategy, batch shape, entry) in turn
    that applies to it."""
    rows, turn = [], 0
    for form in axes.FORMS:
        while True:
            strategy, shape, entry = _PLACES[turn % len(_PLACES)]
            turn += 1
            row = {"form": form, "strategy": strategy, "shape": shape, "entry": entry}
            if _form_applies(row):
                rows.append(row)
                break
    return rows


FORMS_SHORT = _forms_short()


@functools.lru_cache(maxsize=None)
def _form_reference(form: str, examples: int):
    return harness.run_keras(axes.FORMS[form], examples)


@pytest.mark.filterwarnings("ignore:Loss '_scalar_function' returns a scalar")
@pytest.mark.parametrize("form,strategy_name,shape,entry", list(_parameters(
    FORM_FACTORS, FORMS_SHORT, "form", _form_applies)))
def test_form_equals_one_device(form, strategy_name, shape, entry):
    case = axes.FORMS[form]
    examples = harness.BATCH_SHAPES[shape]
    initial, reference = _form_reference(form, examples)
    row = dict(case=form, strategy=strategy_name, shape=shape, entry=entry)
    _checked(row, reference, lambda: harness.ENTRY_POINTS[entry](
        case, _strategy(strategy_name), examples, initial))


def test_the_tagging_forms_mask_reaches_the_loss():
    """The masked forms test a mask at the output only if one gets there:
    on one device, labels under the padding do not change the loss."""
    import numpy as np

    model = axes.tagging_model()
    model.compile(loss="sparse_categorical_crossentropy")
    x, y = next(iter(axes.tagged_sequences(8, 8)))
    padding = x.numpy() == 0
    assert padding.any()
    other_labels = np.where(padding, (y.numpy() + 1) % axes.CLASSES, y.numpy())
    assert model.evaluate(x, y, verbose=0) == pytest.approx(
        model.evaluate(x, other_labels, verbose=0), abs=1e-7)


# -- input containers x feeds ---------------------------------------------------------

CONTAINER_FACTORS = {"container": containers.CONTAINERS, "feed": containers.FEEDS,
                     "strategy": tuple(STRATEGIES), "shape": SHAPES}


@functools.lru_cache(maxsize=None)
def _container_reference(container: str, feed: str, examples: int):
    return containers.reference(container, feed, examples)


def _container_pair_needed(pair: tuple) -> bool:
    """CI: the dict and nested containers through every feed, and every
    value of every factor in some row."""
    first, first_value, second, _ = pair
    return (first, second) == ("container", "feed") and first_value in ("dict", "nested")


@pytest.mark.parametrize("container,feed,strategy_name,shape", list(_parameters(
    CONTAINER_FACTORS, covering.all_pairs(CONTAINER_FACTORS, balance=("shape",),
                                          needed=_container_pair_needed), "container")))
def test_input_container_equals_one_device(container, feed, strategy_name, shape):
    examples = harness.BATCH_SHAPES[shape]
    initial, reference = _container_reference(container, feed, examples)
    row = dict(case=f"{container} x as {feed}", strategy=strategy_name, shape=shape,
               entry="attach")
    _checked(row, reference, lambda: containers.run(
        container, feed, examples, _strategy(strategy_name), initial))
