"""Benchmark: tfdist.Trainer.fit vs Keras model.fit vs a hand-written loop.

    python scripts/benchmark.py --output_dir=/tmp/bench [--plot]

Each configuration (strategy x model x steps_per_execution) runs in its own
process, because logical CPU devices are fixed per process. Inside it the
contenders share the model architecture, data, global batch and strategy,
and are timed in alternation (A B C D A B C D ...) so that machine noise hits
all of them alike:

  tfdist          `Trainer.fit`, metrics read at log points only
  tfdist_eager    `Trainer.fit` reading metrics after every execution
                  (log_every_steps=1): the cost of reading them every step
  tfdist_loop     a custom loop on tfdist's public layer (the replica step of
                  strategies/custom_loop.py: `tfdist.Batch`, `replica_loss`,
                  `update_loss_mean`, `update_metrics`, `apply_gradients`)
                  run by `tfdist.loop.HostLoop`, metrics never read
  keras_fit       Keras 3 `model.fit` with the same steps_per_execution
  custom_loop     hand-written: `strategy.run` in one `tf.function` per
                  execution (steps_per_execution steps in a tf.range loop),
                  `tf.nn.compute_average_loss`, loss and accuracy metrics
                  updated but never read, one iterator

A window is one epoch of ``--window_steps`` steps; every contender creates
its iterator per epoch, as real training does. Reported per contender:
examples/s (median, min, max over the timed epochs after a first, untimed
one), time to first step (the first epoch's time beyond what its steps take
at the median rate: tracing and compilation), and the process's
resident-memory growth while that contender was built and ran its first epoch. Results go to `<output_dir>/benchmark.json`
and `benchmark.txt`; `--plot` also writes `benchmark.png` (needs matplotlib).

Data is one constant in-memory batch repeated, so the loop is measured, not
the input pipeline.
"""

import json
import os
import subprocess
import sys
import time

from absl import app, flags

flags.DEFINE_string("output_dir", "/tmp/tfdist_benchmark", "Where results go.")
flags.DEFINE_list("strategies", ["one_device", "mirrored:2", "mirrored:4"],
                  "Strategies: one_device, mirrored:N (N logical CPUs without "
                  "GPUs, N GPUs with them) or mirrored (all local GPUs).")
flags.DEFINE_list("models", ["mlp", "convnet"], "Models from tfdist.recipes.")
flags.DEFINE_list("steps_per_execution", ["1", "16"], "Values to run.")
flags.DEFINE_integer("global_batch_size", 256, "Global batch size.")
flags.DEFINE_integer("window_steps", None,
                     "Steps per timed window (one epoch); default 512 for the "
                     "mlp, 48 for the convnet (about half a second each here).")
flags.DEFINE_integer("windows", 5, "Timed windows per contender.")
flags.DEFINE_enum("batch_shape", "static", ["static", "dynamic"],
                  "static: the batch dimension is known (like batch(..., "
                  "drop_remainder=True)); dynamic: unknown, as after a plain "
                  "batch(), so tfdist adds a padding mask (no replica gets an "
                  "empty batch).")
flags.DEFINE_bool("plot", False, "Also draw benchmark.png (matplotlib).")
flags.DEFINE_string("child", None, "Internal: run one configuration (JSON).")
FLAGS = flags.FLAGS

CONTENDERS = ("tfdist", "tfdist_eager", "tfdist_loop", "keras_fit", "custom_loop")
_DEFAULT_WINDOW = {"mlp": 512, "convnet": 48}


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# -- one configuration (child process) ------------------------------------


def _make_contenders(config):
    """Returns {name: run(num_steps)} closures; building happens lazily."""
    import tfdist  # pylint: disable=import-outside-toplevel

    kind, _, replicas = config["strategy"].partition(":")
    strategy = (
        # "mirrored" alone: every local GPU (one CPU device without GPUs).
        tfdist.make_strategy("mirrored", num_replicas=int(replicas) if replicas else None)
        if kind == "mirrored" else tfdist.make_strategy("one_device")
    )
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from tfdist import recipes  # pylint: disable=import-outside-toplevel

    batch = config["global_batch_size"]
    spe = config["steps_per_execution"]
    rng = np.random.RandomState(0)
    x = rng.rand(batch, 16, 16, 1).astype("float32")
    y = rng.randint(0, 10, batch)
    # A window is one epoch of `window` steps for every contender: each
    # creates its iterator per epoch, as real training does.
    window = max(spe, config["window_steps"] // spe * spe)
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat(window)
    if config.get("batch_shape") == "dynamic":
        # Same data, batch dimension unknown to the graph (one cheap op).
        dataset = dataset.map(lambda a, b: (
            tf.raw_ops.PlaceholderWithDefault(input=a, shape=[None] + a.shape[1:].as_list()),
            tf.raw_ops.PlaceholderWithDefault(input=b, shape=[None])))

    def compiled_model():
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = recipes.build_model(config["model"], (16, 16, 1), 10)
            model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                          metrics=["accuracy"], steps_per_execution=spe)
        return model

    def tfdist_runner(log_every_steps):
        trainer = tfdist.Trainer(compiled_model(), strategy, steps_per_execution=spe,
                                 log_every_steps=log_every_steps)
        return lambda: trainer.fit(dataset, epochs=1, verbose=0)

    def keras_runner():
        model = compiled_model()
        return lambda: model.fit(dataset, epochs=1, verbose=0)

    def tfdist_loop_runner():
        model = compiled_model()
        with strategy.scope():
            model.optimizer.build(model.trainable_variables)
            loss_mean = keras.metrics.Mean(name="loss")
            accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)

        def replica_step(step_batch):
            with tf.GradientTape() as tape:
                predictions = model(step_batch.x, training=True)
                per_example = loss_fn(step_batch.y, predictions)
                loss = tfdist.losses.replica_loss(per_example, step_batch, model)
            tfdist.metrics.update_loss_mean(loss_mean, per_example, step_batch, model)
            tfdist.metrics.update_metrics([accuracy], step_batch, predictions)
            gradients = tape.gradient(loss, model.trainable_variables)
            tfdist.gradients.apply_gradients(model.optimizer, gradients,
                                             model.trainable_variables)

        loop = tfdist.loop.HostLoop(strategy, replica_step, steps_per_execution=spe)
        batches = tfdist.data.distribute(strategy, dataset, avoid_empty_replicas=True)

        def run_epoch():  # as many host calls as the hand-written loop
            iterator = iter(batches)
            for _ in range(window // spe):
                loop.run(iterator)

        return run_epoch

    def custom_loop_runner():
        model = compiled_model()
        with strategy.scope():  # optimizer variables before tracing, mirrored
            model.optimizer.build(model.trainable_variables)
            loss_mean = keras.metrics.Mean()
            accuracy = keras.metrics.SparseCategoricalAccuracy()
        loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction="none")
        distributed = strategy.experimental_distribute_dataset(dataset)

        # Without this, autograph converts Keras 3's optimizer code, and under
        # MirroredStrategy inside a tf.range loop that fails with "You must
        # feed a value for placeholder tensor 'cond/else/...'".
        @tf.autograph.experimental.do_not_convert
        def replica_step(inputs):
            features, labels = inputs
            with tf.GradientTape() as tape:
                predictions = model(features, training=True)
                per_example = loss_fn(labels, predictions)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch)
            grads = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply_gradients(zip(grads, model.trainable_variables))
            loss_mean.update_state(per_example)  # updated every step,
            accuracy.update_state(labels, predictions)  # never read here

        @tf.function
        def run(iterator, num_steps):
            for _ in tf.range(num_steps):
                strategy.run(replica_step, args=(next(iterator),))

        execution = tf.constant(spe)

        def run_epoch():  # like the others: one host call per execution
            iterator = iter(distributed)
            for _ in range(window // spe):
                run(iterator, execution)

        return run_epoch

    return {
        "tfdist": lambda: tfdist_runner(log_every_steps=10**9),
        "tfdist_eager": lambda: tfdist_runner(log_every_steps=1),
        "tfdist_loop": tfdist_loop_runner,
        "keras_fit": keras_runner,
        "custom_loop": custom_loop_runner,
    }, window


def run_configuration(config) -> dict:
    """Builds, warms up and times every contender; returns results."""
    builders, window = _make_contenders(config)
    batch = config["global_batch_size"]
    runners, results = {}, {}
    for name, build in builders.items():
        before = _rss_mb()
        start = time.perf_counter()
        try:
            runner = build()
            runner()  # first epoch: tracing, then `window` steps
        except Exception as error:  # pylint: disable=broad-except
            line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            results[name] = {"error": f"{type(error).__name__}: {line[:200]}"}
            continue
        results[name] = {
            "first_epoch_s": time.perf_counter() - start,
            "rss_growth_mb": _rss_mb() - before,
            "rates": [],
        }
        runners[name] = runner
    for _ in range(config["windows"]):
        for name, runner in runners.items():  # alternating contenders
            start = time.perf_counter()
            runner()
            elapsed = time.perf_counter() - start
            results[name]["rates"].append(window * batch / elapsed)
    for name in runners:
        rates = sorted(results[name]["rates"])
        median = rates[len(rates) // 2]
        results[name].update(
            examples_per_s=median, min=rates[0], max=rates[-1],
            time_to_first_step_s=results[name]["first_epoch_s"] - window * batch / median,
        )
    return {"config": config, "results": results, "peak_rss_mb": _peak_rss_mb()}


def _peak_rss_mb() -> float:
    import resource  # pylint: disable=import-outside-toplevel

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- the parent: one process per configuration ----------------------------


def _configurations():
    for strategy in FLAGS.strategies:
        for model in FLAGS.models:
            for spe in FLAGS.steps_per_execution:
                yield {
                    "strategy": strategy, "model": model,
                    "steps_per_execution": int(spe),
                    "global_batch_size": FLAGS.global_batch_size,
                    "window_steps": FLAGS.window_steps or _DEFAULT_WINDOW[model],
                    "windows": FLAGS.windows,
                    "batch_shape": FLAGS.batch_shape,
                }


def _run_child(config) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    completed = subprocess.run(
        [sys.executable, os.path.abspath(__file__), f"--child={json.dumps(config)}"],
        capture_output=True, text=True, env=env, timeout=1800,
    )
    if completed.returncode != 0:
        raise RuntimeError(
            f"benchmark configuration {config} failed (exit {completed.returncode}):\n"
            + completed.stderr[-3000:]
        )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def format_table(runs) -> str:
    """Plain-text table: one row per configuration and contender."""
    header = (f"{'strategy':<11} {'model':<8} {'spe':>3}  {'contender':<13}"
              f"{'ex/s (median)':>14} {'min':>9} {'max':>9} {'1st step s':>10}"
              f" {'RSS+ MB':>8}  {'vs keras':>8} {'vs loop':>8}")
    lines = [header, "-" * len(header)]
    for run in runs:
        config, results = run["config"], run["results"]
        keras_rate = results.get("keras_fit", {}).get("examples_per_s")
        loop_rate = results.get("custom_loop", {}).get("examples_per_s")
        for name in CONTENDERS:
            result = results[name]
            prefix = (f"{config['strategy']:<11} {config['model']:<8} "
                      f"{config['steps_per_execution']:>3}  {name:<13}")
            if "error" in result:
                lines.append(f"{prefix}{'unsupported: ' + result['error'][:70]}")
                continue
            rate = result["examples_per_s"]
            vs_keras = f"{rate / keras_rate:8.2f}" if keras_rate else f"{'-':>8}"
            vs_loop = f"{rate / loop_rate:8.2f}" if loop_rate else f"{'-':>8}"
            lines.append(
                f"{prefix}{rate:14.0f} {result['min']:9.0f} {result['max']:9.0f} "
                f"{result['time_to_first_step_s']:10.2f} {result['rss_growth_mb']:8.0f}"
                f"  {vs_keras} {vs_loop}"
            )
    return "\n".join(lines)


def _plot(runs, path) -> None:
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    labels = [f"{r['config']['strategy']}\n{r['config']['model']} spe={r['config']['steps_per_execution']}"
              for r in runs]
    figure, axes = plt.subplots(figsize=(max(8, 1.6 * len(runs)), 5))
    width = 0.8 / len(CONTENDERS)
    for index, name in enumerate(CONTENDERS):
        rates = [r["results"][name].get("examples_per_s", 0.0) for r in runs]
        axes.bar([i + index * width for i in range(len(runs))], rates, width, label=name)
    axes.set_xticks([i + 0.4 - width / 2 for i in range(len(runs))], labels, fontsize=7)
    axes.set_ylabel("examples / s (median)")
    axes.set_title("tfdist vs Keras fit vs hand-written loop (0 = unsupported)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv):
    del argv
    if FLAGS.child:
        print(json.dumps(run_configuration(json.loads(FLAGS.child))))
        return
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    runs = []
    for config in _configurations():
        print(f"running {config['strategy']} {config['model']} "
              f"spe={config['steps_per_execution']} ...", flush=True)
        runs.append(_run_child(config))
    table = format_table(runs)
    print(table)
    with open(os.path.join(FLAGS.output_dir, "benchmark.json"), "w") as out:
        json.dump(runs, out, indent=2)
    with open(os.path.join(FLAGS.output_dir, "benchmark.txt"), "w") as out:
        out.write(table + "\n")
    if FLAGS.plot:
        _plot(runs, os.path.join(FLAGS.output_dir, "benchmark.png"))


if __name__ == "__main__":
    app.run(main)
