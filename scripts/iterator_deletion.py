"""How long deleting a distributed dataset's iterator blocks (README "Performance").

    python scripts/iterator_deletion.py --windows=24 --steps=300
    python scripts/iterator_deletion.py --windows=6 --steps=2500
    python scripts/iterator_deletion.py --trainer_epochs=12 --steps=1000

Trains the benchmark's MLP with a hand-written `strategy.run` loop (no
tfdist in the timed path) in windows: a fresh iterator of
``strategy.experimental_distribute_dataset`` per window, ``--steps`` steps,
then ``del iterator``, each part timed on its own. With TensorFlow's
defaults, with tf.data autotuning off on the dataset (the host pipeline),
and off on the per-device datasets too (`bench.teardown`, what the
benchmark does). Prints per variant the median
step time and every deletion's wall time, which is what makes a benchmark
window (or an epoch's end) slow at random.

With ``--trainer_epochs=N``: `tfdist.Trainer.fit` for N epochs of
``--steps`` steps (each a fresh pass over finite data, TensorFlow's
defaults), twice: with each finished iterator freed inline as before
(``release`` replaced by dropping it on the spot) and on tfdist's release
thread (`tfdist.data.iterator_release`). Prints the gaps between one epoch's end and
the next one's start, which is where the deletion used to stand still.
"""

import pathlib
import statistics
import sys
import time

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

flags.DEFINE_string("strategy", "one_device", "one_device or mirrored.")
flags.DEFINE_integer("num_replicas", 2, "Replicas for mirrored.")
flags.DEFINE_integer("windows", 24, "Windows per variant.")
flags.DEFINE_integer("steps", 300, "Steps per window (one step per call).")
flags.DEFINE_integer("trainer_epochs", 0, "If > 0: time Trainer.fit's epoch gaps instead.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import tfdist  # pylint: disable=import-outside-toplevel
    from bench import contenders, teardown, workloads  # pylint: disable=import-outside-toplevel

    options = {"num_replicas": FLAGS.num_replicas} if FLAGS.strategy == "mirrored" else {}
    strategy = tfdist.make_strategy(FLAGS.strategy, **options)
    if FLAGS.trainer_epochs:
        return _trainer_epoch_gaps(strategy, workloads)
    model = workloads.compiled_model(strategy, "mlp", 1)
    dataset = workloads.endless_dataset("mlp", 256)
    with strategy.scope():
        replica_step = contenders._replica_step(model, 256)  # pylint: disable=protected-access
    variants = {
        "defaults": lambda: strategy.experimental_distribute_dataset(dataset),
        "autotune off (host)": lambda: strategy.experimental_distribute_dataset(
            teardown.without_autotune(dataset)),
        "autotune off (host and devices)": lambda: (
            teardown.remove_iterator_teardown_stall(),  # iterators made from now on
            strategy.experimental_distribute_dataset(teardown.without_autotune(dataset)))[1],
    }

    @tf.function
    def execution(iterator):
        strategy.run(replica_step, args=(next(iterator),))

    for name, make_distributed in variants.items():
        distributed = make_distributed()
        iterator = iter(distributed)
        for _ in range(50):  # trace and warm up
            execution(iterator)
        del iterator
        steps, deletions = [], []
        for _ in range(FLAGS.windows):
            iterator = iter(distributed)
            start = time.perf_counter()
            for _ in range(FLAGS.steps):
                execution(iterator)
            stepped = time.perf_counter()
            del iterator
            deletions.append((time.perf_counter() - stepped) * 1e3)
            steps.append((stepped - start) / FLAGS.steps * 1e3)
        print(f"{name}: {statistics.median(steps):.3f} ms per step "
              f"[{min(steps):.3f}-{max(steps):.3f}]; deletions (ms): "
              f"{[round(d) for d in deletions]}", flush=True)


def _trainer_epoch_gaps(strategy, workloads):
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import tfdist  # pylint: disable=import-outside-toplevel
    from tfdist.data import iterator_release  # pylint: disable=import-outside-toplevel

    class EpochTimes(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.begins, self.ends = [], []

        def on_epoch_begin(self, epoch, logs=None):
            self.begins.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            self.ends.append(time.perf_counter())

    x, y = workloads.global_batch("mlp", 256)
    data = tf.data.Dataset.from_tensors((x, y)).repeat(FLAGS.steps)  # TF's defaults
    threaded_release = iterator_release.release

    def inline_release(owner, attribute="iterator"):
        setattr(owner, attribute, None)  # as before: the training thread waits for TensorFlow

    for name, release in (("freed inline (before)", inline_release),
                          ("release thread", threaded_release)):
        iterator_release.release = release
        try:
            trainer = tfdist.Trainer(workloads.compiled_model(strategy, "mlp", 1), strategy)
            times = EpochTimes()
            start = time.perf_counter()
            trainer.fit(data, epochs=FLAGS.trainer_epochs, callbacks=[times], verbose=0)
            total = time.perf_counter() - start
        finally:
            iterator_release.release = threaded_release
        gaps = [(begin - end) * 1e3 for end, begin in zip(times.ends, times.begins[1:])]
        epochs = [(end - begin) for begin, end in zip(times.begins, times.ends)]
        print(f"Trainer, {name}: {FLAGS.trainer_epochs} epochs of {FLAGS.steps} steps in "
              f"{total:.1f} s (epochs {statistics.median(epochs):.2f} s each, median); gaps "
              f"between epochs (ms): {[round(g) for g in gaps]}", flush=True)


if __name__ == "__main__":
    app.run(main)
