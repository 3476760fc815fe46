"""Benchmark: an embedding table on 2 real workers, replicated and sharded
by rows: the bytes a step puts on the link against the ids' and vectors'
bytes, and the step time on a simulated network.

    python -m scripts.bench tables_cluster            # 10^5 and 10^6 rows; ~6 min here
    python -m scripts.bench tables_cluster --quick    # every path, a 10^4-row table

The model of the tables benchmark (an ``Embedding`` of ``--width``
columns, average pooling, a ``Dense(1)``; ``--ids`` ids per example, a
global batch of ``--batch_size``), trained with Adagrad by 2 workers under
``tfdist-run`` (MultiWorkerMirroredStrategy, one replica per worker), each
worker with both forms built from the same weights:

- ``replicated``: `tfdist.attach`; each worker holds the whole table and
  its state, looks up only the touched rows, and the table's sparse
  gradient (one entry per id: the id and a row of ``--width`` floats) is
  combined over the workers;
- ``sharded``: ``communication=FullySharded()``; each worker holds half
  of the table's rows, sends each id to its row's owner, receives the row,
  and sends the row's gradient back (`tfdist.communication.table_lookups`);
  the dense layer is sharded too (a few floats).

- ``parameter servers`` (a cluster of its own: 2 workers and 2 ps
  under ``tfdist-run --num_ps=2``, the coordinator running this script):
  ``make_strategy("parameter_server")`` splits the table's rows over the
  2 ps (TensorFlow's ``MinSizePartitioner``), the workers hold nothing
  and step asynchronously, each step on a batch of ``--batch_size``
  (`tfdist.Trainer`); every id's row crosses the link, there and back.

Windows of ``--window_steps`` steps alternate between the forms (rotating
order, ``--rounds`` rounds), first on a ``--bandwidth`` link (every task
shares one loopback limited by ``tc``: `tfdist.launch.network`), then
unlimited. Per form: the median milliseconds per step on each network,
the bytes the loopback carried per step (both workers' traffic, once),
and two yardsticks computed from the batches:

- ``ids + vectors MB``: what routing the lookups must move, the ids whose
  rows live on the other worker (on a ps: every id; 4 bytes each) and
  their rows there and back (``2 x 4 x width`` bytes each);
- ``table MB``: what exchanging the table itself would move (a dense
  gradient all-reduce: 2 x (N - 1) / N of its bytes per worker, both
  workers' sends).

Outputs in ``--output_dir``: tables_cluster_benchmark.json and .md.
"""

import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

from absl import app, flags, logging

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench import flags as bench_flags, limited_cluster, measure, outputs  # noqa: E402

bench_flags.define_common("tables_cluster_benchmark",
                          quick="a 10^4-row table, 2-step windows, 1 round.")
flags.DEFINE_string("bandwidth", "1gbit", "The simulated network (a tc rate).")
flags.DEFINE_list("rows", ["100000", "1000000"], "Table sizes (rows), one cluster pair each.")
flags.DEFINE_integer("width", 32, "Columns of the table.")
flags.DEFINE_integer("ids", 16, "Ids per example.")
flags.DEFINE_integer("batch_size", 256, "Global batch size.")
flags.DEFINE_integer("rounds", 3, "Timed rounds.")
flags.DEFINE_integer("window_steps", 8, "Steps per timed window.")
flags.DEFINE_string("worker_output", None, "(internal) run as a worker; results go here.")
flags.DEFINE_integer("table_rows", 0, "(internal) the worker's table size.")
flags.DEFINE_boolean("parameter_servers", True,
                     "Also measure the table on 2 ps under ParameterServerStrategy.")
flags.DEFINE_boolean("coordinator", False, "(internal) run as the ps cluster's coordinator.")
FLAGS = flags.FLAGS

FORMS = ("replicated", "sharded")
PS_FORM = "parameter servers"


def _data():
    """The benchmark's batches (ids, labels), cycled; the same in every form."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    batches = 16  # (distinct batches, cycled: every window sees fresh ids)
    ids = np.random.default_rng(0).integers(
        0, FLAGS.table_rows, (batches * FLAGS.batch_size, FLAGS.ids)).astype("int32")
    labels = np.random.default_rng(1).normal(size=(len(ids), 1)).astype("float32")
    stream = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(FLAGS.batch_size).repeat()
    return ids, stream


def _model(strategy):
    """The benchmark's model, compiled under ``strategy``'s scope."""
    import keras  # pylint: disable=import-outside-toplevel

    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((FLAGS.ids,), dtype="int32"),
            keras.layers.Embedding(FLAGS.table_rows, FLAGS.width),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adagrad(0.1), loss="mse")
    return model


def _timed_windows(fits: dict) -> dict:
    """``{form: [window, ...]}``: windows of ``--window_steps`` steps of each
    form's ``fit(steps)``, in rotating order, after one warm-up window."""
    windows = {form: [] for form in fits}
    for fit in fits.values():  # traced and warmed
        fit(2)
    forms = tuple(fits)
    for round_index in range(FLAGS.rounds):
        start_at = round_index % len(forms)
        for form in forms[start_at:] + forms[:start_at]:
            sent, start = limited_cluster.loopback_bytes(), time.perf_counter()
            fits[form](FLAGS.window_steps)
            windows[form].append({
                "seconds_per_step": (time.perf_counter() - start) / FLAGS.window_steps,
                "bytes_per_step": (limited_cluster.loopback_bytes() - sent) / FLAGS.window_steps})
    return windows


def _worker() -> None:
    logging.set_verbosity(logging.WARNING)
    import tfdist  # pylint: disable=import-outside-toplevel

    strategy = tfdist.make_strategy("multi_worker_mirrored")
    import numpy as np  # pylint: disable=import-outside-toplevel

    rows, workers = FLAGS.table_rows, strategy.num_replicas_in_sync
    ids, stream = _data()

    def build(form):
        return tfdist.attach(_model(strategy), strategy, communication=(
            tfdist.communication.FullySharded() if form == "sharded" else None))

    models = {form: build(form) for form in FORMS}
    windows = _timed_windows({
        form: (lambda steps, model=model: model.fit(
            stream, epochs=1, steps_per_epoch=steps, verbose=0))
        for form, model in models.items()})
    # Each worker's part of a global batch is a contiguous half of its rows
    # (tfdist's split); a row's owner is its range (rows / N rows each).
    per_worker, owned = FLAGS.batch_size // workers, -(-rows // workers)
    crossing = []
    for batch in ids.reshape(-1, FLAGS.batch_size, FLAGS.ids):
        crossing.append(sum(int(np.sum(batch[w * per_worker:(w + 1) * per_worker] // owned != w))
                            for w in range(workers)))
    result = {"windows": windows,
              "held_mb": {form: measure.held_mb(strategy, model.weights + model.optimizer.variables)
                          for form, model in models.items()},
              "ids_and_vectors_bytes": statistics.mean(crossing) * (4 + 2 * 4 * FLAGS.width),
              "table_bytes": 2 * (workers - 1) * rows * FLAGS.width * 4}
    task = tfdist.cluster.training_process().rank
    with open(os.path.join(FLAGS.worker_output, f"worker-{task}.json"), "w",
              encoding="utf-8") as out:
        json.dump(result, out)


def _coordinator() -> None:
    """The ps cluster's program: the table on 2 ps, 2 workers stepping."""
    logging.set_verbosity(logging.WARNING)
    import tfdist  # pylint: disable=import-outside-toplevel

    strategy = tfdist.make_strategy("parameter_server", timeout_seconds=120)
    _, stream = _data()
    model = _model(strategy)
    trainer = tfdist.Trainer(model, strategy)
    windows = _timed_windows({PS_FORM: lambda steps: trainer.fit(
        stream, epochs=1, steps_per_epoch=steps, verbose=0)})
    by_ps = measure.kept_by_device(model.weights + model.optimizer.variables)
    ids_per_step = FLAGS.batch_size * FLAGS.ids
    result = {"windows": windows,
              "held_mb": {PS_FORM: max(by_ps.values()) / 2**20},  # the fuller ps
              "ids_and_vectors_bytes": ids_per_step * (4 + 2 * 4 * FLAGS.width),
              "table_bytes": 2 * FLAGS.table_rows * FLAGS.width * 4}
    with open(os.path.join(FLAGS.worker_output, "worker-0.json"), "w", encoding="utf-8") as out:
        json.dump(result, out)


def _cluster(rows: int, bandwidth, parameter_servers=False) -> dict:
    """Runs this script as the program of 2 workers (with 2 ps: as their
    coordinator); returns the chief's result."""
    directory = pathlib.Path(FLAGS.output_dir) / (
        f"rows{rows}-{bandwidth or 'free'}" + ("-ps" if parameter_servers else ""))
    directory.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "tfdist.launch", "--num_workers=2"] + (
        ["--num_ps=2"] if parameter_servers else []) + (
        [f"--bandwidth={bandwidth}"] if bandwidth else []) + [
        "--", sys.executable, __file__, f"--worker_output={directory}",
        f"--table_rows={rows}", f"--coordinator={parameter_servers}"] + [
        f"--{name}={getattr(FLAGS, name)}" for name in (
            "width", "ids", "batch_size", "rounds", "window_steps")]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(command, cwd=REPO, timeout=3600, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"the cluster of {rows} rows failed (exit {done.returncode})")
    return json.loads((directory / "worker-0.json").read_text())


def run_forms(run: dict) -> list:
    """The forms a cluster pair measured, in the table's order."""
    return [form for form in FORMS + (PS_FORM,) if form in run["windows"]]


def _rows() -> list:
    rows = []
    for size in (int(r) for r in FLAGS.rows):
        limited, free = _cluster(size, FLAGS.bandwidth), _cluster(size, None)
        if FLAGS.parameter_servers:
            for run, bandwidth in ((limited, FLAGS.bandwidth), (free, None)):
                ps_run = _cluster(size, bandwidth, parameter_servers=True)
                for key in ("windows", "held_mb"):
                    run[key].update(ps_run[key])
                run.setdefault("by_form", {})[PS_FORM] = ps_run["ids_and_vectors_bytes"]
        for form in run_forms(limited):
            def median(run, key, form=form):
                return statistics.median(w[key] for w in run["windows"][form])
            rows.append({"rows": size, "form": form,
                         "ms_per_step": 1000 * median(limited, "seconds_per_step"),
                         "unlimited_ms_per_step": 1000 * median(free, "seconds_per_step"),
                         "link_mb_per_step": median(limited, "bytes_per_step") / 1e6,
                         "ids_and_vectors_mb": limited.get("by_form", {}).get(
                             form, limited["ids_and_vectors_bytes"]) / 1e6,
                         "table_mb": limited["table_bytes"] / 1e6,
                         "held_mb_per_worker": limited["held_mb"][form]})
            print(rows[-1], flush=True)
    return rows


def main(argv) -> None:
    del argv  # every option is a flag
    if FLAGS.quick:
        FLAGS.rows, FLAGS.rounds, FLAGS.window_steps = ["10000"], 1, 2
    if FLAGS.worker_output:
        _coordinator() if FLAGS.coordinator else _worker()
        return
    rows = _rows()
    lines = [f"| rows | form | weights + state MB per worker (per ps) | MB on the link per step | "
             f"ids + vectors MB | table MB | ms per step at {FLAGS.bandwidth} | "
             "ms per step unlimited |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['rows']:,} | {r['form']} | {r['held_mb_per_worker']:.1f} | "
              f"{r['link_mb_per_step']:.3f} | {r['ids_and_vectors_mb']:.3f} | "
              f"{r['table_mb']:.1f} | {r['ms_per_step']:.1f} | "
              f"{r['unlimited_ms_per_step']:.1f} |" for r in rows]
    table = "\n".join(lines) + "\n"
    summary = {"config": {name: getattr(FLAGS, name) for name in (
        "bandwidth", "rows", "width", "ids", "batch_size", "rounds", "window_steps")},
        "rows": rows}
    outputs.write_results(FLAGS.output_dir, "tables_cluster_benchmark", summary, table)
    print(table, flush=True)


if __name__ == "__main__":
    app.run(main)
