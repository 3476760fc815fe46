"""Issue 15, point 4: tfdist programs on Spark executors, for real.

A local Spark (``local[2]``: one JVM, two task slots, bound to 127.0.0.1)
runs `tfdist.integrations.spark.run` four times on one session: 2 workers training (the
chief's weights and history compared with single-device Keras ``fit`` on
the same batches), 2 workers of which one raises, 3 workers on 2 slots, and
2 workers returning 8 MB.
The Spark driver runs in its own process group
(tests/programs/spark_driver.py), killed by pid when the tests end.
Skipped, with the reason, where pyspark (the ``[spark]`` extra) or a Java
runtime is missing; CI installs both.
"""

import os
import shutil

import pytest

from tests.support import reference as ref
from tests.support.engine_harness import run_driver
from tests.programs import engine_train

pytest.importorskip("pyspark", reason="the [spark] extra is not installed")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs a Java runtime (Debian: openjdk-17-jre-headless)",
                allow_module_level=True)

RUNS = [{"num_workers": 2}, {"num_workers": 2, "fail_worker": 1}, {"num_workers": 3},
        {"num_workers": 2, "large_result": True}]


@pytest.fixture(scope="module")
def spark_runs(tmp_path_factory):
    """The driver's results for RUNS, and its log."""
    output = tmp_path_factory.mktemp("spark") / "results.json"
    return run_driver("spark_driver.py", output, [], runs=RUNS)


def test_two_spark_tasks_train_like_one_device(spark_runs):
    results, log = spark_runs
    expected_model, expected_history = ref.keras_fit(
        ref.global_batches(engine_train.EXAMPLES, engine_train.BATCH), engine_train.EPOCHS)

    assert "result" in results[0], f"{results[0]}\n{log[-4000:]}"
    chief = results[0]["result"]
    assert chief["task"] == "worker-0"
    ref.assert_weights_equal_lists(expected_model, chief["weights"])
    ref.assert_logs_close(expected_history, chief["history"])


def test_a_failing_task_is_an_error_with_its_traceback(spark_runs):
    results, log = spark_runs
    assert results[1].get("error") == "SparkTrainingError", f"{results[1]}\n{log[-4000:]}"
    assert "deliberate failure on worker 1" in results[1]["message"]
    assert "spark task worker-1" in results[1]["message"]


def test_more_workers_than_task_slots_is_a_named_error(spark_runs):
    results, _ = spark_runs
    assert results[2].get("error") == "ConfigurationError", results[2]
    assert "`num_workers=3`" in results[2]["message"]
    assert "has 2" in results[2]["message"]


@pytest.mark.parametrize("arguments,named", [
    ({"num_workers": 0}, "num_workers"),
    ({"num_workers": 2, "timeout_seconds": -1}, "timeout_seconds"),
    ({"num_workers": 2, "train_fn": "train.py"}, "train_fn"),
])
def test_bad_arguments_are_named_before_spark_starts(arguments, named):
    import tfdist.integrations.spark
    from tfdist.errors import ConfigurationError

    arguments = dict(arguments)
    train_fn = arguments.pop("train_fn", engine_train.train_reference_mlp)
    with pytest.raises(ConfigurationError, match=named):
        tfdist.integrations.spark.run(train_fn, **arguments)


def test_a_result_larger_than_a_pipe_buffer_comes_back(spark_runs):
    """8 MB from the chief: read before the training process is joined
    (joined first, the process would wait for its reader until the timeout)."""
    results, log = spark_runs
    assert results[3].get("result") == "x" * (8 << 20), f"{str(results[3])[:300]}\n{log[-4000:]}"
