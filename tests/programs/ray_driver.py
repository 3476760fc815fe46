"""A Ray driver for tests: a local Ray cluster on 127.0.0.1 runs Ray
Train's TensorflowTrainer over `engine_train.ray_train_loop` (via
`tfdist.integrations.ray.tensorflow_trainer`) and writes, per run, Ray's result and each
worker's output as JSON.

Run as its own process by tests/integrations/test_ray.py, which kills it and every
process it started (Ray's GCS, raylet and worker actors) by pid.
"""

import argparse
import json
import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("--work_dir", required=True)
    parser.add_argument("--runs", default='[{"num_workers": 2}]',
                        help='JSON list: {"num_workers": N, "max_failures": F, "kill_rank": R}')
    args = parser.parse_args()

    # Before Ray starts its processes: they inherit this environment.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # A one-node cluster on loopback: Ray's processes then report 127.0.0.1
    # as their address (else the address that routes outwards), and Ray
    # Train builds TF_CONFIG from it.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import ray

    import tfdist.integrations.ray
    from tests.programs import engine_train

    ray.init(num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1",
             object_store_memory=200 * 1024 * 1024, configure_logging=False)
    results = []
    try:
        for index, run in enumerate(json.loads(args.runs)):
            output_dir = pathlib.Path(args.work_dir) / f"run{index}"
            trainer = tfdist.integrations.ray.tensorflow_trainer(
                engine_train.ray_train_loop, run["num_workers"],
                storage_path=str(pathlib.Path(args.work_dir) / "ray_storage"),
                name=f"run{index}", max_failures=run.get("max_failures", 0),
                config={"output_dir": str(output_dir), "kill_rank": run.get("kill_rank")},
            )
            entry = {}
            try:
                result = trainer.fit()
                entry["metrics"] = {k: v for k, v in result.metrics.items()
                                    if isinstance(v, (int, float, str))}
                entry["checkpoint"] = result.checkpoint.path if result.checkpoint else None
                entry["error"] = repr(result.error) if result.error else None
            except Exception as error:  # the test reads it
                entry["error"] = f"{type(error).__name__}: {error}"
            entry["workers"] = {path.stem: json.loads(path.read_text())
                                for path in sorted(output_dir.glob("worker-*.json"))}
            entry["killed_pid"] = ((output_dir / "killed-once").read_text()
                                   if (output_dir / "killed-once").exists() else None)
            results.append(entry)
            print(f"run {run}: error={entry.get('error')}", flush=True)
    finally:
        ray.shutdown()
    pathlib.Path(args.output).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
