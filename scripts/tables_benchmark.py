"""Benchmark: an embedding step's time against the table's rows.

    python -m scripts.bench tables            # 10^4, 10^5, 10^6 rows; ~4 min here
    python -m scripts.bench tables --quick    # every path, small tables, a few steps

The model of the Recommenders guide's table: an ``Embedding`` of
``--width`` columns, average pooling and a ``Dense(1)``, ``--ids`` ids per
example, batches of ``--batch_size`` (so a step touches at most
``ids * batch_size`` rows, 4,096 at the defaults), trained with SGD and with
Adagrad. For each table size and optimizer, each form in a fresh process:

- ``keras fit``: one device, plain Keras;
- ``tfdist 1``: the same model with `tfdist.attach` on one device;
- ``tfdist 2``: `tfdist.attach` under MirroredStrategy over 2 logical CPUs
  (the same global batch), the table whole on each replica;
- ``tfdist 2 sharded``: the same with ``communication=FullySharded()``:
  the table sharded by rows over the 2 replicas, ids and rows exchanged
  with their owners (`tfdist.communication.table_lookups`).

Reported: the median step time after ``--warmup`` steps (this machine's
timings swing +-40%: one TensorFlow job at a time), the weights' and the
optimizer state's bytes on the first device (read from the variables: a
replica's copy, or its slice), the process's peak RSS, and each form's
ratio of its largest table's step time to its smallest's (flat in the
table's rows: 1.0).

Outputs in ``--output_dir``: tables_benchmark.json and .md.
"""

import json
import pathlib
import statistics
import sys
import time

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench import flags as bench_flags, measure, outputs  # noqa: E402

bench_flags.define_common("tables_benchmark", quick="tables of 10^3 and 10^4 rows, 6 steps.")
flags.DEFINE_list("rows", ["10000", "100000", "1000000"], "Table sizes (rows).")
flags.DEFINE_list("optimizers", ["sgd", "adagrad"], "Optimizers: sgd, adagrad, adam.")
flags.DEFINE_integer("width", 32, "Columns of the table.")
flags.DEFINE_integer("ids", 16, "Ids per example.")
flags.DEFINE_integer("batch_size", 256, "Global batch size.")
flags.DEFINE_integer("steps", 60, "Training steps per form.")
flags.DEFINE_integer("warmup", 10, "Steps left out of the median.")
flags.DEFINE_string("form_of", None, "(internal) measure one form in this process: "
                    "'<rows>:<optimizer>:<keras|tfdist1|tfdist2|sharded2>'.")
FLAGS = flags.FLAGS

FORMS = {"keras": "keras fit", "tfdist1": "tfdist 1", "tfdist2": "tfdist 2",
         "sharded2": "tfdist 2 sharded"}


def measure_one(rows: int, optimizer_name: str, form: str) -> dict:
    """One form, in this process."""
    import tfdist  # pylint: disable=import-outside-toplevel

    tfdist.strategies.configure_logical_cpus(2)
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel

    steps = 6 if FLAGS.quick else FLAGS.steps
    warmup = 2 if FLAGS.quick else FLAGS.warmup
    strategy = (tfdist.make_strategy("mirrored", num_replicas=2)
                if form in ("tfdist2", "sharded2") else None)
    optimizers = {"sgd": lambda: keras.optimizers.SGD(0.1),
                  "adagrad": lambda: keras.optimizers.Adagrad(0.1),
                  "adam": lambda: keras.optimizers.Adam(0.01)}

    def build():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([
            keras.Input((FLAGS.ids,), dtype="int32"),
            keras.layers.Embedding(rows, FLAGS.width),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1)])
        model.compile(optimizer=optimizers[optimizer_name](), loss="mse")
        return model

    if strategy is not None:
        with strategy.scope():
            model = build()
    else:
        model = build()
    if form != "keras":
        tfdist.attach(model, strategy, communication=(
            tfdist.communication.FullySharded() if form == "sharded2" else None))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, rows, (steps * FLAGS.batch_size, FLAGS.ids)).astype("int32")
    labels = rng.normal(size=(steps * FLAGS.batch_size, 1)).astype("float32")
    times = []

    class StepClock(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self.started)

    model.fit(ids, labels, batch_size=FLAGS.batch_size, epochs=1, verbose=0, shuffle=False,
              callbacks=[StepClock()])
    return {"rows": rows, "optimizer": optimizer_name, "form": form,
            "step_ms": 1000 * statistics.median(times[warmup:] or times),
            "state_mb_first_device": _first_device_mb(model.weights + model.optimizer.variables),
            "peak_rss_mb": measure.peak_rss_mb()}


def _first_device_mb(variables) -> float:
    """MB the first device holds of ``variables`` (Keras variables): each
    one's copy there, or its slice; a variable made once per step's update
    holds none between steps."""
    total = 0
    for variable in variables:
        value = getattr(variable, "value", variable)
        first = value.values[0] if hasattr(value, "values") else value
        if first.shape.is_fully_defined():
            total += first.shape.num_elements() * first.dtype.size
    return total / 2**20


def main(argv) -> int:
    del argv  # every option is a flag
    if FLAGS.form_of:
        rows, optimizer, form = FLAGS.form_of.split(":")
        print(json.dumps(measure_one(int(rows), optimizer, form)))
        return 0
    sizes = [1000, 10000] if FLAGS.quick else [int(r) for r in FLAGS.rows]
    results = []
    for optimizer in FLAGS.optimizers:
        for rows in sizes:
            for form in FORMS:
                results.append(measure.run_own_form(
                    __file__, f"--form_of={rows}:{optimizer}:{form}",
                    ["quick", "width", "ids", "batch_size", "steps", "warmup"]))
    table = _table(results, sizes)
    outputs.write_results(FLAGS.output_dir, "tables_benchmark", {"rows": results}, table)
    print(table)
    return 0


def _table(results, sizes) -> str:
    lines = ["| optimizer | form | " + " | ".join(f"{r:,} rows ms" for r in sizes)
             + " | largest / smallest | weights + state MB, first device (largest) "
             "| peak RSS MB (largest) |",
             "|---|---|" + "---|" * (len(sizes) + 3)]
    for optimizer in FLAGS.optimizers:
        for form, label in FORMS.items():
            by_rows = {r["rows"]: r for r in results
                       if r["optimizer"] == optimizer and r["form"] == form}
            times = [by_rows[size]["step_ms"] for size in sizes]
            lines.append(f"| {optimizer} | {label} | "
                         + " | ".join(f"{t:.1f}" for t in times)
                         + f" | {times[-1] / times[0]:.2f}x | "
                         f"{by_rows[sizes[-1]]['state_mb_first_device']:.1f} | "
                         f"{by_rows[sizes[-1]]['peak_rss_mb']:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    app.run(main)
