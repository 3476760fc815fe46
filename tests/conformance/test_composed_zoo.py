"""The conformance zoo through composed layouts (`tfdist.parallel.plan`):
every model family under MirroredStrategy over 2 replicas, each replica a
pipeline of 2 stages on its own logical CPUs (data x pipeline), and the
same with each stage's weights, gradients and optimizer state fully
sharded over the 2 replicas (data x pipeline x fully sharded), in both
schedules, on every batch shape, against single-device Keras on the same
data and order (`harness.run_keras`).

The cut is the pipeline zoo's (`test_pipeline_zoo.cuts_for`). Families a
composed layout cannot equal one device on are not skipped: each one's
refusal (a clear error naming what it cannot do) or warning is asserted
(`EXPECTED`).

CI runs every fourth family once, taking turns over the layouts and batch
shapes, and each family a layout refuses or warns of; ``--conformance=full``
runs every family x layout x batch shape.
"""


import pytest

import tfdist
from conformance import harness, zoo
from conformance.test_pipeline_zoo import EXPECTED as PIPELINE_EXPECTED, cuts_for
from tfdist.errors import ConfigurationError

pytestmark = pytest.mark.conformance

# (replicas, stages, micro-batches, schedule, fully sharded)
LAYOUTS = ((2, 2, 3, "1f1b", False), (2, 2, 3, "1f1b", True), (2, 2, 5, "gpipe", True))

# What a composed layout does instead of equalling one device, by family
# and whether it is fully sharded: the error (a regular expression) or the
# warning it gives.
EXPECTED = {(name, sharded): outcome for name, outcome in PIPELINE_EXPECTED.items()
            for sharded in (False, True)}
# (the optimizer's moving averages of the weights would be a whole copy per replica)
EXPECTED[("adamw_schedule_clipnorm_ema", True)] = (
    ConfigurationError, r"FullySharded\(\) with use_ema=True: not built yet")


def _layout_id(layout) -> str:
    replicas, stages, micro_batches, schedule, sharded = layout
    return (f"{replicas}x{stages}stages-m{micro_batches}-{schedule}"
            + ("-fully_sharded" if sharded else ""))


def in_short_form(case_name: str, layout: tuple, shape: str) -> bool:
    """CI: every fourth family (zoo order) and each family a layout refuses
    or warns of, once, layouts and batch shapes in turn."""
    turn = [c.name for c in zoo.CASES].index(case_name)
    if turn % 4 and (case_name, layout[-1]) not in EXPECTED:
        return False
    return harness.takes_its_turn(case_name, layout, shape, LAYOUTS)


def _options(layout):
    """`tfdist.attach`'s options for ``layout``, from the model (its layers'
    names are Keras' automatic ones, different in every build)."""
    _, stages, micro_batches, schedule, sharded = layout

    def options(model):
        chosen = {"parallel": tfdist.parallel.Pipeline(
            cuts=cuts_for(model, stages), micro_batches=micro_batches, schedule=schedule)}
        if sharded:
            chosen["communication"] = tfdist.communication.FullySharded()
        return chosen

    return options


@pytest.mark.parametrize("case_name,layout,shape", list(harness.split_matrix(LAYOUTS, in_short_form, _layout_id)))
def test_a_composed_layout_equals_one_device(case_name, layout, shape):
    case = zoo.BY_NAME[case_name]
    row = dict(case=case_name, strategy=f"composed_{_layout_id(layout)}", shape=shape,
               entry="attach")
    examples = harness.BATCH_SHAPES[shape]
    initial, reference = harness.reference_of(case_name, examples)
    strategy = tfdist.make_strategy("mirrored", num_replicas=layout[0])
    harness.check_split(case, strategy, examples, initial, reference, row, _options(layout),
                        EXPECTED.get((case_name, layout[-1])))
