"""A worker program for data x pipeline across processes: each
MultiWorkerMirroredStrategy worker (one replica) runs its rows through a
pipeline of its own over its 2 logical CPUs, tests/parallel/test_pipeline.py's
MLP cut after ``h2``; each stage's gradients are all-reduced over the
workers once per step.

Writes ``<output_dir>/<task>.json``: the history, evaluation, final weights
and the devices of every weight's copy.
"""

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import tfdist  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--micro_batches", type=int, default=3)
    args = parser.parse_args()

    tfdist.strategies.configure_logical_cpus(2)  # (the replica's, then its second stage's)
    strategy = tfdist.make_strategy("multi_worker_mirrored", num_replicas=1)
    from tests.parallel import test_pipeline  # pylint: disable=import-outside-toplevel
    from tests.support import reference as ref  # pylint: disable=import-outside-toplevel

    with strategy.scope():
        model = test_pipeline._model()  # pylint: disable=protected-access
    pipeline = tfdist.parallel.Pipeline(cuts=["h2"], micro_batches=args.micro_batches)
    model = tfdist.attach(model, strategy, parallel=pipeline)
    x, y, w = ref.classification_arrays(test_pipeline.EXAMPLES)
    history = model.fit(x, y, sample_weight=w, batch_size=8, epochs=2, shuffle=False,
                        verbose=0).history
    result = {
        "history": history,
        "evaluation": model.evaluate(x, y, batch_size=8, verbose=0),
        "weights": [w.tolist() for w in model.get_weights()],
        "copies": {weight.path: [copy.device for copy in weight.value.values]
                   for weight in model.weights},
    }
    output = pathlib.Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    (output / f"{tfdist.cluster.task_name()}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
