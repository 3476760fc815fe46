"""The conformance matrix on real clusters: 2 MultiWorkerMirroredStrategy
workers and 1 worker + 1 parameter server, each task a real process with
its own TF_CONFIG on 127.0.0.1 (`tfdist-run`), against single-device Keras.

CI runs the embedding family on an uneven partial batch on both clusters,
and the dict model (StringLookup, a lookup table) under parameter servers;
``--conformance=full`` runs every family and batch shape.
"""

import json
import re

import numpy as np
import pytest

from conformance import harness, zoo
from tests.support import reference as ref, strategy_columns
from tests.support.launcher_harness import LauncherRun

pytestmark = pytest.mark.conformance  # and serial: tests/conftest.py SERIAL_MODULES

PROGRAM = ["python", "tests/conformance/cluster_program.py"]
CLUSTERS = strategy_columns.CLUSTERS
SHORT_FORM = {("embedding_pooling", "multi_worker_2", "partial"),
              ("embedding_lstm_masked", "multi_worker_2", "tiny_last"),
              ("embedding_pooling", "ps_1_worker", "partial"),
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
    examples = harness.BATCH_SHAPES[shape]
    initial, reference = harness.run_keras(case, examples)
    np.savez(tmp_path / "initial.npz", *initial)
    column = CLUSTERS[cluster]
    launcher_args, strategy, tasks = column.launcher_args, column.strategy, column.reporting_tasks
    args = [f"--case={case_name}", f"--examples={examples}", f"--strategy={strategy}",
            f"--initial={tmp_path / 'initial.npz'}", f"--output_dir={tmp_path / 'out'}"]
    with LauncherRun(launcher_args, PROGRAM + args) as run:
        code = run.wait(timeout=600)
    row = dict(case=case_name, strategy=cluster, shape=shape, entry="attach")
    if (cluster, case_name) in REFUSED:
        assert code != 0 and re.search(REFUSED[(cluster, case_name)], run.output), \
            run.output[-4000:]
        harness.record(dict(row, outcome="n/a"))
        return
    if code != 0:
        harness.record(dict(row, outcome="failed"))
    assert code == 0, run.output[-4000:]
    for task in tasks:
        with np.load(tmp_path / "out" / f"{task}-weights.npz") as weights, \
                np.load(tmp_path / "out" / f"{task}-predictions.npz") as predictions:
            logs = json.loads((tmp_path / "out" / f"{task}.json").read_text())
            result = harness.Result(
                [weights[f"arr_{i}"] for i in range(len(weights.files))], logs["history"],
                logs["evaluation"],
                [predictions[f"arr_{i}"] for i in range(len(predictions.files))] or None)
        tolerance = case.tolerance if case.tolerance != "calibrated" else max(
            1e-5, 4.0 * harness.sensitivity(case, examples, reference))
        try:
            harness.assert_matches(reference, result, tolerance)
        except AssertionError:
            harness.record(dict(row, outcome="failed"))
            raise
    difference = ref.largest_difference(reference.weights, result.weights)
    harness.record(dict(row, outcome="passed", difference=difference))
