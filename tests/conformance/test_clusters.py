"""The conformance matrix on real clusters: 2 MultiWorkerMirroredStrategy
workers and 1 worker + 1 parameter server, each task a real process with
its own TF_CONFIG on 127.0.0.1 (`tfdist-run`), against single-device Keras.

CI runs the masked Embedding + LSTM family with empty replicas across
workers, and the dict model (StringLookup, a lookup table) under parameter
servers;
``--conformance=full`` runs every family and batch shape.

The axes (`tests.conformance.axes`: optimizers on every gradient pattern,
with and without sharded optimizer state; loss, metric and model forms) run
on the clusters too: CI a few rows where a cluster differs from the
in-process strategies (sparse gradients summed across workers, sharded
state across workers, masks under parameter servers); the full form every
combination on every batch shape.
"""

import json
import re
import sys

import numpy as np
import pytest

from conformance import axes, harness, zoo
from tests.support import reference as ref, strategy_columns
from tests.support.launcher_harness import LauncherRun

pytestmark = pytest.mark.conformance  # and serial: tests/conftest.py SERIAL_MODULES

PROGRAM = [sys.executable, "tests/conformance/cluster_program.py"]
CLUSTERS = strategy_columns.CLUSTERS
# (Sparse gradients summed across workers and under parameter servers: the
# axes' rows below.)
SHORT_FORM = {("embedding_lstm_masked", "multi_worker_2", "tiny_last"),
              ("dict_multi_io", "ps_1_worker", "partial")}
# Families whose data or step a cluster column cannot take, with the reason.
NOT_ON = {
    ("ps_1_worker", "mixed_float16_embedding"):
        "parameter servers run no loss-scale agreement across workers (a single worker here)",
}


def _matrix():
    for case in zoo.CASES:
        for cluster in CLUSTERS:
            for shape in harness.BATCH_SHAPES:
                marks = [] if (case.name, cluster, shape) in SHORT_FORM else [
                    pytest.mark.conformance_full]
                yield pytest.param(case.name, cluster, shape, marks=marks,
                                   id=f"{case.name}-{cluster}-{shape}")


# What a cluster refuses by design: the run must end with this clear error.
_PS_XLA = "is not supported under ParameterServerStrategy: XLA compiles the step on a worker"
REFUSED = {
    ("ps_1_worker", "gradient_accumulation"):
        "gradient_accumulation_steps` \\(2\\) is not supported under ParameterServerStrategy",
    ("ps_1_worker", "jit_compile"): _PS_XLA,
    ("ps_1_worker", "mixed_float16_jit"): _PS_XLA,
}


@pytest.mark.parametrize("case_name,cluster,shape", list(_matrix()))
def test_cluster_equals_one_device(tmp_path, case_name, cluster, shape):
    case = zoo.BY_NAME[case_name]
    if (cluster, case_name) in NOT_ON:
        pytest.skip(NOT_ON[(cluster, case_name)])
    if case.not_exact_over_replicas and cluster == "multi_worker_2":
        pytest.skip(f"not exact by design (warned): {case.not_exact_over_replicas}")
    _run_and_compare(tmp_path, case, cluster, shape, REFUSED.get((cluster, case_name)))


def _run_and_compare(tmp_path, case, cluster, shape, refused=None, program_args=(),
                     row_name=None):
    """Runs ``case`` on ``cluster`` and compares every reporting task's
    result with one device's; ``refused``: the clear error the run must end
    with instead."""
    examples = harness.BATCH_SHAPES[shape]
    initial, reference = harness.run_keras(case, examples)
    np.savez(tmp_path / "initial.npz", *initial)
    column = CLUSTERS[cluster]
    launcher_args, strategy, tasks = column.launcher_args, column.strategy, column.reporting_tasks
    args = [f"--case={case.name}", f"--examples={examples}", f"--strategy={strategy}",
            f"--initial={tmp_path / 'initial.npz'}", f"--output_dir={tmp_path / 'out'}",
            *program_args]
    with LauncherRun(launcher_args, PROGRAM + args) as run:
        code = run.wait(timeout=600)
    row = dict(case=row_name or case.name, strategy=cluster, shape=shape, entry="attach")
    if refused is not None:
        assert code != 0 and re.search(refused, run.output), run.output[-4000:]
        harness.record(dict(row, outcome="n/a"))
        return
    if code != 0:
        harness.record(dict(row, outcome="failed"))
    assert code == 0, run.output[-4000:]
    tolerance = harness.tolerance(case, examples, reference)  # once: it may train again
    for task in tasks:
        with np.load(tmp_path / "out" / f"{task}-weights.npz") as weights, \
                np.load(tmp_path / "out" / f"{task}-predictions.npz") as predictions:
            logs = json.loads((tmp_path / "out" / f"{task}.json").read_text())
            result = harness.Result(
                [weights[f"arr_{i}"] for i in range(len(weights.files))], logs["history"],
                logs["evaluation"],
                [predictions[f"arr_{i}"] for i in range(len(predictions.files))] or None)
        try:
            harness.assert_matches(reference, result, tolerance)
        except AssertionError:
            harness.record(dict(row, outcome="failed"))
            raise
    difference = ref.largest_difference(reference.weights, result.weights)
    harness.record(dict(row, outcome="passed", difference=difference))


# -- the axes on the clusters ---------------------------------------------------------

AXIS_SHORT_FORM = {
    # A position embedding's entries summed across workers, the state sharded across them.
    ("adam-positions", True, "multi_worker_2", "partial"),
    # Both kinds of entries in one table, applied on a parameter server.
    ("rmsprop-tokens_and_positions_one_table", False, "ps_1_worker", "tiny_last"),
    # A mask at the output in metrics, on a parameter server.
    ("metric-mask_at_output", False, "ps_1_worker", "partial"),
}


def _axis_matrix():
    names = [f"{optimizer}-{pattern}" for optimizer in axes.OPTIMIZERS
             for pattern in axes.SPARSE_PATTERNS] + list(axes.FORMS)
    for name in names:
        for sharded in ((False, True) if name not in axes.FORMS else (False,)):
            for cluster in CLUSTERS:
                if sharded and cluster == "ps_1_worker":
                    continue  # refused by design (tests/communication/test_sharding.py)
                for shape in harness.BATCH_SHAPES:
                    marks = [] if (name, sharded, cluster, shape) in AXIS_SHORT_FORM else [
                        pytest.mark.conformance_full]
                    state = "-sharded" if sharded else ""
                    yield pytest.param(name, sharded, cluster, shape, marks=marks,
                                       id=f"{name}{state}-{cluster}-{shape}")


@pytest.mark.filterwarnings("ignore:Loss '_scalar_function' returns a scalar")
@pytest.mark.parametrize("case_name,sharded,cluster,shape", list(_axis_matrix()))
def test_axis_on_a_cluster_equals_one_device(tmp_path, case_name, sharded, cluster, shape):
    case = axes.case_named(case_name)
    refused = (_PS_XLA if cluster == "ps_1_worker" and case_name.endswith("_under_xla")
               else None)
    _run_and_compare(tmp_path, case, cluster, shape, refused,
                     program_args=["--sharded_state"] if sharded else [],
                     row_name=case_name + (" (sharded state)" if sharded else ""))
