"""A zoo case, or a case of the axes (`tests.conformance.axes`), on a real
cluster: run under ``tfdist-run`` as every worker
(MultiWorkerMirroredStrategy) or as the chief of a parameter-server cluster.

Starts from the initial weights the test wrote (``--initial``, an .npz of the
one-device reference's), trains with ``tfdist.attach`` + unchanged
``model.fit`` / ``evaluate`` / ``predict``, and writes
``<output_dir>/<task>.npz`` (weights, predictions) and ``<task>.json``
(history, evaluation) for the test to compare with one device.
"""

import argparse
import json
import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

import tfdist  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", required=True)
    parser.add_argument("--examples", type=int, required=True)
    parser.add_argument("--initial", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--strategy", default="multi_worker_mirrored",
                        choices=["multi_worker_mirrored", "parameter_server"])
    parser.add_argument("--sharded_state", action="store_true",
                        help="attach with communication=ShardedOptimizerState()")
    args = parser.parse_args()

    strategy = tfdist.make_strategy(args.strategy)
    import numpy as np  # pylint: disable=import-outside-toplevel

    from conformance import axes, harness, zoo  # pylint: disable=import-outside-toplevel

    case = zoo.BY_NAME[args.case] if args.case in zoo.BY_NAME else axes.case_named(args.case)
    with np.load(args.initial) as stored:
        initial = [stored[f"arr_{i}"] for i in range(len(stored.files))]
    fit_options = {}
    if args.strategy == "parameter_server":  # its epochs have no natural end
        fit_options["steps_per_epoch"] = -(-args.examples // harness.GLOBAL_BATCH)
    attach_options = ({"communication": tfdist.communication.ShardedOptimizerState()}
                      if args.sharded_state else None)
    result = harness.run_attached(case, strategy, args.examples, initial,
                                  attach_options=attach_options, **fit_options)
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    name = f"{task.get('type', 'chief')}-{task.get('index', 0)}"
    output = pathlib.Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    np.savez(output / f"{name}-weights.npz", *result.weights)
    # bfloat16 has no NumPy file format: float32 holds its values exactly.
    np.savez(output / f"{name}-predictions.npz",
             *[np.asarray(p, np.float32) for p in result.predictions or []])
    (output / f"{name}.json").write_text(json.dumps(
        {"history": result.history, "evaluation": result.evaluation}))


if __name__ == "__main__":
    main()
