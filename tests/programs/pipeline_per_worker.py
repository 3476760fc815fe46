"""A worker program for data x pipeline across processes: each
MultiWorkerMirroredStrategy worker (one replica) runs its rows through a
pipeline of its own over its 2 logical CPUs, tests/parallel/test_pipeline.py's
MLP cut after ``h2``; each stage's gradients are all-reduced over the
workers once per step. ``--fully_sharded``: each stage's weights, gradients
and Adam state sharded over the workers (data x pipeline x fully sharded);
``--stages_per_device=2``: cut after every layer, 4 stages on the 2 CPUs
(interleaved 1F1B); ``--checkpoint_dir``: checkpoints for fault tests.

Writes ``<output_dir>/<task>.json``: the history, evaluation, final weights
and (without ``--fully_sharded``) the devices of every weight's copy.
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
    parser.add_argument("--fully_sharded", action="store_true")
    parser.add_argument("--stages_per_device", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--checkpoint_dir", default=None)
    parser.add_argument("--checkpoint_every_steps", type=int, default=None)
    parser.add_argument("--step_delay", type=float, default=0.0,
                        help="seconds to sleep after each step (fault tests)")
    args = parser.parse_args()

    tfdist.strategies.configure_logical_cpus(2)  # (the replica's, then its second stage's)
    strategy = tfdist.make_strategy("multi_worker_mirrored", num_replicas=1)
    from tests.parallel import test_pipeline  # pylint: disable=import-outside-toplevel
    from tests.support import reference as ref, step_progress  # pylint: disable=import-outside-toplevel

    with strategy.scope():
        model = test_pipeline._model()  # pylint: disable=protected-access
    pipeline = tfdist.parallel.Pipeline(
        cuts=["h2"] if args.stages_per_device == 1 else ["h1", "h2", "h3"],
        micro_batches=args.micro_batches, stages_per_device=args.stages_per_device)
    model = tfdist.attach(
        model, strategy, parallel=pipeline,
        communication=tfdist.communication.FullySharded() if args.fully_sharded else None,
        checkpointing=tfdist.CheckpointOptions(args.checkpoint_dir,
                                               every_steps=args.checkpoint_every_steps))
    x, y, w = ref.classification_arrays(test_pipeline.EXAMPLES)
    history = model.fit(x, y, sample_weight=w, batch_size=8, epochs=args.epochs, shuffle=False,
                        verbose=0, callbacks=[step_progress.callback(model, args.step_delay)]
                        ).history
    result = {
        "history": history,
        "evaluation": model.evaluate(x, y, batch_size=8, verbose=0),
        "weights": [w.tolist() for w in model.get_weights()],
    }
    if not args.fully_sharded:
        result["copies"] = {weight.path: [copy.device for copy in weight.value.values]
                            for weight in model.weights}
    output = pathlib.Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    (output / f"{tfdist.cluster.task_name()}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
