"""Saves checkpoints in the background, back to back, for a kill test.

A 2-replica MirroredStrategy (logical CPUs) holds an MLP with ``--width``
inputs and hidden units (``--width=4096``: 16.8M weights, 67 MB per
checkpoint with SGD). Before the save numbered ``n`` every weight is set to ``n``, so a
checkpoint shows by its values which step it holds. The program resumes
after its directory's latest checkpoint, prints ``saving <n>`` as each
background save starts and ``restored <n>`` on resume, and saves forever
(until killed) or ``--saves`` times.
"""

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import tfdist  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint_dir", required=True)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--saves", type=int, default=0, help="0: until killed")
    args = parser.parse_args()

    tfdist.strategies.configure_logical_cpus(2)
    strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    with strategy.scope():
        model = keras.Sequential([keras.Input((args.width,)), keras.layers.Dense(args.width),
                                  keras.layers.Dense(3)])
        model.compile(optimizer="sgd", loss="mse")
        model.optimizer.build(model.trainable_variables)
    checkpoint = tfdist.checkpoint.TrainingCheckpoint.for_strategy(
        model, strategy, args.checkpoint_dir, max_to_keep=2, async_write=True)
    start = 1
    if checkpoint.restore_latest() is not None:
        start = checkpoint.position().step + 1
        print(f"restored {start - 1}", flush=True)
    number = start
    while not args.saves or number < start + args.saves:
        for weight in model.weights:
            weight.assign(tf.fill(weight.shape, float(number)))
        checkpoint.save(number, 0, number)
        print(f"saving {number}", flush=True)
        number += 1
    checkpoint.finish_writes()


if __name__ == "__main__":
    main()
