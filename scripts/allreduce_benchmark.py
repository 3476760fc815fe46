"""Benchmark: the gradient all-reduce against its bound on a simulated network.

    python scripts/allreduce_benchmark.py            # 2 and 3 workers, 1 and 10 Gbit/s, ~15 min
    python scripts/allreduce_benchmark.py --quick    # every path: 2 workers, 1 Gbit/s, small

For each network (``--bandwidths``) and cluster size (``--workers``) one
``tfdist-run --bandwidth=RATE --num_workers=N`` cluster runs this script
as its training program (`tfdist.launch.network`: every task shares one
loopback limited to RATE). On each worker, for MLPs of about 1M, 10M and
50M parameters (MultiWorkerMirroredStrategy, one replica per worker,
float32 gradients), medians of ``--reps`` repetitions after a warm-up:

- **compute**: forward and backward pass of one step (batch 64 per worker),
  no communication;
- **all-reduce**: the gradients summed over the workers, the way Keras'
  optimizer does it (``ReplicaContext.all_reduce(SUM, gradients)``, one
  call per step), for each packing in ``--packings`` (the collective's
  ``bytes_per_pack``: 0 = TensorFlow's default, one concatenated tensor).

**The bound.** A ring all-reduce of ``B`` bytes on ``N`` workers sends
``2 (N - 1) / N x B`` bytes from each worker over its link; with one link
per worker it takes at least ``2 (N - 1) / N x B / bandwidth``. Here every
task shares one link (all traffic crosses the one rate-limited loopback),
so the N workers' sends add up: at least ``2 (N - 1) x B / bandwidth``.
Reported: measured time, the bound, and the share of the bound's
bandwidth reached (bound / measured).

Outputs in ``--output_dir``: allreduce_benchmark.json, .md and, with
``--plot``, .png (measured against the bound per configuration; needs
matplotlib: ``pip install -e ".[plot]"``).
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

from bench import flags as bench_flags, outputs, patterns_mlp  # noqa: E402

bench_flags.define_common("allreduce_benchmark", quick="2 workers, 1gbit, tiny.")
flags.DEFINE_list("bandwidths", ["1gbit", "10gbit"],
                  "Simulated networks (tc rates); 'none': the machine's own loopback, no "
                  "limit (what the machine itself allows; no bound).")
flags.DEFINE_list("workers", ["2", "3"], "Cluster sizes.")
flags.DEFINE_list("widths", ["900", "3000", "7000"],
                  "Hidden widths of the MLPs (256 -> w -> w -> 10: ~1M, 10M, 50M parameters).")
flags.DEFINE_list("packings", ["0", "4194304", "33554432"],
                  "bytes_per_pack values to measure (0: TensorFlow's default, one pack).")
flags.DEFINE_integer("reps", 3, "Timed repetitions per measurement.")
flags.DEFINE_bool("plot", False, "Also draw allreduce_benchmark.png (matplotlib).")
flags.DEFINE_string("worker_output", None, "(internal) run as a worker, write here.")
FLAGS = flags.FLAGS

BATCH = 64


def _rate_bits(rate: str) -> float:
    from tfdist.launch import network  # pylint: disable=import-outside-toplevel

    return network.bits_per_second(rate)


def _median_seconds(function, reps: int, before=None) -> float:
    """Median time of ``function()`` (after one untimed call); ``before()``
    runs untimed ahead of each call."""
    function()  # warm-up (traced, buffers made)
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _worker() -> None:
    logging.set_verbosity(logging.WARNING)  # TensorFlow logs every all-reduce it builds
    import tfdist  # pylint: disable=import-outside-toplevel

    strategy = tfdist.make_strategy("multi_worker_mirrored")
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    @tf.function
    def all_reduce_one():
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, tf.ones([])))

    def barrier():
        strategy.experimental_local_results(all_reduce_one())[0].numpy()

    results = []
    for width in (int(w) for w in FLAGS.widths):
        with strategy.scope():
            model = patterns_mlp.mlp(width)
        x = tf.random.stateless_normal([BATCH, 256], seed=[1, 2])
        y = tf.zeros([BATCH], tf.int64)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        def gradients():
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            return tape.gradient(loss, model.trainable_variables)

        @tf.function
        def compute():
            # The gradients' sum stays on the worker: no collective.
            return strategy.run(lambda: tf.add_n([tf.reduce_sum(g) for g in gradients()]))

        with strategy.scope():  # gradient-shaped values on each worker
            grads = [tf.Variable(tf.ones_like(w)) for w in model.trainable_variables]

        def all_reduce_with(bytes_per_pack):
            options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=bytes_per_pack)

            @tf.function
            def run():
                return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.SUM, [tf.identity(g) for g in grads],
                    options=options))

            def once():
                for value in run():
                    strategy.experimental_local_results(value)[0].numpy()

            return once

        row = {"width": width, "parameters": model.count_params(),
               "bytes": 4 * model.count_params(),
               "compute_seconds": _median_seconds(
                   lambda: [v.numpy() for v in strategy.experimental_local_results(compute())],
                   FLAGS.reps),
               "all_reduce_seconds": {}}
        for packing in (int(p) for p in FLAGS.packings):
            row["all_reduce_seconds"][str(packing)] = _median_seconds(
                all_reduce_with(packing), FLAGS.reps, before=barrier)  # workers start together
        results.append(row)
        print(f"width {width}: {row}", flush=True)
    if tfdist.cluster.is_chief():
        with open(FLAGS.worker_output, "w", encoding="utf-8") as out:
            json.dump(results, out)


def _bound_seconds(num_bytes: int, workers: int, rate: str) -> float:
    """The shared-link ring bound (module docstring)."""
    return 2 * (workers - 1) * num_bytes * 8 / _rate_bits(rate)


def _run(bandwidth: str, workers: int) -> list:
    raw = os.path.join(FLAGS.output_dir, f"raw-{bandwidth}-{workers}.json")
    limit = [] if bandwidth == "none" else [f"--bandwidth={bandwidth}"]
    command = [sys.executable, "-m", "tfdist.launch", *limit, f"--num_workers={workers}", "--", sys.executable, __file__,
               f"--worker_output={raw}", f"--widths={','.join(FLAGS.widths)}",
               f"--packings={','.join(FLAGS.packings)}", f"--reps={FLAGS.reps}"]
    done = subprocess.run(command, cwd=REPO, timeout=3600, check=False,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if done.returncode != 0:
        raise SystemExit(f"the cluster ({workers} workers, {bandwidth}) failed "
                         f"(exit {done.returncode})")
    with open(raw, encoding="utf-8") as handle:
        rows = json.load(handle)
    for row in rows:
        if bandwidth == "none":
            row["bound_seconds"], row["share_of_bound"] = None, {}
            continue
        row["bound_seconds"] = _bound_seconds(row["bytes"], workers, bandwidth)
        row["share_of_bound"] = {packing: row["bound_seconds"] / seconds
                                 for packing, seconds in row["all_reduce_seconds"].items()}
    return rows


def _plot(results: dict, path: str) -> None:
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    labels, bounds, measured = [], [], {p: [] for p in FLAGS.packings}
    for key, rows in results.items():
        for row in (r for r in rows if r["bound_seconds"] is not None):
            short = key.replace(" workers, ", " workers\n")
            labels.append(f"{short}\n{row['parameters'] / 1e6:.0f}M params")
            bounds.append(row["bound_seconds"])
            for packing in FLAGS.packings:
                measured[packing].append(row["all_reduce_seconds"][packing])
    figure, axis = plt.subplots(figsize=(max(6, 0.9 * len(labels)), 4))
    width = 0.8 / (1 + len(FLAGS.packings))
    positions = range(len(labels))
    axis.bar([p - 0.4 + width / 2 for p in positions], bounds, width, label="ring bound (shared link)",
             color="#888888")
    for index, packing in enumerate(FLAGS.packings):
        name = "default (one pack)" if packing == "0" else f"bytes_per_pack {int(packing) >> 20} MB"
        axis.bar([p - 0.4 + width * (index + 1.5) for p in positions], measured[packing], width,
                 label=name)
    axis.set_yscale("log")
    axis.set_ylabel("seconds per all-reduce")
    axis.set_xticks(list(positions))
    axis.set_xticklabels(labels, fontsize=7)
    axis.legend(fontsize=7)
    axis.set_title("Gradient all-reduce: measured vs the ring bound")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv):
    del argv
    if FLAGS.quick:
        FLAGS.bandwidths, FLAGS.workers, FLAGS.widths, FLAGS.reps = ["1gbit"], ["2"], ["300"], 1
        FLAGS.packings = ["0", "4194304"]
    if FLAGS.worker_output:
        _worker()
        return
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    results = {}
    for bandwidth in FLAGS.bandwidths:
        for workers in (int(w) for w in FLAGS.workers):
            results[f"{workers} workers, {bandwidth}"] = _run(bandwidth, workers)
    rows = ["| cluster | parameters | compute | ring bound | " + " | ".join(
        "all-reduce, " + ("default" if p == "0" else f"{int(p) >> 20} MB packs")
        for p in FLAGS.packings) + " |", "|---|---|---|---|" + "---|" * len(FLAGS.packings)]
    for key, result_rows in results.items():
        for row in result_rows:
            bound = row["bound_seconds"]
            rows.append(f"| {key} | {row['parameters'] / 1e6:.1f}M | "
                        f"{1e3 * row['compute_seconds']:.0f} ms | "
                        + (f"{1e3 * bound:.0f} ms | " if bound else "- | ") + " | ".join(
                            f"{1e3 * row['all_reduce_seconds'][p]:.0f} ms" + (
                                f" ({100 * row['share_of_bound'][p]:.0f}%)" if bound else "")
                            for p in FLAGS.packings) + " |")
    table = "\n".join(rows) + "\n"
    outputs.write_results(FLAGS.output_dir, "allreduce_benchmark", {
        "config": {"reps": FLAGS.reps, "batch_per_worker": BATCH, "packings": FLAGS.packings},
        "results": results}, table)
    if FLAGS.plot and any(r["bound_seconds"] for rows in results.values() for r in rows):
        _plot(results, os.path.join(FLAGS.output_dir, "allreduce_benchmark.png"))
    print(table, flush=True)


if __name__ == "__main__":
    app.run(main)
