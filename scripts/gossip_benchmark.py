"""Benchmark: decentralized SGD against all-reduce SGD and local SGD on
several workers of a slow network.

    python -m scripts.bench gossip            # 4 workers, 1gbit and 100mbit
    python -m scripts.bench gossip --quick    # every path: width 64, 1 pass, 1gbit

For each ``--bandwidths`` entry, one ``tfdist-run --num_workers=N
--bandwidth=...`` cluster (every task shares one loopback limited by
``tc``: `tfdist.launch.network`; MultiWorkerMirroredStrategy, one
replica per worker) trains the slow-network benchmarks' MLP
(`scripts.bench.patterns_mlp`, SGD with momentum 0.9) on the embedded
dataset, from the same initial weights on the same shuffled stream, in
turn:

- ``synchronous``: the gradients all-reduced every step;
- ``LocalSGD(H=4)``: weights and momentum all-reduced every 4 steps;
- ``Gossip(ring)`` and ``Gossip(exponential)``
  (`tfdist.communication.Gossip`): each worker averages its weights with
  its neighbours after every step.

Each runs ``--epochs`` passes over the training data (epochs of ``fit``:
local SGD and gossip average globally at every epoch's end). Per
configuration:

- training seconds and, after every epoch, the test accuracy of the
  (averaged) weights, evaluated off the clock; the time to
  ``--target_accuracy`` (`scripts.bench.accuracy_curves`);
- MB sent per worker per step: the loopback's bytes over the run, over
  the workers and the steps (every task's traffic, the chief's reports
  included), beside the algorithm's own count for a model of M bytes:
  all-reduce ``2 (N - 1) / N x M``; local SGD the weights and momentum
  ``/ H``; gossip one M per pair of neighbours (ring: 2, exponential:
  2 or 1 by step);
- for gossip, the consensus distance (root mean square distance of the
  workers' weights to their average) every ``--spread_every`` steps,
  measured off the clock (two all-reduces).

Outputs in ``--output_dir``: gossip_benchmark.json and .md.
"""

import json
import pathlib
import sys
import time

from absl import app, flags, logging

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench import flags as bench_flags, accuracy_curves, limited_cluster, outputs, patterns_mlp  # noqa: E402

bench_flags.define_common("gossip_benchmark",
                          quick="width 64, 1 pass, 1gbit only, target 0.1.")
flags.DEFINE_list("bandwidths", ["1gbit", "100mbit"], "Simulated networks (tc rates).")
flags.DEFINE_integer("num_workers", 4, "Workers (one replica each).")
flags.DEFINE_integer("width", 512, "Hidden units of the MLP (512: 0.4M parameters).")
flags.DEFINE_integer("epochs", 3, "Passes over the training data per configuration.")
flags.DEFINE_float("target_accuracy", 0.9, "The test accuracy each run is timed to.")
flags.DEFINE_float("learning_rate", 0.05, "SGD's learning rate (momentum 0.9).")
flags.DEFINE_integer("global_batch_size", 256, "Global batch size.")
flags.DEFINE_integer("spread_every", 8, "Steps between two measures of the consensus distance.")
flags.DEFINE_string("data_dir", "/tmp/tfdist_time_to_accuracy/tensorflow_datasets",
                    "Where the embedded dataset is generated (shared with time_to_accuracy).")
flags.DEFINE_string("worker_output", None, "(internal) run as a training worker.")
FLAGS = flags.FLAGS

CONFIGS = {"synchronous": None, "LocalSGD(H=4)": ("local_sgd", 4),
           "Gossip(ring)": ("gossip", "ring"), "Gossip(exponential)": ("gossip", "exponential")}
TRAIN_EXAMPLES = 10_000  # the embedded dataset's train split


def _communication(config):
    from tfdist.communication import Gossip, LocalSGD  # pylint: disable=import-outside-toplevel
    if config is None:
        return None
    kind, value = config
    return LocalSGD(every_steps=value) if kind == "local_sgd" else Gossip(value)


def _spread_function(strategy, model):
    """A function returning the workers' consensus distance (each worker
    calls it at the same step)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    variables = [v.value for v in model.trainable_variables]

    def replica_spread():
        context = tf.distribute.get_replica_context()
        flat = tf.concat([tf.reshape(tf.identity(v), [-1]) for v in variables], 0)
        mean = context.all_reduce(tf.distribute.ReduceOp.MEAN, flat)
        squared = context.all_reduce(tf.distribute.ReduceOp.MEAN,
                                     tf.reduce_sum(tf.square(flat - mean)))
        return tf.sqrt(squared)

    @tf.function
    def spread():
        return strategy.experimental_local_results(strategy.run(replica_spread))[0]

    return spread


def _worker() -> None:
    logging.set_verbosity(logging.WARNING)
    import tfdist  # pylint: disable=import-outside-toplevel

    strategy = tfdist.make_strategy("multi_worker_mirrored")
    import keras  # pylint: disable=import-outside-toplevel

    train = patterns_mlp.flat_patterns("train", FLAGS.data_dir)
    test = patterns_mlp.flat_patterns("test", FLAGS.data_dir).batch(1000)
    stream = train.shuffle(TRAIN_EXAMPLES, seed=7).batch(
        FLAGS.global_batch_size, drop_remainder=True).repeat()
    steps_per_epoch = TRAIN_EXAMPLES // FLAGS.global_batch_size

    class Measures(keras.callbacks.Callback):
        """Training time (measures off the clock), a copy of the weights at
        every epoch's end, the consensus distance every few steps."""

        def __init__(self, spread):
            super().__init__()
            self.spread, self.trained, self.copies, self.spreads = spread, 0.0, [], []
            self._start, self._off_clock, self._step = None, 0.0, 0

        def on_epoch_begin(self, epoch, logs=None):
            self._start, self._off_clock = time.perf_counter(), 0.0

        def on_train_batch_end(self, batch, logs=None):
            self._step += 1
            if self.spread is not None and self._step % FLAGS.spread_every == 0:
                start = time.perf_counter()
                self.spreads.append({"steps": self._step, "spread": float(self.spread())})
                self._off_clock += time.perf_counter() - start

        def on_epoch_end(self, epoch, logs=None):
            self.trained += time.perf_counter() - self._start - self._off_clock
            self.copies.append({"steps": self._step, "seconds": self.trained,
                                "weights": self.model.get_weights()})

    results = {}
    for name, config in CONFIGS.items():
        keras.utils.set_random_seed(1)
        with strategy.scope():
            model = patterns_mlp.mlp(FLAGS.width)
            model.compile(optimizer=keras.optimizers.SGD(FLAGS.learning_rate, momentum=0.9),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        trainer = tfdist.Trainer(model, strategy, communication=_communication(config),
                                 reporting=tfdist.ReportingOptions(log_every_steps=10**9))
        measures = Measures(_spread_function(strategy, model)
                            if config and config[0] == "gossip" else None)
        sent = limited_cluster.loopback_bytes()
        trainer.fit(stream, epochs=FLAGS.epochs, steps_per_epoch=steps_per_epoch,
                    callbacks=[measures], verbose=0)
        results[name] = {"copies": measures.copies, "spreads": measures.spreads,
                         "bytes": limited_cluster.loopback_bytes() - sent,
                         "model_bytes": 4 * model.count_params()}
        logging.warning("%s: %.1f s", name, measures.trained)
    judge = patterns_mlp.mlp(FLAGS.width)  # off the clock, on each worker alone
    judge.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    for result in results.values():
        for copy in result["copies"]:
            judge.set_weights(copy.pop("weights"))
            copy["accuracy"] = judge.evaluate(test, verbose=0, return_dict=True)["accuracy"]
    if tfdist.cluster.is_chief():
        with open(FLAGS.worker_output, "w", encoding="utf-8") as out:
            json.dump(results, out)


def _algorithm_bytes(name: str, model_bytes: float, workers: int) -> float:
    """What the algorithm sends per worker per step (module doc)."""
    if name == "synchronous":
        return 2 * (workers - 1) / workers * model_bytes
    if name.startswith("LocalSGD"):
        return 2 * (workers - 1) / workers * 2 * model_bytes / 4
    if name == "Gossip(ring)":
        return (2 if workers > 2 else 1) * model_bytes
    shifts = [2 ** k for k in range(max(1, (workers - 1).bit_length()))]
    pairs = [1 if 2 * shift % workers == 0 else 2 for shift in shifts]
    return sum(pairs) / len(pairs) * model_bytes


def main(argv) -> None:
    del argv  # every option is a flag
    if FLAGS.quick:
        FLAGS.width, FLAGS.epochs, FLAGS.target_accuracy = 64, 1, 0.1
        FLAGS.bandwidths = FLAGS.bandwidths[:1]
    if FLAGS.worker_output:
        _worker()
        return
    steps = FLAGS.epochs * (TRAIN_EXAMPLES // FLAGS.global_batch_size)
    summary, markdown = {"config": {name: getattr(FLAGS, name) for name in (
        "bandwidths", "num_workers", "width", "epochs", "target_accuracy", "learning_rate",
        "global_batch_size", "spread_every")}, "runs": {}}, []
    for bandwidth in FLAGS.bandwidths:
        results = limited_cluster.run(
            __file__, bandwidth=bandwidth, data_dir=FLAGS.data_dir, output_dir=FLAGS.output_dir,
            flags={name: getattr(FLAGS, name) for name in (
                "width", "epochs", "learning_rate", "global_batch_size", "spread_every")},
            timeout=7200, num_workers=FLAGS.num_workers)
        rows = {}
        for name, result in results.items():
            rows[name] = {
                "mb_per_worker_per_step": result["bytes"] / FLAGS.num_workers / steps / 1e6,
                "algorithm_mb_per_worker_per_step": _algorithm_bytes(
                    name, result["model_bytes"], FLAGS.num_workers) / 1e6,
                "largest_spread": max((s["spread"] for s in result["spreads"]), default=None),
                "spreads": result["spreads"], "curve": result["copies"]}
        summary["runs"][bandwidth] = rows
        curves = {name: row["curve"] for name, row in rows.items()}
        markdown.append(f"{FLAGS.num_workers} workers at {bandwidth}:\n\n" + accuracy_curves.table(
            curves, FLAGS.target_accuracy, FLAGS.epochs))
        markdown.append("| training | MB sent per worker per step | the algorithm's MB | "
                        "largest spread |\n|---|---|---|---|\n" + "".join(
                            f"| {name} | {row['mb_per_worker_per_step']:.3f} | "
                            f"{row['algorithm_mb_per_worker_per_step']:.3f} | "
                            + (f"{row['largest_spread']:.4f}" if row["largest_spread"] is not None
                               else "-") + " |\n" for name, row in rows.items()))
    table = "\n".join(markdown)
    outputs.write_results(FLAGS.output_dir, "gossip_benchmark", summary, table)
    print(table, flush=True)


if __name__ == "__main__":
    app.run(main)
