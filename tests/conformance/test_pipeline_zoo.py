"""The conformance zoo through a `tfdist.parallel.Pipeline`: every model
family cut into 2 and 3 stages on logical CPUs, each batch run as 3 or 5
micro-batches in both schedules, on every batch shape, against
single-device Keras on the same data and order (`harness.run_keras`).

Where the cut goes: evenly over the model's top-level layers (its
``model.layers``, inputs left out), so a functional model's skip
connections (the transformer's residuals, the dict model's shared hidden
layer) cross stages. The global batch is 24: 5 micro-batches of 5, 5, 5,
5, 4 rows; the partial last batch (11 rows) ends with an empty
micro-batch; the last batch of one row leaves 2 of 3 (4 of 5) empty.

Families a pipeline cannot equal one device on are not skipped: each
one's refusal (a clear error naming what it cannot cut) or warning is
asserted (`EXPECTED`).

CI runs one layout for every other family and for each family a pipeline
refuses or warns of (`in_short_form`); ``--conformance=full`` runs every
family x layout x batch shape.
"""


import keras
import pytest
import tensorflow as tf

import tfdist
from conformance import harness, zoo
from tfdist.errors import ConfigurationError

pytestmark = pytest.mark.conformance

# (stages, micro-batches, schedule)
LAYOUTS = ((2, 3, "1f1b"), (2, 5, "gpipe"), (3, 5, "1f1b"), (3, 3, "gpipe"))

# What a pipeline does instead of equalling one device, by family: the
# error (a regular expression) or the warning it gives.
_OWN_STEP = (ConfigurationError, r"this model overrides .*cannot cut a model's own step")
_BATCH_STATISTICS = (UserWarning, r"normalize each micro-batch by its own statistics")
EXPECTED = {
    "own_train_step": _OWN_STEP,
    "own_test_step": _OWN_STEP,
    "keras_io_gan": _OWN_STEP,
    "own_metrics_property": _OWN_STEP,
    "cnn_batch_norm": _BATCH_STATISTICS,
    "cnn_sync_batch_norm": _BATCH_STATISTICS,
}


def cuts_for(model: keras.Model, stages: int) -> list:
    """Names of the top-level layers after which each of ``stages`` stages
    ends, evenly spaced over the layers (inputs left out, never the last);
    a model of fewer layers gets one stage per layer."""
    layers = [layer.name for layer in model.layers
              if not isinstance(layer, keras.layers.InputLayer)]
    stages = min(stages, len(layers))
    return [layers[round(len(layers) * k / stages) - 1] for k in range(1, stages)]


def in_short_form(case_name: str, layout: tuple, shape: str) -> bool:
    """CI runs every other family (zoo order) once, and each family a
    pipeline refuses or warns of: layouts and batch shapes in turn, so
    every layout and shape runs with some; the full form every family."""
    turn = [c.name for c in zoo.CASES].index(case_name)
    if turn % 2 and case_name not in EXPECTED:
        return False
    return harness.takes_its_turn(case_name, layout, shape, LAYOUTS)


def _layout_id(layout) -> str:
    stages, micro_batches, schedule = layout
    return f"{stages}stages-m{micro_batches}-{schedule}"


def _options(layout):
    """`tfdist.attach`'s options for ``layout``, from the model (its layers'
    names are Keras' automatic ones, different in every build)."""
    stages, micro_batches, schedule = layout
    return lambda model: {"parallel": tfdist.parallel.Pipeline(
        cuts=cuts_for(model, stages), micro_batches=micro_batches, schedule=schedule)}


@pytest.mark.parametrize("case_name,layout,shape", list(harness.split_matrix(LAYOUTS, in_short_form, _layout_id)))
def test_a_pipeline_equals_one_device(case_name, layout, shape):
    case = zoo.BY_NAME[case_name]
    stages, micro_batches, schedule = layout
    row = dict(case=case_name, strategy=f"pipeline_{stages}x{micro_batches}_{schedule}",
               shape=shape, entry="attach")
    examples = harness.BATCH_SHAPES[shape]
    initial, reference = harness.reference_of(case_name, examples)
    strategy = tf.distribute.get_strategy()
    harness.check_split(case, strategy, examples, initial, reference, row, _options(layout),
                        EXPECTED.get(case_name))


def test_every_family_is_cut_into_two_stages_or_more():
    """(The matrix's cut rule: distinct cuts, never the last layer.)"""
    for case in zoo.CASES:
        model = case.build()
        names = [layer.name for layer in model.layers]
        for stages in (2, 3):
            cuts = cuts_for(model, stages)
            assert 1 <= len(set(cuts)) == len(cuts) <= stages - 1, (case.name, cuts)
            assert names[-1] not in cuts, (case.name, cuts)
