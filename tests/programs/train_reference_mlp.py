"""A worker program for multi-process tests: trains tests/reference.py's MLP.

Run under tfdist-run (or with TF_CONFIG by hand). Writes
``<output_dir>/<task>.json`` with the history and final weights, which the
tests compare with single-device Keras `fit` on the same data.
"""

import argparse
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import tfdist  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--checkpoint_dir", default=None)
    parser.add_argument("--replicas_per_worker", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--examples", type=int, default=70)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--checkpoint_every_steps", type=int, default=None)
    parser.add_argument("--step_delay", type=float, default=0.0)
    parser.add_argument("--log_every_steps", type=int, default=2)
    parser.add_argument("--timeout_seconds", type=float, default=0.0,
                        help="per-collective timeout; 0: none (tfdist's default)")
    args = parser.parse_args()

    strategy = tfdist.make_strategy(
        "multi_worker_mirrored", num_replicas=args.replicas_per_worker,
        timeout_seconds=args.timeout_seconds or None,
    )
    import keras  # pylint: disable=import-outside-toplevel

    from tests import reference as ref  # pylint: disable=import-outside-toplevel

    class Slow(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(args.step_delay)

    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    trainer = tfdist.Trainer(
        model, strategy, checkpoint_dir=args.checkpoint_dir,
        checkpoint_every_steps=args.checkpoint_every_steps,
        log_every_steps=args.log_every_steps,
    )
    dataset = ref.global_batches(args.examples, args.batch_size)
    history = trainer.fit(
        dataset, epochs=args.epochs, verbose=1,
        callbacks=[Slow()] if args.step_delay else None,
    )
    task = f"{tfdist.cluster.task_type() or 'worker'}-{tfdist.cluster.task_id()}"
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, f"{task}.json"), "w", encoding="utf-8") as out:
        json.dump({
            "history": history.history,
            "evaluate": trainer.evaluate(dataset),
            "weights": [w.tolist() for w in model.get_weights()],
        }, out)


if __name__ == "__main__":
    main()
