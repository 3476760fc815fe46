"""Benchmark: what sharded optimizer state saves, per replica and per process.

    python scripts/sharding_benchmark.py            # ~50M weights, Adam, ~2 min here
    python scripts/sharding_benchmark.py --quick    # every path, a small model

An MLP of ``--width`` units in ``--layers`` hidden layers (50.4M weights at
the defaults) with Adam trains ``--steps`` steps under MirroredStrategy(N)
(logical CPUs, N in ``--replicas``) with `tfdist.attach`, once with
``communication=ShardedOptimizerState()`` and once without, each form in a
fresh process. Reported per form:

- ``state MB per replica``: the optimizer's state one replica holds (every
  device component of every optimizer variable, divided by N);
- ``RSS MB before fit`` and ``peak RSS MB``: the process's resident memory
  once the model is built, and its peak (all N replicas: one process holds
  them under MirroredStrategy);
- ``step s``: the median step time after the first two (one process at a
  time; this machine's timings swing +-40%).

Outputs in ``--output_dir``: sharding_benchmark.json and .md.
"""

import json
import pathlib
import statistics
import sys
import time

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench import flags as bench_flags, measure, outputs  # noqa: E402

bench_flags.define_common("sharding_benchmark", quick="a 0.3M-weight model, 3 steps.")
flags.DEFINE_integer("width", 4096, "Units per hidden layer.")
flags.DEFINE_integer("layers", 3, "Hidden layers.")
flags.DEFINE_list("replicas", ["2", "3"], "Replica counts (MirroredStrategy, logical CPUs).")
flags.DEFINE_integer("steps", 8, "Training steps per form.")
flags.DEFINE_string("form_of", None, "(internal) measure one form in this process: "
                    "'<replicas>:<sharded|plain>'.")
FLAGS = flags.FLAGS


def measure_one(replicas: int, sharded: bool) -> dict:
    """One form, in this process."""
    import tfdist  # pylint: disable=import-outside-toplevel

    tfdist.strategies.configure_logical_cpus(replicas)
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel

    strategy = tfdist.make_strategy("mirrored", num_replicas=replicas)
    width, layers = (64, 2) if FLAGS.quick else (FLAGS.width, FLAGS.layers)
    with strategy.scope():
        model = keras.Sequential([keras.Input((width,))] + [
            keras.layers.Dense(width, activation="relu") for _ in range(layers)] + [
            keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.Adam(1e-4),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    communication = tfdist.communication.ShardedOptimizerState() if sharded else None
    tfdist.attach(model, strategy, communication=communication)
    steps = 3 if FLAGS.quick else FLAGS.steps
    rows = np.random.default_rng(0).normal(size=(8 * replicas, width)).astype("float32")
    labels = np.zeros(8 * replicas, "int64")
    times = []
    before_fit_mb = measure.rss_mb()

    class StepClock(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self.started)

    model.fit(np.tile(rows, (steps, 1)), np.tile(labels, steps), batch_size=8 * replicas,
              epochs=1, verbose=0, callbacks=[StepClock()])
    state_bytes = sum(
        sum(int(np.prod(part.shape)) * part.dtype.size for part in
            getattr(v.value, "values", (v.value,)))
        for v in model.optimizer.variables)
    return {"replicas": replicas, "sharded": sharded,
            "weights": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
            "state_mb_per_replica": state_bytes / replicas / 2**20,
            "peak_rss_mb": measure.peak_rss_mb(),
            "rss_after_fit_mb": measure.rss_mb(), "rss_before_fit_mb": before_fit_mb,
            "step_seconds": statistics.median(times[2:] or times)}


def main(argv) -> int:
    del argv  # every option is a flag
    if FLAGS.form_of:
        replicas, form = FLAGS.form_of.split(":")
        print(json.dumps(measure_one(int(replicas), form == "sharded")))
        return 0
    rows = []
    for replicas in FLAGS.replicas:
        for form in ("plain", "sharded"):
            command = [sys.executable, __file__, f"--form_of={replicas}:{form}",
                       f"--quick={FLAGS.quick}", f"--width={FLAGS.width}",
                       f"--layers={FLAGS.layers}", f"--steps={FLAGS.steps}"]
            rows.append(measure.row_in_fresh_process(command))
            print(rows[-1], flush=True)
    lines = ["| replicas | form | weights | state MB per replica | RSS MB before fit | "
             "peak RSS MB | step s |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['replicas']} | {'sharded' if r['sharded'] else 'plain'} | "
              f"{r['weights'] / 1e6:.1f}M | {r['state_mb_per_replica']:.1f} | "
              f"{r['rss_before_fit_mb']:.0f} | {r['peak_rss_mb']:.0f} | "
              f"{r['step_seconds']:.3f} |" for r in rows]
    table = "\n".join(lines) + "\n"
    outputs.write_results(FLAGS.output_dir, "sharding_benchmark", {"rows": rows}, table)
    print(table)
    return 0


if __name__ == "__main__":
    app.run(main)
