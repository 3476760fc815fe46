"""Benchmark: time to accuracy on a simulated 1 Gbit/s network.

    python scripts/time_to_accuracy.py             # ~15 min here
    python scripts/time_to_accuracy.py --quick     # every path, ~1 min

Starts ``tfdist-run --bandwidth=1gbit --num_workers=2`` (every task shares
one loopback limited to 1 Gbit/s: `tfdist.launch.network`) running this
script as the training program. Each worker trains four copies of one
~10.3M-parameter MLP (41 MB of float32 gradients) on tfdist's embedded
dataset (16x16 patterns, 10 classes), MultiWorkerMirroredStrategy, SGD
with momentum, from the same initial weights, on the same shuffled data in
the same order, one after the other:

- ``synchronous``: the gradients all-reduced every step (float32);
- ``bf16``: the same with ``Compression("bf16")``;
- ``LocalSGD(H=4)`` and ``LocalSGD(H=16)``: each worker steps on its half
  of every global batch; weights and momentum averaged every H steps.

Every ``--eval_every`` steps (an "epoch" of ``fit`` with
``steps_per_epoch``; local SGD averages there, as it would at the end of an
epoch) a callback takes the training time so far and copies the weights.
The copies are evaluated on the test split after all training, so
evaluation costs no training time. The first window's time includes
tracing the step, as a user's run does.

Reported per configuration: the training time and steps until the test
accuracy first reached ``--target_accuracy``, and until it first reached
the synchronous run's last accuracy less half a point; the speed-ups
against the synchronous run's times; and the accuracy after ``--epochs``
passes over the data.
Outputs in ``--output_dir``: time_to_accuracy.json (every evaluation) and
time_to_accuracy.md (the table).
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

bench_flags.define_common(
    "time_to_accuracy", quick="width 64, 1 pass, a copy every 16 steps, target 0.1.")
flags.DEFINE_string("bandwidth", "1gbit", "The simulated network (a tc rate).")
flags.DEFINE_integer("width", 3072, "Hidden units (3072: 10.3M parameters).")
flags.DEFINE_integer("epochs", 6, "Passes over the training data per configuration.")
flags.DEFINE_integer("eval_every", 16, "Steps between weight copies (a multiple of every H).")
flags.DEFINE_float("target_accuracy", 0.93, "The test accuracy each run is timed to.")
flags.DEFINE_float("learning_rate", 0.05, "SGD's learning rate (momentum 0.9).")
flags.DEFINE_integer("global_batch_size", 256, "Global batch size.")
flags.DEFINE_string("data_dir", "/tmp/tfdist_time_to_accuracy/tensorflow_datasets",
                    "Where the embedded dataset is generated (once).")
flags.DEFINE_string("worker_output", None, "(internal) run as a training worker.")
FLAGS = flags.FLAGS

CONFIGS = {"synchronous": None, "bf16": ("compression", "bf16"),
           "LocalSGD(H=4)": ("local_sgd", 4), "LocalSGD(H=16)": ("local_sgd", 16)}
TRAIN_EXAMPLES = 10_000  # the embedded dataset's train split


def _communication(config):
    from tfdist.communication import Compression, LocalSGD  # pylint: disable=import-outside-toplevel
    if config is None:
        return None
    kind, value = config
    return Compression(value) if kind == "compression" else LocalSGD(every_steps=value)


def _worker() -> None:
    logging.set_verbosity(logging.WARNING)  # TensorFlow logs every all-reduce it builds
    import tfdist  # pylint: disable=import-outside-toplevel

    strategy = tfdist.make_strategy("multi_worker_mirrored")
    import keras  # pylint: disable=import-outside-toplevel

    train = patterns_mlp.flat_patterns("train", FLAGS.data_dir)
    test = patterns_mlp.flat_patterns("test", FLAGS.data_dir)
    # One stream for all the epochs of a run: shuffled (seeded: every
    # configuration reads the same order), global batches.
    stream = train.shuffle(TRAIN_EXAMPLES, seed=7).batch(FLAGS.global_batch_size,
                                                         drop_remainder=True).repeat()
    steps = FLAGS.epochs * (TRAIN_EXAMPLES // FLAGS.global_batch_size)
    windows = max(1, steps // FLAGS.eval_every)

    class Copies(keras.callbacks.Callback):
        """Training time and a copy of the weights every window."""

        def __init__(self):
            super().__init__()
            self.trained_seconds, self.copies, self._start = 0.0, [], None

        def on_epoch_begin(self, epoch, logs=None):
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.trained_seconds += time.perf_counter() - self._start
            self.copies.append({"steps": (epoch + 1) * FLAGS.eval_every,
                                "seconds": self.trained_seconds,
                                "weights": self.model.get_weights()})

    copies, parameters = {}, None
    for name, config in CONFIGS.items():
        keras.utils.set_random_seed(1)
        with strategy.scope():
            model = patterns_mlp.mlp(FLAGS.width)
            model.compile(optimizer=keras.optimizers.SGD(FLAGS.learning_rate, momentum=0.9),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        parameters = model.count_params()
        trainer = tfdist.Trainer(model, strategy, communication=_communication(config),
            reporting=tfdist.ReportingOptions(log_every_steps=10**9))
        callback = Copies()
        trainer.fit(stream, epochs=windows, steps_per_epoch=FLAGS.eval_every,
                    callbacks=[callback], verbose=0)
        copies[name] = callback.copies
        logging.warning("%s: %d steps in %.1f s", name, windows * FLAGS.eval_every,
                        callback.trained_seconds)
    # Off the clock, on each worker alone (both, so that neither waits on
    # a peer that has left): every copy on the test split.
    judge = patterns_mlp.mlp(FLAGS.width)
    judge.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    test = test.batch(1000)
    curves = {}
    for name, runs in copies.items():
        curves[name] = []
        for copy in runs:
            judge.set_weights(copy.pop("weights"))
            copy["accuracy"] = judge.evaluate(test, verbose=0, return_dict=True)["accuracy"]
            curves[name].append(copy)
    if tfdist.cluster.is_chief():
        with open(FLAGS.worker_output, "w", encoding="utf-8") as out:
            json.dump({"curves": curves, "parameters": parameters}, out)


def main(argv):
    del argv
    if FLAGS.quick:
        FLAGS.width, FLAGS.epochs, FLAGS.eval_every, FLAGS.target_accuracy = 64, 1, 16, 0.1
    if FLAGS.eval_every % 16:
        raise SystemExit(f"--eval_every={FLAGS.eval_every}: must be a multiple of 16, the "
                         "longest local SGD period, so that copies fall on its averagings")
    if FLAGS.worker_output:
        _worker()
        return
    result = limited_cluster.run(
        __file__, bandwidth=FLAGS.bandwidth, data_dir=FLAGS.data_dir, output_dir=FLAGS.output_dir,
        flags={name: getattr(FLAGS, name)
               for name in ("width", "epochs", "eval_every", "learning_rate", "global_batch_size")},
        timeout=7200)
    markdown = accuracy_curves.table(result["curves"], FLAGS.target_accuracy, FLAGS.epochs)
    summary = {"config": {flag: getattr(FLAGS, flag) for flag in (
        "bandwidth", "width", "epochs", "eval_every", "target_accuracy", "learning_rate",
        "global_batch_size")}, "parameters": result["parameters"],
        "time_to_target": {name: accuracy_curves.time_to(curve, FLAGS.target_accuracy)
                           for name, curve in result["curves"].items()},
        "curves": result["curves"]}
    outputs.write_results(FLAGS.output_dir, "time_to_accuracy", summary, markdown)
    print(f"{result['parameters'] / 1e6:.1f}M parameters, 2 workers, --bandwidth="
          f"{FLAGS.bandwidth}:\n{markdown}", flush=True)


if __name__ == "__main__":
    app.run(main)
