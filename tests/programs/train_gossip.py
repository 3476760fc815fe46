"""A worker program for multi-process tests: decentralized SGD
(`tfdist.communication.Gossip`) on tests/communication/test_gossip.py's
linear model and data, under MultiWorkerMirroredStrategy.

Run under tfdist-run. Writes ``<output_dir>/<task>.json``: the final
weights and, after every step, the spread of this worker's replicas'
weights (the test compares the weights with test_gossip's NumPy
simulation of the same run).
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
    parser.add_argument("--topology", default="ring", help="Gossip(topology=...)")
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--replicas_per_worker", type=int, default=2)
    parser.add_argument("--checkpoint_dir", default=None)
    parser.add_argument("--checkpoint_every_steps", type=int, default=None)
    parser.add_argument("--step_delay", type=float, default=0.0,
                        help="seconds of sleep after each step (a batch-end callback)")
    args = parser.parse_args()

    strategy = tfdist.make_strategy("multi_worker_mirrored",
                                    num_replicas=args.replicas_per_worker)
    from tests.communication import test_gossip as case  # pylint: disable=import-outside-toplevel

    x, y = case._data()  # pylint: disable=protected-access
    with strategy.scope():
        model = case._linear_model(args.momentum)  # pylint: disable=protected-access
    import keras  # pylint: disable=import-outside-toplevel

    class Slow(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(args.step_delay)

    gossip = tfdist.communication.Gossip(args.topology)
    trainer = tfdist.Trainer(
        model, strategy, communication=gossip,
        checkpointing=tfdist.CheckpointOptions(args.checkpoint_dir,
                                               every_steps=args.checkpoint_every_steps),
        reporting=tfdist.ReportingOptions(log_every_steps=1))
    history = trainer.fit(x, y, batch_size=case.BATCH, epochs=case.EPOCHS, shuffle=False,
                          verbose=1, callbacks=[Slow()] if args.step_delay else [])
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, f"{tfdist.cluster.task_name()}.json"), "w",
              encoding="utf-8") as out:
        json.dump({"weights": [w.tolist() for w in model.get_weights()],
                   "history": history.history, "exchanges": gossip.exchanges}, out)


if __name__ == "__main__":
    main()
