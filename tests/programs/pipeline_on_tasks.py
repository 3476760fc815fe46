"""A chief program for pipeline tests across processes: trains
tests/parallel/test_pipeline.py's MLP with one stage per task of the
cluster (`tfdist.parallel.cluster_stages`): the chief and the worker
servers that ``tfdist-run --workers_serve`` starts.

Writes ``<output_dir>/chief-0.json``: the history, evaluation,
predictions, final weights, and the device of every weight.
"""

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import tfdist  # noqa: E402

CUTS = {2: ["h2"], 3: ["h1", "h3"], 4: ["h1", "h2", "h3"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--micro_batches", type=int, default=4)
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--checkpoint_dir", default=None)
    parser.add_argument("--checkpoint_every_steps", type=int, default=None)
    parser.add_argument("--step_delay", type=float, default=0.0,
                        help="seconds to sleep after each step (fault tests)")
    args = parser.parse_args()

    devices = tfdist.parallel.task_devices(timeout_seconds=60)
    from tests.parallel import test_pipeline  # pylint: disable=import-outside-toplevel
    from tests.support import reference as ref, step_progress  # pylint: disable=import-outside-toplevel

    model = test_pipeline._model()  # pylint: disable=protected-access
    pipeline = tfdist.parallel.Pipeline(
        cuts=CUTS[len(devices)], micro_batches=args.micro_batches, schedule=args.schedule,
        devices=devices)
    model = tfdist.attach(model, parallel=pipeline, checkpointing=tfdist.CheckpointOptions(
        args.checkpoint_dir, every_steps=args.checkpoint_every_steps))
    x, y, w = ref.classification_arrays(test_pipeline.EXAMPLES)
    history = model.fit(x, y, sample_weight=w, batch_size=args.batch_size, epochs=args.epochs,
                        shuffle=False, verbose=0,
                        callbacks=[step_progress.callback(model, args.step_delay)]).history
    result = {
        "history": history,
        "evaluation": model.evaluate(x, y, batch_size=args.batch_size, verbose=0),
        "predictions": model.predict(x, batch_size=args.batch_size, verbose=0).tolist(),
        "weights": [w.tolist() for w in model.get_weights()],
        "devices": {weight.path: weight.value.device for weight in model.weights},
        "stage_devices": devices,
    }
    output = pathlib.Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    (output / "chief-0.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
