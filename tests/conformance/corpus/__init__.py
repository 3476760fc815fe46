"""A corpus of published Keras programs, each run on one device with plain
Keras (the reference) and after ``tfdist.attach`` on 2 and 3 replicas.

Each module follows one published example (its ``SOURCE``): the same
layers, losses, optimizers, metrics and training calls, written again here
at toy sizes on generated stand-in data (the examples download their data
sets), with every change from the published program listed in its
``CHANGES`` (dropout rates set to 0, where randomness would make the
comparison inexact, among them). A module gives:

- ``build()``: the compiled model, as the example builds it (called under
  the strategy's scope for tfdist: the one line a user adds);
- ``data(examples)``: ``(x, y)`` arrays, or ``(dataset, None)`` for a
  program that feeds a tf.data dataset of batches;
- ``FIT``: the keyword arguments the example gives ``fit``;
- ``WARNS`` (optional): a warning tfdist gives for this program, and why.
"""

import dataclasses
import importlib
from typing import Optional

import keras
import numpy as np

import tfdist

PROGRAMS = ("text_classification_transformer", "ner_transformer", "bidirectional_lstm_imdb",
            "knowledge_distillation", "siamese_contrastive", "timeseries_weather",
            "structured_data", "multi_label_text", "collaborative_filtering",
            "text_classification_from_scratch")
EXAMPLES = 107  # in batches of 24 (the examples' own batch sizes shrunk with the data):
BATCH_SIZE = 24  # the last batch of 11 splits unevenly over 2 and 3 replicas


@dataclasses.dataclass
class Outcome:
    weights: list
    history: dict
    evaluation: Optional[dict]


def program(name: str):
    return importlib.import_module(f"conformance.corpus.{name}")


def run(name: str, strategy=None, initial=None, split=None) -> Outcome:
    """The program's build, fit and evaluate: on one device with plain Keras
    (no ``strategy``), else built in ``strategy.scope()`` from ``initial``
    weights and attached; ``split(model)``, if given, returns the further
    options of the added line (``communication=``, ``parallel=``)."""
    module = program(name)
    if strategy is None:
        model = module.build()
    else:
        with strategy.scope():
            model = module.build()
        model.set_weights(initial)
        tfdist.attach(model, strategy, **({} if split is None else split(model)))
    x, y = module.data(EXAMPLES)
    # (x, None): a tf.data dataset of batches, as the example feeds it
    batching = dict(batch_size=BATCH_SIZE) if y is not None else {}
    history = model.fit(x, y, shuffle=False, verbose=0, **batching, **module.FIT)
    evaluation = None
    if getattr(module, "EVALUATES", True):
        evaluation = model.evaluate(x, y, verbose=0, return_dict=True, **batching)
    return Outcome(model.get_weights(), dict(history.history), evaluation)


def reference(name: str):
    """(initial weights, one device's Outcome)."""
    initial = program(name).build().get_weights()
    return initial, run(name)


def assert_equal(expected: Outcome, actual: Outcome, tolerance: float) -> None:
    for index, (want, got) in enumerate(zip(expected.weights, actual.weights)):
        np.testing.assert_allclose(got, want, rtol=0, atol=tolerance, err_msg=f"weight {index}")
    assert sorted(actual.history) == sorted(expected.history)
    for key, values in expected.history.items():
        np.testing.assert_allclose(actual.history[key], values, rtol=1e-5, atol=tolerance,
                                   err_msg=f"history {key}")
    if expected.evaluation is not None:
        for key, value in expected.evaluation.items():
            np.testing.assert_allclose(actual.evaluation[key], value, rtol=1e-5, atol=tolerance,
                                       err_msg=f"evaluate {key}")
