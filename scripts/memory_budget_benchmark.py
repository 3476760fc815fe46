"""Benchmark: a model larger than one worker's memory budget, trained with
fully sharded weights where plain data parallelism runs out of memory.

    python -m scripts.bench memory_budget            # ~6 min here
    python -m scripts.bench memory_budget --quick    # every path, a small budget
    python -m scripts.bench memory_budget --model=table   # an embedding table, ~5 min

Each worker's budget is enforced by TensorFlow itself: the BFC allocator
on the CPU (``TF_CPU_ALLOCATOR_USE_BFC=true``) with a limit
(``TF_CPU_BFC_MEM_LIMIT_IN_MB=--budget_mb``). A tensor allocation past the
limit fails with ``ResourceExhaustedError`` (out of memory), as on a GPU;
what the runtime itself takes outside tensors is not counted.

The model: ``--layers`` Dense layers of one width, sized so that its
weights plus Adam's two state variables are ``--ratio`` (1.5) times the
budget. For each worker count in ``--workers`` and each form (plain;
sharded: `ShardedOptimizerState`; fully_sharded: `FullySharded`, and
with ``prefetch=False`` and ``reshard_after_forward=False``), a cluster
under ``tfdist-run`` (MultiWorkerMirroredStrategy, one replica per
worker, 8 rows per worker and step) trains ``--steps`` steps. Each worker
reports whether it trained or ran out of memory, what it holds between
steps (weights, state, gradients), the live-tensor peak during ``fit``,
and seconds per step after the first.

``--model=table``: instead, a recommender's shape, an ``Embedding`` of
``--table_width`` columns and as many rows as make the table plus Adam's
two state variables ``--ratio`` times the budget, then average pooling and
a ``Dense(1)``, 16 ids per row: ``FullySharded`` keeps a range of the
table's rows per worker and looks ids up where their rows live
(`tfdist.communication.table_lookups`), never the table whole. Keras makes
each weight whole once before tfdist slices it, so the table starts at
zeros (one allocation; a random initializer's temporaries take 2-3 times
the table at once) and ``--ratio`` defaults to 1.0 (the table a third of
the budget: MultiWorkerMirroredStrategy broadcasts its initial value from
the chief, a second copy, so a table of half the budget cannot be made in
any form); only the forms that matter run (plain, sharded state, fully
sharded).

Outputs in ``--output_dir``: memory_budget_benchmark.json and .md
(``--model=table``: memory_budget_table_benchmark.*).
"""

import json
import os
import pathlib
import subprocess
import sys
import time

from absl import app, flags, logging

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench import flags as bench_flags, measure, outputs  # noqa: E402

bench_flags.define_common("memory_budget_benchmark",
                          quick="a 24 MB budget, a model of 1.0 times it, 2 workers, "
                                "2 steps.")
flags.DEFINE_integer("budget_mb", 256, "Each worker's budget of live tensors (MiB).")
flags.DEFINE_float("ratio", 1.5, "The model's weights + Adam state over the budget.")
flags.DEFINE_integer("layers", 8, "Dense layers of the model.")
flags.DEFINE_list("workers", ["2", "4"], "Worker counts.")
flags.DEFINE_integer("steps", 4, "Steps per run.")
flags.DEFINE_enum("model", "dense", ["dense", "table"],
                  "Dense layers, or an embedding table (module doc).")
flags.DEFINE_integer("table_width", 32, "--model=table: the table's columns.")
flags.DEFINE_string("worker_output", None, "(internal) run as a worker; results go here.")
FORMS = {"plain": None, "sharded": ("ShardedOptimizerState", {}),
         "fully_sharded": ("FullySharded", {}),
         "fully_sharded_no_prefetch": ("FullySharded", {"prefetch": False}),
         "fully_sharded_kept": ("FullySharded", {"reshard_after_forward": False})}
flags.DEFINE_enum("form", "plain", list(FORMS), "(internal) the run's form.")
FLAGS = flags.FLAGS
OUT_OF_MEMORY = 3  # a worker's exit code when its budget ran out


def width() -> int:
    """The layers' width that makes weights + Adam state (3 copies of the
    weights, 4 bytes each) ``--ratio`` times the budget."""
    weights = FLAGS.ratio * FLAGS.budget_mb * 2**20 / 3 / 4
    return int((weights / FLAGS.layers) ** 0.5)


def table_rows() -> int:
    """--model=table: the rows that make the table + Adam state ``--ratio``
    times the budget."""
    return int(FLAGS.ratio * FLAGS.budget_mb * 2**20 / 3 / 4 / FLAGS.table_width)


def _model_and_data(keras, np, tf, workers: int):
    """The model (in the strategy's scope) and an endless stream of its batches."""
    rng = np.random.default_rng(0)
    if FLAGS.model == "table":
        ids = rng.integers(0, table_rows(), (8 * workers, 16)).astype("int32")
        model = keras.Sequential([keras.Input((16,), dtype="int32"),
                                  # (zeros: Keras makes a weight whole before tfdist
                                  # slices it, and a random initializer's
                                  # temporaries would take 2-3 tables at once)
                                  keras.layers.Embedding(table_rows(), FLAGS.table_width,
                                                         embeddings_initializer="zeros"),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
        labels = np.zeros((8 * workers, 1), "float32")
        return model, tf.data.Dataset.from_tensors((ids, labels)).repeat()
    units = width()
    rows = rng.normal(size=(8 * workers, units)).astype("float32")
    model = keras.Sequential([keras.Input((units,))] + [
        keras.layers.Dense(units, activation="relu", name=f"dense_{index}")
        for index in range(FLAGS.layers - 1)] + [keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, tf.data.Dataset.from_tensors((rows, np.zeros(8 * workers, "int64"))).repeat()


def _worker() -> None:
    logging.set_verbosity(logging.WARNING)
    import tfdist  # pylint: disable=import-outside-toplevel

    strategy = tfdist.make_strategy("multi_worker_mirrored")
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    task = tfdist.cluster.training_process().rank
    result = {"width": width()}

    try:
        with strategy.scope():
            model, stream = _model_and_data(keras, np, tf, strategy.num_replicas_in_sync)
        form = FORMS[FLAGS.form]
        communication = None if form is None else getattr(tfdist.communication, form[0])(
            **form[1])
        trainer = tfdist.Trainer(model, strategy, communication=communication,
                                 reporting=tfdist.ReportingOptions(log_every_steps=10**9))
        result["tensor_before_fit_mb"] = measure.tensor_mb(tf, "current")
        trainer.fit(stream, epochs=1, steps_per_epoch=1, verbose=0)
        start = time.perf_counter()
        trainer.fit(stream, epochs=1, steps_per_epoch=FLAGS.steps - 1, verbose=0)
        result["seconds_per_step"] = (time.perf_counter() - start) / (FLAGS.steps - 1)
        result.update(trained=True, tensor_peak_mb=measure.tensor_mb(tf, "peak"),
                      weights_mb=measure.held_mb(strategy, model.trainable_weights),
                      state_mb=measure.held_mb(strategy, model.optimizer.variables))
    except tf.errors.ResourceExhaustedError as error:
        lines = str(error).strip().splitlines()
        result.update(trained=False, error=next((line for line in lines if "OOM" in line),
                                                lines[0])[:200],
                      tensor_peak_mb=measure.tensor_mb(tf, "peak"))
    with open(os.path.join(FLAGS.worker_output, f"worker-{task}.json"), "w",
              encoding="utf-8") as out:
        json.dump(result, out)
    if not result["trained"]:
        # (its peers wait in a collective that will not come: the launcher
        # stops the group when this worker ends with an error)
        os._exit(OUT_OF_MEMORY)  # pylint: disable=protected-access


def _cluster(workers: int, form: str) -> dict:
    """One cluster of ``workers`` under the budget; the row of its results."""
    directory = pathlib.Path(FLAGS.output_dir) / f"budget-{FLAGS.model}-{workers}-{form}"
    directory.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "tfdist.launch", f"--num_workers={workers}", "--",
               sys.executable, __file__, f"--worker_output={directory}", f"--form={form}"] + [
        f"--{name}={getattr(FLAGS, name)}" for name in ("budget_mb", "ratio", "layers", "steps",
                                                        "model", "table_width")]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CPU_ALLOCATOR_USE_BFC="true",
               TF_CPU_BFC_MEM_LIMIT_IN_MB=str(FLAGS.budget_mb))
    done = subprocess.run(command, cwd=REPO, timeout=3600, check=False, env=env)
    results = [json.loads(path.read_text()) for path in sorted(directory.glob("worker-*.json"))]
    if not results:  # (TensorFlow may crash outright when an allocation fails)
        results = [{"trained": False, "tensor_peak_mb": float("nan"),
                    "error": f"every worker ended without a report (exit {done.returncode})"}]
    trained = done.returncode == 0 and len(results) == workers and all(
        r["trained"] for r in results)
    row = {"workers": workers, "form": form, "trained": trained,
           "tensor_peak_mb": max(r["tensor_peak_mb"] for r in results),
           "error": next((r["error"] for r in results if not r["trained"]), None)}
    if trained:
        row.update({key: max(r[key] for r in results) for key in (
            "weights_mb", "state_mb", "tensor_before_fit_mb", "seconds_per_step")})
    print(row, flush=True)
    return row


def main(argv) -> None:
    del argv  # every option is a flag
    if FLAGS.model == "table" and not FLAGS["ratio"].present:
        # (a table is one weight, made whole on each worker and broadcast
        # from the chief at creation: one of half the budget runs out of
        # memory there, before tfdist slices it, in every form)
        FLAGS.ratio = 1.0
    if FLAGS.quick:
        # (at 2 workers a model of 1.5 times the budget cannot fit: the
        # weights', state's and gradients' halves are 2/3 of 1.5 budgets)
        FLAGS.budget_mb, FLAGS.ratio, FLAGS.workers, FLAGS.steps = 24, 1.0, ["2"], 2
    if FLAGS.worker_output:
        _worker()
        return
    forms = list(FORMS) if FLAGS.model == "dense" else ["plain", "sharded", "fully_sharded"]
    rows = [_cluster(int(workers), form) for workers in FLAGS.workers for form in forms]
    if FLAGS.model == "table":
        model_mb = 3 * table_rows() * FLAGS.table_width * 4 / 2**20
        shape = f"a table of {table_rows():,} rows x {FLAGS.table_width}"
    else:
        model_mb = 3 * width() ** 2 * FLAGS.layers * 4 / 2**20
        shape = f"{FLAGS.layers} layers of {width()} units"
    lines = [f"Budget {FLAGS.budget_mb} MiB of live tensors per worker; the model's weights + "
             f"Adam state {model_mb:.0f} MiB ({shape}).", "",
             "| workers | form | trained | weights MB per worker | state MB per worker | "
             "tensor peak MB | s per step |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        held = (f"{r['weights_mb']:.1f} | {r['state_mb']:.1f}" if r["trained"] else "- | -")
        step = f"{r['seconds_per_step']:.3f}" if r["trained"] else "-"
        outcome = "yes" if r["trained"] else "out of memory"
        lines.append(f"| {r['workers']} | {r['form']} | {outcome} | {held} | "
                     f"{r['tensor_peak_mb']:.0f} | {step} |")
    table = "\n".join(lines) + "\n"
    summary = {"config": {name: getattr(FLAGS, name) for name in (
        "budget_mb", "ratio", "layers", "workers", "steps", "model", "table_width")},
        "width": width(), "model_mb": model_mb, "rows": rows}
    name = "memory_budget_benchmark" if FLAGS.model == "dense" else "memory_budget_table_benchmark"
    outputs.write_results(FLAGS.output_dir, name, summary, table)
    print(table, flush=True)


if __name__ == "__main__":
    app.run(main)
