"""Runs a `tests.conformance.zoo.Case` on one device with plain Keras (the
reference) and through tfdist's entry points, and compares them.

Every tfdist run starts from the reference model's initial weights and reads
the same dataset in the same order, so any difference is tfdist's (or, for
Adam-like optimizers, float32 round-off amplified: `sensitivity` measures
that on one device by reversing the rows of every batch).
"""

import dataclasses
import functools
import json
import os
from typing import Dict, List, Optional

import keras
import numpy as np
import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tfdist._internal.keras import sliced_weights

# Batch shapes: examples for a global batch of 24 (a multiple of 1, 2, 3, 4).
GLOBAL_BATCH = 24
BATCH_SHAPES = {
    "even": 96,         # every batch splits evenly over 1..4 replicas
    "partial": 107,     # last batch of 11: uneven over 2, 3 and 4 replicas
    "tiny_last": 97,    # last batch of 1: fewer rows than replicas (empty ones)
}


@dataclasses.dataclass
class Result:
    """What a run leaves that a user looks at."""

    weights: List[np.ndarray]
    history: Dict[str, list]
    evaluation: Optional[Dict[str, float]] = None
    predictions: Optional[list] = None
    # The largest difference between a weight's copy on any replica and the
    # copy `get_weights` reads (the first replica's): None on one device.
    replica_spread: Optional[float] = None


def _inputs_only(dataset):
    return dataset.map(lambda x, *rest: (x,))


def _predictions(model, dataset):
    return [np.asarray(p) for p in tf.nest.flatten(
        model.predict(_inputs_only(dataset), verbose=0))]


def _replica_spread(model) -> Optional[float]:
    """How far any replica's copy of a weight is from the first replica's:
    `get_weights` reads only the first, so an update that missed a replica
    would not show in the weights compared. (A fully sharded weight's
    replicas hold different slices, all of which `get_weights` reads.)"""
    spreads = []
    for weight in model.weights:
        if sliced_weights.is_sliced(weight):
            continue
        variable = weight.value  # a tf.distribute variable under a strategy
        copies = [np.asarray(copy) for copy in getattr(variable, "values", (variable,))]
        spreads += [float(np.max(np.abs(copy - copies[0]), initial=0.0)) for copy in copies[1:]]
    return max(spreads) if spreads else None


def _finish(case, model, dataset, history) -> Result:
    result = Result(model.get_weights(), dict(history.history),
                    replica_spread=_replica_spread(model))
    if case.predicts and case.evaluates:
        result.evaluation = model.evaluate(dataset, verbose=0, return_dict=True)
    if case.predicts:
        result.predictions = _predictions(model, dataset)
    return result


def _compiled(case):
    model = case.build()
    case.compile(model)
    return model


def run_keras(case, examples: int, dataset_transform=None):
    """Plain Keras on one device (no strategy): (initial weights, Result)."""
    model = case.build()
    (case.reference_compile or case.compile)(model)
    initial = model.get_weights()
    dataset = case.dataset(examples, GLOBAL_BATCH * case.reference_batch_factor)
    if dataset_transform is not None:
        dataset = dataset_transform(dataset)
    history = model.fit(dataset, epochs=case.epochs, verbose=0, **case.fit_options)
    return initial, _finish(case, model, case.dataset(examples, GLOBAL_BATCH), history)


def _reverse_rows(dataset):
    """Every batch with its rows in reverse order: the same batches to the
    math, another summation order to float32."""
    return dataset.map(lambda *parts: tf.nest.map_structure(lambda t: tf.reverse(t, [0]), parts))


def sensitivity(case, examples: int, reference: Result) -> float:
    """How far float32 round-off alone moves this case on one device: the
    largest weight difference after reordering each batch's rows."""
    _, reordered = run_keras(case, examples, dataset_transform=_reverse_rows)
    return ref.largest_difference(reference.weights, reordered.weights)


@functools.lru_cache(maxsize=None)
def reference_of(case_name: str, examples: int):
    """`run_keras` of the zoo's family ``case_name`` on ``examples``, once
    per test process: (its initial weights, its `Result`)."""
    from conformance import zoo  # pylint: disable=import-outside-toplevel

    return run_keras(zoo.BY_NAME[case_name], examples)


def tolerance(case, examples: int, reference: Result) -> float:
    """The case's tolerance: its own, or (``"calibrated"``) a small multiple
    of what reordering rows does on one device."""
    if case.tolerance != "calibrated":
        return case.tolerance
    return max(1e-5, 4.0 * sensitivity(case, examples, reference))


def _model_under(case, strategy, initial):
    with strategy.scope():
        model = _compiled(case)
    model.set_weights(initial)
    return model


def run_attached(case, strategy, examples: int, initial, attach_options=None,
                 **fit_options) -> Result:
    """``tfdist.attach`` (with ``attach_options``: a dict, or a function of
    the model that returns one) + the user's unchanged fit / evaluate /
    predict (``fit_options``: added to the case's own)."""
    model = _model_under(case, strategy, initial)
    if callable(attach_options):
        attach_options = attach_options(model)
    model = tfdist.attach(model, strategy, **(attach_options or {}))
    dataset = case.dataset(examples, GLOBAL_BATCH)
    history = model.fit(dataset, epochs=case.epochs, verbose=0,
                        **dict(case.fit_options, **fit_options))
    return _finish(case, model, dataset, history)


def run_trainer(case, strategy, examples: int, initial, trainer_options=None) -> Result:
    """``tfdist.Trainer(model, strategy).fit`` on the dataset of global
    batches (with ``trainer_options``)."""
    model = _model_under(case, strategy, initial)
    history = tfdist.Trainer(model, strategy, **(trainer_options or {})).fit(
        case.dataset(examples, GLOBAL_BATCH), epochs=case.epochs, verbose=0, **case.fit_options)
    return Result(model.get_weights(), dict(history.history), replica_spread=_replica_spread(model))


def run_custom_loop(case, strategy, examples: int, initial,
                    compiled_optimizer: bool = False) -> Result:
    """A hand-written loop on `tfdist.replica`: the README's custom loop,
    with SGD and momentum, or (``compiled_optimizer``) the optimizer the
    case compiles (a loss-scale optimizer's loss scaled as Keras' custom
    loops do: ``optimizer.scale_loss``)."""
    model = _model_under(case, strategy, initial)
    with strategy.scope():
        optimizer = (model.optimizer if compiled_optimizer
                     else keras.optimizers.SGD(0.1, momentum=0.9))
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)

    def replica_step(batch):
        with tf.GradientTape() as tape:
            predictions = model(batch.x, training=True)
            loss = tfdist.replica.losses.replica_loss(loss_fn(batch.y, predictions), batch, model)
            loss = optimizer.scale_loss(loss)
        gradients = tape.gradient(loss, model.trainable_variables)
        tfdist.replica.gradients.apply_gradients(optimizer, gradients, model.trainable_variables)

    loop = tfdist.loops.host_loop.HostLoop(strategy, replica_step, steps_per_execution=3)
    dataset = case.dataset(examples, GLOBAL_BATCH)
    for _ in range(case.epochs):
        for _ in loop.executions(tfdist.data.distribute(strategy, dataset,
                                                        avoid_empty_replicas=True)):
            pass
    return Result(model.get_weights(), {}, replica_spread=_replica_spread(model))


ENTRY_POINTS = {"attach": run_attached, "trainer": run_trainer, "custom_loop": run_custom_loop}


def assert_matches(reference: Result, result: Result, tolerance: float, *,
                   compare_history: bool = True) -> None:
    """Weights to ``tolerance``; history, evaluate and predict to the same
    tolerance (absolute) plus 1e-5 relative: the user's curves and numbers."""
    assert len(result.weights) == len(reference.weights)
    assert not result.replica_spread, f"the replicas' copies differ by {result.replica_spread}"
    for index, (want, got) in enumerate(zip(reference.weights, result.weights)):
        np.testing.assert_allclose(got, want, rtol=0, atol=tolerance,
                                   err_msg=f"weight {index}")
    if compare_history and result.history:
        assert sorted(result.history) == sorted(reference.history), (
            sorted(result.history), sorted(reference.history))
        for key, values in reference.history.items():
            np.testing.assert_allclose(result.history[key], values, rtol=1e-5,
                                       atol=tolerance, err_msg=f"history {key}")
    if reference.evaluation is not None and result.evaluation is not None:
        assert sorted(result.evaluation) == sorted(reference.evaluation)
        for key, value in reference.evaluation.items():
            np.testing.assert_allclose(result.evaluation[key], value, rtol=1e-5,
                                       atol=tolerance, err_msg=f"evaluate {key}")
    if reference.predictions is not None and result.predictions is not None:
        for index, (want, got) in enumerate(zip(reference.predictions, result.predictions)):
            assert got.shape == want.shape, (index, got.shape, want.shape)
            np.testing.assert_allclose(got, want, rtol=0, atol=max(tolerance, 1e-5),
                                       err_msg=f"predict output {index}")


def record(row: dict) -> None:
    """Appends a result row for `scripts/conformance.py`'s tables (when it
    runs the matrix: ``TFDIST_CONFORMANCE_REPORT`` names the report)."""
    path = os.environ.get("TFDIST_CONFORMANCE_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as report:
            report.write(json.dumps(row) + "\n")


def largest_difference(reference: Result, result: Result) -> float:
    return max(float(abs(a - b).max()) for a, b in zip(reference.weights, result.weights))


def check_split(case, strategy, examples: int, initial, reference: Result, row: dict,
                attach_options, expected=None) -> None:
    """A way of splitting the model (``attach_options``, as `run_attached`
    takes them) against ``reference``, recorded in ``row``: equal within
    the case's tolerance, or, with ``expected`` ((ConfigurationError,
    pattern) or (UserWarning, pattern)), refused or warned of as named
    (then the test is skipped, saying why)."""
    import pytest  # pylint: disable=import-outside-toplevel

    if expected is not None:
        kind, message = expected
        if kind is UserWarning:
            with pytest.warns(UserWarning, match=message):
                run_attached(case, strategy, examples, initial, attach_options=attach_options)
            record(dict(row, outcome="warned"))
            pytest.skip(f"not exact by design, warned: {message}")
        with pytest.raises(kind, match=message):
            run_attached(case, strategy, examples, initial, attach_options=attach_options)
        record(dict(row, outcome="refused"))
        pytest.skip(f"refused, naming why: {message}")
    allowed = tolerance(case, examples, reference)
    try:
        result = run_attached(case, strategy, examples, initial, attach_options=attach_options)
        assert_matches(reference, result, allowed)
    except BaseException as error:
        record(dict(row, outcome="failed", error=f"{type(error).__name__}: {error}"[:300]))
        raise
    record(dict(row, outcome="passed", difference=largest_difference(reference, result),
                tolerance=allowed))


def takes_its_turn(case_name: str, layout, shape: str, layouts) -> bool:
    """Whether (``layout``, ``shape``) is ``case_name``'s one combination in
    a short form: the zoo's families take the layouts and the batch shapes
    in turn, so each runs with some family."""
    from conformance import zoo  # pylint: disable=import-outside-toplevel

    turn = [c.name for c in zoo.CASES].index(case_name)
    return (layout, shape) == (layouts[turn % len(layouts)],
                               tuple(BATCH_SHAPES)[turn % len(BATCH_SHAPES)])


def split_matrix(layouts, in_short_form, layout_id):
    """Every zoo family x layout x batch shape, as pytest parameters
    ``(case_name, layout, shape)`` named ``family-<layout_id(layout)>-shape``;
    those ``in_short_form(case_name, layout, shape)`` leaves out are marked
    ``conformance_full``."""
    import pytest  # pylint: disable=import-outside-toplevel
    from conformance import zoo  # pylint: disable=import-outside-toplevel

    for case in zoo.CASES:
        for layout in layouts:
            for shape in BATCH_SHAPES:
                marks = [] if in_short_form(case.name, layout, shape) else [
                    pytest.mark.conformance_full]
                yield pytest.param(case.name, layout, shape, marks=marks,
                                   id=f"{case.name}-{layout_id(layout)}-{shape}")
