"""Benchmark: sharded optimizer state and fully sharded weights on real
workers: memory per worker, and step time on a simulated 1 Gbit/s network
against the ring bound.

    python -m scripts.bench sharding_cluster            # ~10 min here
    python -m scripts.bench sharding_cluster --quick    # every path, a small model

Every cluster runs under ``tfdist-run`` with this script as its training
program: MultiWorkerMirroredStrategy, one replica per worker, the Adam MLP
of the sharding benchmark (``--width`` units in ``--layers`` hidden layers:
50.4M weights at the defaults), a global batch of 8 rows per worker.

- **Memory per worker.** For each N in ``--workers`` and each form (plain;
  sharded: `ShardedOptimizerState`; fully_sharded: `FullySharded`), a
  cluster of N workers trains ``--memory_steps`` steps, ``--memory_rounds``
  times (the forms in turn). Each worker reports the weights and the
  optimizer state it holds between steps, its resident memory once the
  model is built, and its peak; a row shows the largest worker's, median over the
  rounds (the peak of the same run moved by up to 10% between rounds).
  With ``--tensor_memory``, one more cluster per row runs with TensorFlow's
  BFC allocator on the CPU (``TF_CPU_ALLOCATOR_USE_BFC``), which counts
  the bytes of live tensors: the peak during ``fit`` of what the model,
  its gradients and its state hold, without the ~0.9 GB the runtime
  itself takes.
- **Background saves** (part ``saves``). For each N and form, a cluster
  of N workers trains ``--memory_steps`` steps with a background save
  (``CheckpointOptions(async_write=True)``) after every step. Each worker
  reports the bytes its saves copy to its host (the most seen after any
  step: `tfdist.checkpoint.TrainingCheckpoint.background_host_bytes`) and
  its peak resident memory. Plain and sharded state copy the whole
  weights and state on every worker; fully sharded weights copy each
  worker's own slices (`tfdist.checkpoint.slice_writes`).
- **Time on the network.** 2 workers under ``--bandwidth`` (every task
  shares one loopback limited by ``tc``: `tfdist.launch.network`), then 2
  workers unlimited. Each worker builds both forms from the same weights;
  windows of ``--window_steps`` steps alternate between them (rotating
  order, ``--rounds`` rounds). Per window: seconds per step and the bytes
  the loopback carried per step. The communication time is the median step
  on the limited network minus the median unlimited step. The ring bound is
  what a ring all-reduce (or a reduce-scatter and an all-gather) must put
  on the shared link, 2 (N - 1) times the gradient's bytes, over the rate;
  fully sharded weights, gathered once per step and reduce-scattered, put
  the same bytes there.

Outputs in ``--output_dir``: sharding_cluster_benchmark.json and .md.
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

bench_flags.define_common("sharding_cluster_benchmark",
                          quick="a 0.1M-weight model, 2 workers, 2-step windows, 1 round.")
flags.DEFINE_string("bandwidth", "1gbit", "The simulated network (a tc rate).")
flags.DEFINE_integer("width", 4096, "Units per hidden layer.")
flags.DEFINE_integer("layers", 3, "Hidden layers.")
flags.DEFINE_list("workers", ["2", "3"], "Worker counts of the memory part.")
flags.DEFINE_list("parts", ["memory", "network"],
                  "What to measure: memory, network and/or saves (background saves).")
flags.DEFINE_integer("memory_steps", 6, "Steps per memory run.")
flags.DEFINE_integer("memory_rounds", 3, "Memory runs per row (the median is shown).")
flags.DEFINE_bool("tensor_memory", True, "Also count live tensor bytes (one more run per row).")
flags.DEFINE_integer("rounds", 3, "Timed rounds of the network part.")
flags.DEFINE_integer("window_steps", 4, "Steps per timed window.")
flags.DEFINE_string("worker_output", None, "(internal) run as a worker; results go here.")
flags.DEFINE_enum("part", "memory", ["memory", "network", "saves"],
                  "(internal) what a worker measures.")
FORMS = ("plain", "sharded", "fully_sharded")
flags.DEFINE_enum("form", "plain", list(FORMS), "(internal) the memory run's form.")
FLAGS = flags.FLAGS


def _worker() -> None:
    logging.set_verbosity(logging.WARNING)
    import tfdist  # pylint: disable=import-outside-toplevel

    strategy = tfdist.make_strategy("multi_worker_mirrored")
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    workers = strategy.num_replicas_in_sync
    rows = np.random.default_rng(0).normal(size=(8 * workers, FLAGS.width)).astype("float32")
    stream = tf.data.Dataset.from_tensors((rows, np.zeros(8 * workers, "int64"))).repeat()

    def build(form, checkpointing=None):
        keras.utils.set_random_seed(1)
        with strategy.scope():
            model = keras.Sequential([keras.Input((FLAGS.width,))] + [
                keras.layers.Dense(FLAGS.width, activation="relu")
                for _ in range(FLAGS.layers)] + [keras.layers.Dense(10)])
            model.compile(optimizer=keras.optimizers.Adam(1e-4),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        communication = {"plain": lambda: None,
                         "sharded": tfdist.communication.ShardedOptimizerState,
                         "fully_sharded": tfdist.communication.FullySharded}[form]()
        return model, tfdist.Trainer(model, strategy, communication=communication,
            checkpointing=checkpointing,
            reporting=tfdist.ReportingOptions(log_every_steps=10**9))

    task = tfdist.cluster.training_process().rank
    if FLAGS.part == "memory":
        model, trainer = build(FLAGS.form)
        before_fit, tensors_before_fit = measure.rss_mb(), measure.tensor_mb(tf, "current")
        trainer.fit(stream, epochs=1, steps_per_epoch=FLAGS.memory_steps, verbose=0)
        result = {"weights_mb": measure.held_mb(strategy, model.trainable_weights),
                  "state_mb": measure.held_mb(strategy, model.optimizer.variables),
                  "rss_before_fit_mb": before_fit,
                  "peak_rss_mb": measure.peak_rss_mb(),
                  "tensor_before_fit_mb": tensors_before_fit,
                  "tensor_peak_mb": measure.tensor_mb(tf, "peak")}
    elif FLAGS.part == "saves":
        model, trainer = build(FLAGS.form, tfdist.CheckpointOptions(
            os.path.join(FLAGS.worker_output, "checkpoints"), every_steps=1, async_write=True))
        checkpoint = trainer._checkpoint  # pylint: disable=protected-access
        copied = [0]

        def seen(batch, logs):
            del batch, logs
            copied[0] = max(copied[0], checkpoint.background_host_bytes())

        before_fit = measure.rss_mb()
        trainer.fit(stream, epochs=1, steps_per_epoch=FLAGS.memory_steps, verbose=0,
                    callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=seen)])
        result = {"host_copy_mb": copied[0] / 2**20, "rss_before_fit_mb": before_fit,
                  "peak_rss_mb": measure.peak_rss_mb(),
                  "weights_and_state_mb": 3 * 4 * model.count_params() / 2**20}
    else:
        runs = {form: build(form) for form in FORMS}
        windows = {form: [] for form in FORMS}
        for _, trainer in runs.values():  # traced and warmed
            trainer.fit(stream, epochs=1, steps_per_epoch=2, verbose=0)
        for round_index in range(FLAGS.rounds):
            for form in _in_turn(FORMS, round_index):
                sent, start = limited_cluster.loopback_bytes(), time.perf_counter()
                runs[form][1].fit(stream, epochs=1, steps_per_epoch=FLAGS.window_steps, verbose=0)
                windows[form].append({
                    "seconds_per_step": (time.perf_counter() - start) / FLAGS.window_steps,
                    "bytes_per_step":
                        (limited_cluster.loopback_bytes() - sent) / FLAGS.window_steps})
        gradient_bytes = 4 * runs["plain"][0].count_params()
        result = {"windows": windows, "gradient_bytes": gradient_bytes}
    with open(os.path.join(FLAGS.worker_output, f"worker-{task}.json"), "w",
              encoding="utf-8") as out:
        json.dump(result, out)


def _in_turn(forms, round_index: int):
    """The forms, each round starting from the next one."""
    start = round_index % len(forms)
    return forms[start:] + forms[:start]


def _cluster(workers: int, bandwidth, part: str, form: str = "plain", run: str = "") -> list:
    """Runs this script as the program of ``workers`` workers; returns each
    worker's result. ``run="tensors"`` runs them with the BFC allocator."""
    directory = pathlib.Path(FLAGS.output_dir) / (
        f"{part}-{workers}-{form}-{bandwidth or 'free'}{run and '-' + run}")
    directory.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "tfdist.launch", f"--num_workers={workers}"] + (
        [f"--bandwidth={bandwidth}"] if bandwidth else []) + [
        "--", sys.executable, __file__, f"--worker_output={directory}", f"--part={part}",
        f"--form={form}"] + [f"--{name}={getattr(FLAGS, name)}" for name in (
            "width", "layers", "memory_steps", "rounds", "window_steps")]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if run == "tensors":
        env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    done = subprocess.run(command, cwd=REPO, timeout=3600, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"the {part} cluster of {workers} workers failed (exit {done.returncode})")
    return [json.loads((directory / f"worker-{task}.json").read_text())
            for task in range(workers)]


def _memory_rows() -> list:
    runs = {}  # (workers, form) -> each round's largest worker
    for round_index in range(FLAGS.memory_rounds):
        for workers in (int(n) for n in FLAGS.workers):
            for form in _in_turn(FORMS, round_index):
                results = _cluster(workers, None, "memory", form, run=f"round{round_index}")
                runs.setdefault((workers, form), []).append(
                    {key: max(r[key] for r in results)
                     for key in ("weights_mb", "state_mb", "rss_before_fit_mb", "peak_rss_mb")})
    rows = []
    for (workers, form), rounds in sorted(runs.items(), key=lambda item: (
            item[0][0], FORMS.index(item[0][1]))):
        row = {"workers": workers, "form": form, "weights_mb": rounds[0]["weights_mb"],
               "state_mb": rounds[0]["state_mb"],
               "rss_before_fit_mb": statistics.median(r["rss_before_fit_mb"] for r in rounds),
               "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in rounds),
               "peak_rss_mb_rounds": [r["peak_rss_mb"] for r in rounds]}
        if FLAGS.tensor_memory:
            results = _cluster(workers, None, "memory", form, run="tensors")
            row.update({key: max(r[key] for r in results)
                        for key in ("tensor_before_fit_mb", "tensor_peak_mb")})
        rows.append(row)
        print(row, flush=True)
    return rows


def _save_rows() -> list:
    rows = []
    for workers in (int(n) for n in FLAGS.workers):
        for form in FORMS:
            results = _cluster(workers, None, "saves", form)
            row = {"workers": workers, "form": form,
                   **{key: max(r[key] for r in results) for key in (
                       "host_copy_mb", "rss_before_fit_mb", "peak_rss_mb",
                       "weights_and_state_mb")}}
            rows.append(row)
            print(row, flush=True)
    return rows


def _network_rows() -> list:
    medians = {}
    for bandwidth in (FLAGS.bandwidth, None):
        chief = _cluster(2, bandwidth, "network")[0]
        for form, windows in chief["windows"].items():
            medians[(bandwidth, form)] = {
                key: statistics.median(w[key] for w in windows) for key in windows[0]}
    from tfdist.launch import network  # pylint: disable=import-outside-toplevel

    rate = network.bits_per_second(FLAGS.bandwidth)
    bound = 2 * (2 - 1) * chief["gradient_bytes"] * 8 / rate
    rows = []
    for form in FORMS:
        limited, free = medians[(FLAGS.bandwidth, form)], medians[(None, form)]
        rows.append({"form": form, "seconds_per_step": limited["seconds_per_step"],
                     "unlimited_seconds_per_step": free["seconds_per_step"],
                     "link_mb_per_step": limited["bytes_per_step"] / 1e6,
                     "communication_seconds": limited["seconds_per_step"]
                     - free["seconds_per_step"],
                     "ring_bound_seconds": bound})
        print(rows[-1], flush=True)
    return rows


def main(argv) -> None:
    del argv  # every option is a flag
    if FLAGS.quick:
        FLAGS.width, FLAGS.layers, FLAGS.workers = 128, 2, ["2"]
        FLAGS.memory_steps, FLAGS.rounds, FLAGS.window_steps = 2, 1, 2
        FLAGS.memory_rounds = 1
    if FLAGS.worker_output:
        _worker()
        return
    memory = _memory_rows() if "memory" in FLAGS.parts else []
    network = _network_rows() if "network" in FLAGS.parts else []
    saves = _save_rows() if "saves" in FLAGS.parts else []
    plain = {r["workers"]: r for r in memory if r["form"] == "plain"}
    lines = ["| workers | form | weights MB per worker | state MB per worker | RSS MB before "
             "fit | peak RSS MB per worker | peak vs plain | tensor MB peak | tensor peak vs "
             "plain |", "|---|---|---|---|---|---|---|---|---|"] if memory else []
    for r in memory:
        base = plain[r["workers"]]
        tensors = ("| - | - |" if r.get("tensor_peak_mb") is None else
                   f"| {r['tensor_peak_mb']:.0f} | "
                   f"{r['tensor_peak_mb'] / base['tensor_peak_mb']:.2f}x |")
        lines.append(f"| {r['workers']} | {r['form']} | {r['weights_mb']:.1f} | "
                     f"{r['state_mb']:.1f} | "
                     f"{r['rss_before_fit_mb']:.0f} | {r['peak_rss_mb']:.0f} | "
                     f"{r['peak_rss_mb'] / base['peak_rss_mb']:.2f}x {tensors}")
    if network:
        base = network[0]["seconds_per_step"]
        lines += ["" if lines else None,
                  f"| form | s per step at {FLAGS.bandwidth} | vs plain | s per step unlimited "
                  "| MB on the link per step | communication s per step | ring bound s |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['form']} | {r['seconds_per_step']:.3f} | "
                  f"{r['seconds_per_step'] / base:.2f}x | {r['unlimited_seconds_per_step']:.3f} | "
                  f"{r['link_mb_per_step']:.1f} | {r['communication_seconds']:.3f} | "
                  f"{r['ring_bound_seconds']:.3f} |" for r in network]
    if saves:
        lines += ["" if lines else None,
                  "| workers | form | weights + Adam state MB | background save's host copy "
                  "MB per worker | RSS MB before fit | peak RSS MB per worker |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['workers']} | {r['form']} | {r['weights_and_state_mb']:.1f} | "
                  f"{r['host_copy_mb']:.1f} | {r['rss_before_fit_mb']:.0f} | "
                  f"{r['peak_rss_mb']:.0f} |" for r in saves]
    table = "\n".join(line for line in lines if line is not None) + "\n"
    summary = {"config": {name: getattr(FLAGS, name) for name in (
        "bandwidth", "width", "layers", "workers", "parts", "memory_steps", "memory_rounds",
        "tensor_memory", "rounds", "window_steps")},
        "memory": memory, "network": network, "saves": saves}
    outputs.write_results(FLAGS.output_dir, "sharding_cluster_benchmark", summary, table)
    print(table, flush=True)


if __name__ == "__main__":
    app.run(main)
