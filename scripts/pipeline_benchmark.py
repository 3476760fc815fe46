"""Benchmark: what a pipeline holds per stage, and its live-tensor peak
under each schedule as the micro-batches grow.

    python -m scripts.bench pipeline            # 2 stages, m = 4, 8, 16, ~3 min here
    python -m scripts.bench pipeline --quick    # every path, a small model

An MLP of ``--layers`` hidden layers of ``--width`` units (after a
projection of the inputs), cut into
``--stages`` equal stages on logical CPUs, with Adam, trains a few steps
through `tfdist.parallel.Pipeline` with micro-batches of
``--micro_batch_rows`` rows (fixed: the batch is m times that), for each
schedule and each m in ``--micro_batches``, each in a fresh process.
The inputs and outputs are narrow (8 features, 1 output) so that the
tensors of the whole batch (its x, y, predictions) stay small beside the
hidden activations the schedules differ in. Reported per run:

- ``weights + state MB`` per stage: the bytes of the weights and Adam's
  state on each stage's device (goal: the whole model's / S);
- ``peak MB``: the live-tensor peak of a training step above what was
  alive before, over all stages (TensorFlow's BFC allocator on the CPU,
  ``TF_CPU_ALLOCATOR_USE_BFC``, counts the bytes of live tensors; the
  logical CPUs share it), and the same in units of one micro-batch's
  activations of one hidden layer. GPipe keeps every micro-batch's
  activations until its backward passes: its peak grows with m. 1F1B
  keeps at most S - s micro-batches' on stage s: its peak should not.

Outputs in ``--output_dir``: pipeline_benchmark.json and .md.
"""

import json
import os
import pathlib
import sys

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench import flags as bench_flags, measure, outputs  # noqa: E402

bench_flags.define_common("pipeline_benchmark", quick="2 stages of 2 narrow layers, m = 2, 4.")
flags.DEFINE_integer("width", 1024, "Units per hidden layer.")
flags.DEFINE_integer("layers", 8, "Hidden layers (a multiple of --stages).")
flags.DEFINE_integer("stages", 2, "Pipeline stages (logical CPUs).")
flags.DEFINE_integer("micro_batch_rows", 256, "Rows per micro-batch.")
flags.DEFINE_list("micro_batches", ["4", "8", "16"], "Micro-batch counts m.")
flags.DEFINE_string("run_of", None, "(internal) measure one run in this process: "
                    "'<schedule>:<m>'.")
FLAGS = flags.FLAGS
FEATURES = 8


def measure_one(schedule: str, micro_batches: int) -> dict:
    """One schedule and m, in this process."""
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"  # (before TensorFlow starts)
    import tfdist  # pylint: disable=import-outside-toplevel

    width, layers = (32, 4) if FLAGS.quick else (FLAGS.width, FLAGS.layers)
    rows = 16 if FLAGS.quick else FLAGS.micro_batch_rows
    stages = FLAGS.stages
    devices = tfdist.strategies.configure_logical_cpus(stages)
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    keras.utils.set_random_seed(1)
    hidden = [keras.layers.Dense(width, "tanh", name=f"hidden{i}") for i in range(layers)]
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(width, name="project")]
                             + hidden + [keras.layers.Dense(1, name="out")])
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
    per_stage = layers // stages
    pipeline = tfdist.parallel.Pipeline(
        cuts=[f"hidden{per_stage * (s + 1) - 1}" for s in range(stages - 1)],
        micro_batches=micro_batches, schedule=schedule, devices=devices)
    model = tfdist.attach(model, parallel=pipeline)
    batch = rows * micro_batches
    x = np.random.default_rng(0).random((batch, FEATURES), "float32")
    y = x.sum(axis=1, keepdims=True)
    model.fit(x, y, batch_size=batch, verbose=0)  # (traced; Adam's state made)
    held = [0] * stages
    for variable in list(model.weights) + list(model.optimizer.variables):
        device = tf.DeviceSpec.from_string(variable.value.device)
        if device.device_index is not None and device.device_index < stages:
            held[device.device_index] += int(np.prod(variable.shape)) * variable.value.dtype.size
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    model.fit(x, y, batch_size=batch, epochs=2, verbose=0)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
    return {"schedule": schedule, "micro_batches": micro_batches, "stages": stages,
            "held_mb_per_stage": [b / 2**20 for b in held], "peak_mb": peak / 2**20,
            "peak_in_activations": peak / (rows * width * 4)}


def main(argv) -> int:
    del argv  # every option is a flag
    if FLAGS.run_of:
        schedule, micro_batches = FLAGS.run_of.split(":")
        print(json.dumps(measure_one(schedule, int(micro_batches))))
        return 0
    counts = ["2", "4"] if FLAGS.quick else FLAGS.micro_batches
    rows = []
    for schedule in ("gpipe", "1f1b"):
        for micro_batches in counts:
            command = [sys.executable, __file__, f"--run_of={schedule}:{micro_batches}",
                       f"--quick={FLAGS.quick}", f"--width={FLAGS.width}",
                       f"--layers={FLAGS.layers}", f"--stages={FLAGS.stages}",
                       f"--micro_batch_rows={FLAGS.micro_batch_rows}"]
            rows.append(measure.row_in_fresh_process(command))
            print(rows[-1], flush=True)
    lines = ["| schedule | m | weights + state MB per stage | peak MB | peak in activations |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['schedule']} | {r['micro_batches']} | "
              f"{' / '.join(f'{mb:.1f}' for mb in r['held_mb_per_stage'])} | "
              f"{r['peak_mb']:.1f} | {r['peak_in_activations']:.1f} |" for r in rows]
    table = "\n".join(lines) + "\n"
    outputs.write_results(FLAGS.output_dir, "pipeline_benchmark", {"rows": rows}, table)
    print(table)
    return 0


if __name__ == "__main__":
    app.run(main)
