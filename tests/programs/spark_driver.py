"""A Spark driver for tests: a local Spark on 127.0.0.1 runs
`tfdist.integrations.spark.run` and writes the chief's result (or the error) as JSON.

Run as its own process group by tests/integrations/test_spark.py, so the JVM, Spark's
Python workers and the training processes all end with it.
"""

import argparse
import functools
import json
import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def fail_on_worker(index: int):
    """A train_fn that raises on worker ``index`` and trains elsewhere."""
    tf_config = json.loads(os.environ["TF_CONFIG"])
    if tf_config["task"]["index"] == index:
        raise ValueError(f"deliberate failure on worker {index}")
    from tests.programs import engine_train
    return engine_train.train_reference_mlp()


def large_result():
    """A train_fn whose result (8 MB) is far larger than a pipe's buffer."""
    return "x" * (8 << 20)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--runs", default='[{"num_workers": 2}]',
                        help="JSON list of runs on one Spark session, each "
                             '{"num_workers": N, "fail_worker": I (optional), "large_result": true '
                             '(optional)}')
    parser.add_argument("--timeout_seconds", type=float, default=600)
    args = parser.parse_args()

    # Before the JVM starts: executors' Python is this interpreter, and the
    # tasks can import `tests` (train functions are pickled by reference).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    from pyspark.sql import SparkSession

    import tfdist.integrations.spark
    from tests.programs import engine_train

    spark = (SparkSession.builder.master(args.master).appName("tfdist-test")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false")
             .config("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    results = []
    try:
        for run in json.loads(args.runs):
            fail_worker = run.get("fail_worker")
            if run.get("large_result"):
                train_fn = large_result
            elif fail_worker is not None:
                train_fn = functools.partial(fail_on_worker, fail_worker)
            else:
                train_fn = engine_train.train_reference_mlp
            try:
                results.append({"result": tfdist.integrations.spark.run(
                    train_fn, run["num_workers"], spark=spark,
                    timeout_seconds=args.timeout_seconds)})
            except Exception as error:  # the test reads the error's type and message
                results.append({"error": type(error).__name__, "message": str(error)})
            print(f"run {run}: {sorted(results[-1])}", flush=True)
    finally:
        spark.stop()
    pathlib.Path(args.output).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
