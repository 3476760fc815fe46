"""Chief program: many checkpoint saves under ParameterServerStrategy.

Run under ``tfdist-run --num_ps=1 --num_workers=1``. Builds the 6-16-3 MLP
with Adam (its variables on the ps, the checkpoint's counters here), then
saves ``--saves`` checkpoints with `tfdist.checkpoint.TrainingCheckpoint`
and prints ``save <n> rss_kb <this process's RSS>`` after each, so a test
can follow the chief's and the ps's memory per save; then tracks one more
variable, saves again and prints the value the checkpoint holds for it.
"""

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import tfdist  # noqa: E402


def _rss_kb() -> int:
    with open("/proc/self/status", encoding="utf-8") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint_dir", required=True)
    parser.add_argument("--saves", type=int, default=200)
    parser.add_argument("--async_write", action="store_true",
                        help="TrainingCheckpoint(async_write=True): refused under ps")
    args = parser.parse_args()

    strategy = tfdist.make_strategy("parameter_server", timeout_seconds=60)
    import keras  # pylint: disable=import-outside-toplevel

    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16),
                                  keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
        model.optimizer.build(model.trainable_variables)
    checkpoint = tfdist.checkpoint.TrainingCheckpoint(model, args.checkpoint_dir,
                                                      async_write=args.async_write)
    for number in range(1, args.saves + 1):
        checkpoint.save(number, 0, number)
        print(f"save {number} rss_kb {_rss_kb()}", flush=True)

    # A variable tracked after the saves above must be in the next save
    # (the traced save is traced again for the new object graph).
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    checkpoint.track_state({"late_total": tf.Variable(7.0)})
    path = checkpoint.save(args.saves + 1, 0, args.saves + 1)
    reader = tf.train.load_checkpoint(path)
    late = [name for name in reader.get_variable_to_shape_map() if "late_total" in name]
    print(f"late variable saved: {[float(reader.get_tensor(name)) for name in late]}", flush=True)


if __name__ == "__main__":
    main()
