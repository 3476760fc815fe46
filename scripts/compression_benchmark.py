"""Benchmark: gradient compression on a simulated 1 Gbit/s network.

    python scripts/compression_benchmark.py             # ~5 min here
    python scripts/compression_benchmark.py --quick     # every path, ~1 min

Starts ``tfdist-run --bandwidth=1gbit --num_workers=2`` (every task shares
one loopback limited to 1 Gbit/s: `tfdist.launch.network`) running this
script as the training program. Each worker trains three copies of one
~4.7M-parameter MLP (19 MB of float32 gradients) on tfdist's embedded dataset (16x16 patterns, 10
classes), MultiWorkerMirroredStrategy, SGD with momentum, the same data and order:
uncompressed, ``Compression("bf16")`` and ``Compression("fp16")``.

- **Time and bytes**: windows of ``--window_steps`` steps alternate between
  the three (rotating order, ``--rounds`` rounds); per window, seconds per
  step and the bytes the loopback carried per step (``/proc/net/dev`` of the
  namespace: both workers' traffic).
- **Accuracy**: after the windows, each copy trains ``--epochs`` epochs from
  the same initial weights and is evaluated on the test split.

Reported: medians per configuration, and the ratio of each to the
uncompressed run. Outputs in ``--output_dir``: compression_benchmark.json
and .md.
"""

import json
import pathlib
import statistics
import sys
import time

from absl import app, flags, logging

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench import flags as bench_flags, limited_cluster, outputs, patterns_mlp  # noqa: E402

bench_flags.define_common("compression_benchmark", quick="width 64, 1 round, 1 epoch.")
flags.DEFINE_string("bandwidth", "1gbit", "The simulated network (a tc rate).")
flags.DEFINE_integer("width", 2048, "Hidden units (2048: 4.7M parameters).")
flags.DEFINE_integer("rounds", 3, "Timed rounds.")
flags.DEFINE_integer("window_steps", 8, "Steps per timed window.")
flags.DEFINE_integer("epochs", 2, "Epochs of the accuracy runs.")
flags.DEFINE_integer("global_batch_size", 256, "Global batch size.")
flags.DEFINE_string("data_dir", "/tmp/tfdist_compression_benchmark/tensorflow_datasets",
                    "Where the embedded dataset is generated (once).")
flags.DEFINE_string("worker_output", None, "(internal) run as a training worker.")
FLAGS = flags.FLAGS

CONFIGS = ("none", "bf16", "fp16")


def _worker() -> None:
    logging.set_verbosity(logging.WARNING)  # TensorFlow logs every all-reduce it builds
    import tfdist  # pylint: disable=import-outside-toplevel

    strategy = tfdist.make_strategy("multi_worker_mirrored")
    import keras  # pylint: disable=import-outside-toplevel

    from tfdist.communication import Compression  # pylint: disable=import-outside-toplevel

    train = patterns_mlp.flat_patterns("train", FLAGS.data_dir).batch(FLAGS.global_batch_size)
    test = patterns_mlp.flat_patterns("test", FLAGS.data_dir).batch(FLAGS.global_batch_size)

    def build(name):
        keras.utils.set_random_seed(1)
        with strategy.scope():
            model = patterns_mlp.mlp(FLAGS.width)
            model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=["accuracy"])
        communication = None if name == "none" else Compression(name)
        return model, tfdist.Trainer(model, strategy, communication=communication,
            reporting=tfdist.ReportingOptions(log_every_steps=10**9))

    runs = {name: build(name) for name in CONFIGS}
    windows = {name: [] for name in CONFIGS}
    stream = train.repeat()
    for _, trainer in runs.values():  # traced and warmed
        trainer.fit(stream, epochs=1, steps_per_epoch=2, verbose=0)
    for round_index in range(FLAGS.rounds):
        order = list(CONFIGS[round_index % 3:] + CONFIGS[:round_index % 3])
        for name in order:
            sent, start = limited_cluster.loopback_bytes(), time.perf_counter()
            runs[name][1].fit(stream, epochs=1, steps_per_epoch=FLAGS.window_steps, verbose=0)
            windows[name].append({
                "seconds_per_step": (time.perf_counter() - start) / FLAGS.window_steps,
                "bytes_per_step": (limited_cluster.loopback_bytes() - sent) / FLAGS.window_steps})
    accuracy = {}
    parameters = runs["none"][0].count_params()
    for name in CONFIGS:
        model, trainer = build(name)
        trainer.fit(train, epochs=FLAGS.epochs, verbose=0)
        accuracy[name] = trainer.evaluate(test)["accuracy"]
    if tfdist.cluster.is_chief():
        with open(FLAGS.worker_output, "w", encoding="utf-8") as out:
            json.dump({"windows": windows, "accuracy": accuracy, "parameters": parameters}, out)


def main(argv):
    del argv
    if FLAGS.quick:
        FLAGS.width, FLAGS.rounds, FLAGS.window_steps, FLAGS.epochs = 64, 1, 2, 1
    if FLAGS.worker_output:
        _worker()
        return
    result = limited_cluster.run(
        __file__, bandwidth=FLAGS.bandwidth, data_dir=FLAGS.data_dir, output_dir=FLAGS.output_dir,
        flags={name: getattr(FLAGS, name)
               for name in ("width", "rounds", "window_steps", "epochs", "global_batch_size")},
        timeout=3600)
    medians = {name: {key: statistics.median(w[key] for w in windows) for key in windows[0]}
               for name, windows in result["windows"].items()}
    base = medians["none"]
    rows = [f"| all-reduce | seconds per step | bytes on the link per step | accuracy after "
            f"{FLAGS.epochs} epochs |", "|---|---|---|---|"]
    for name in CONFIGS:
        figures = medians[name]
        rows.append(
            f"| {'float32' if name == 'none' else name} | {figures['seconds_per_step']:.3f} "
            f"({figures['seconds_per_step'] / base['seconds_per_step']:.2f}x) | "
            f"{figures['bytes_per_step'] / 1e6:.1f} MB "
            f"({figures['bytes_per_step'] / base['bytes_per_step']:.2f}x) | "
            f"{100 * result['accuracy'][name]:.2f}% |")
    table = "\n".join(rows) + "\n"
    summary = {"config": {flag: getattr(FLAGS, flag) for flag in (
        "bandwidth", "width", "rounds", "window_steps", "epochs", "global_batch_size")},
        "parameters": result["parameters"], "medians": medians, "accuracy": result["accuracy"],
        "windows": result["windows"]}
    outputs.write_results(FLAGS.output_dir, "compression_benchmark", summary, table)
    print(f"{result['parameters'] / 1e6:.1f}M parameters, 2 workers, --bandwidth="
          f"{FLAGS.bandwidth}:\n{table}", flush=True)


if __name__ == "__main__":
    app.run(main)
