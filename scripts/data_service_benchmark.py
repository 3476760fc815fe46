"""Benchmark: an input-bound job on 2 workers, with and without the tf.data service.

    python scripts/data_service_benchmark.py            # 3 rounds, ~10 min here
    python scripts/data_service_benchmark.py --quick    # mwms 1 and ps 2 only, ~1 min

Each example's preprocessing is CPU-heavy (``--work`` chained 64x64
matmuls, ~0.5 MFLOP each), the model small, so the input pipeline decides
the speed. Per round, five clusters run one after the other (order
alternating between rounds), each training an MLP on 2 training workers
for ``--steps`` timed steps after a warm-up epoch:

- ``mwms, 0`` / ``mwms, 1``: ``tfdist-run --num_workers=2`` under
  MultiWorkerMirroredStrategy, without and with one service worker
  (``--data_service_workers=1``, ``data_service="auto"``). Both training
  workers read every global batch (tfdist's exact sharding), so the
  pipeline's work is done twice either way. Several service workers are
  not run: under a synchronous strategy tfdist refuses them.
- ``ps, 0`` / ``ps, 1`` / ``ps, 2``: ``tfdist-run --num_workers=2
  --num_ps=1`` under ParameterServerStrategy with 0, 1 and 2 service
  workers. Without the service each worker reads the whole stream and
  keeps its batches; with it the workers share one pass (dynamic sharding).

Reported per configuration (medians over rounds): steps/s, the training
workers' CPU time per step (user + system, the mean of the two workers)
and the service workers' CPU time per step (their sum). On this 2-core
machine the point is where the CPU goes, not speed.

Outputs in ``--output_dir``: data_service_benchmark.json and .md.
"""

import json
import os
import pathlib
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings

from absl import app, flags

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench import flags as bench_flags, outputs  # noqa: E402

bench_flags.define_common(
    "data_service_benchmark", quick="1 round of 6 steps, mwms with 1 and ps with 2 service workers.")
flags.DEFINE_integer("rounds", 3, "Rounds (each runs both configurations).")
flags.DEFINE_integer("steps", 100, "Timed steps per run.")
flags.DEFINE_integer("work", 64, "Chained matmuls per example (the preprocessing's cost).")
flags.DEFINE_integer("global_batch_size", 32, "Global batch size.")
flags.DEFINE_string("worker_output", None, "(internal) run as a training task, write here.")
flags.DEFINE_enum("strategy", "multi_worker_mirrored",
                  ["multi_worker_mirrored", "parameter_server"], "(internal) the training task's.")
FLAGS = flags.FLAGS

# name -> (strategy, service workers)
CONFIGS = {"mwms, 0": ("multi_worker_mirrored", 0), "mwms, 1": ("multi_worker_mirrored", 1),
           "ps, 0": ("parameter_server", 0), "ps, 1": ("parameter_server", 1),
           "ps, 2": ("parameter_server", 2)}
QUICK_CONFIGS = ("mwms, 1", "ps, 2")


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _pipeline(tf, steps: int):
    """Global batches whose every example costs ``--work`` 64x64 matmuls."""

    def example(index):
        x = tf.random.stateless_normal([64, 64], seed=tf.stack([index, 0]))
        for _ in range(FLAGS.work):
            x = tf.tanh(tf.matmul(x, x) / 8.0)
        features = tf.reduce_mean(x, axis=0)
        return features, tf.cast(index % 10, tf.int32)

    examples = steps * FLAGS.global_batch_size
    return tf.data.Dataset.range(examples).map(example).batch(FLAGS.global_batch_size)


def _train_worker() -> None:
    """One training task (under tfdist-run): a warm-up epoch, then a timed
    one. Under parameter servers this is the chief; it marks the timed
    window with files (``.start``, ``.end``) for the harness, which reads
    the worker servers' CPU."""
    import tfdist  # pylint: disable=import-outside-toplevel

    strategy = tfdist.make_strategy(FLAGS.strategy)
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer="sgd",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer = tfdist.Trainer(model, strategy, input_pipeline=tfdist.DataOptions(data_service="auto"),
        reporting=tfdist.ReportingOptions(log_every_steps=10**9))
    ps = FLAGS.strategy == "parameter_server"
    with warnings.catch_warnings():  # ps: a partial batch per service worker, steps to spare
        warnings.simplefilter("ignore")
        trainer.fit(_pipeline(tf, 4), epochs=1, verbose=0, steps_per_epoch=4 if ps else None)
        dataset = _pipeline(tf, FLAGS.steps)
        pathlib.Path(f"{FLAGS.worker_output}.start").touch()
        cpu, start = _cpu_seconds(), time.perf_counter()
        trainer.fit(dataset, epochs=1, verbose=0, steps_per_epoch=FLAGS.steps if ps else None)
        result = {"seconds": time.perf_counter() - start, "cpu_seconds": _cpu_seconds() - cpu}
        pathlib.Path(f"{FLAGS.worker_output}.end").touch()
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    with open(f"{FLAGS.worker_output}.{index}", "w", encoding="utf-8") as out:
        json.dump(result, out)


def _process_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _task_cpu(lines, prefix: str) -> dict:
    """CPU seconds so far of each task whose name starts with ``prefix``."""
    pids = {m.group(1): int(m.group(2)) for m in (
        re.search(rf"started ({prefix}[-\w]*) \(pid (\d+)\)", line) for line in list(lines)) if m}
    cpu = {}
    for name, pid in pids.items():
        try:
            cpu[name] = _process_cpu_seconds(pid)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return cpu


def _run_cluster(strategy: str, service_workers: int, workdir: str) -> dict:
    """One tfdist-run cluster; the training workers' and service workers'
    CPU in the timed window (the chief's ``.start`` / ``.end`` files,
    sampled every 0.1 s)."""
    output = os.path.join(tempfile.mkdtemp(dir=workdir), f"{strategy}-{service_workers}")
    ps = strategy == "parameter_server"
    command = [sys.executable, "-m", "tfdist.launch", "--num_workers=2",
               f"--num_ps={int(ps)}", f"--data_service_workers={service_workers}", "--",
               sys.executable, __file__, f"--worker_output={output}", f"--strategy={strategy}"] + [
        f"--{name}={getattr(FLAGS, name)}" for name in ("steps", "work", "global_batch_size")]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True,
                               env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    lines, window = [], {}

    def follow():
        for line in process.stdout:
            lines.append(line)

    threading.Thread(target=follow, daemon=True).start()
    try:
        while process.poll() is None:
            for mark in ("start", "end"):
                if mark not in window and os.path.exists(f"{output}.{mark}"):
                    window[mark] = {**_task_cpu(lines, "data-worker"), **_task_cpu(lines, "worker")}
            time.sleep(0.1)
        process.wait(timeout=900)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait()
    if process.returncode != 0:
        raise RuntimeError("the cluster failed:\n" + "".join(lines[-40:]))
    used = {name: window["end"][name] - window["start"].get(name, 0.0) for name in window["end"]}
    results = [json.load(open(f"{output}.{i}", encoding="utf-8")) for i in range(1 if ps else 2)]
    trainer_cpu = ([used[f"worker-{i}"] for i in range(2)] if ps
                   else [r["cpu_seconds"] for r in results])  # mwms: measured in the worker
    return {"steps_per_s": FLAGS.steps / max(r["seconds"] for r in results),
            "trainer_cpu_ms_per_step": 1e3 * statistics.mean(trainer_cpu) / FLAGS.steps,
            "service_cpu_ms_per_step": 1e3 * sum(
                v for name, v in used.items() if name.startswith("data-worker")) / FLAGS.steps}


def main(argv):
    del argv
    if FLAGS.quick:
        FLAGS.rounds, FLAGS.steps, FLAGS.work = 1, 6, 2
    if FLAGS.worker_output:
        _train_worker()
        return
    configs = [name for name in CONFIGS if not FLAGS.quick or name in QUICK_CONFIGS]
    runs = {name: [] for name in configs}
    with tempfile.TemporaryDirectory(prefix="tfdist-ds-bench-") as workdir:
        for round_index in range(FLAGS.rounds):
            order = configs if round_index % 2 == 0 else configs[::-1]
            for name in order:
                runs[name].append(_run_cluster(*CONFIGS[name], workdir))
                print(f"round {round_index + 1}/{FLAGS.rounds}: {name}: {runs[name][-1]}",
                      flush=True)
    medians = {name: {key: statistics.median(run[key] for run in values) for key in values[0]}
               for name, values in runs.items()}
    rows = ["| strategy, service workers | steps/s | training worker CPU per step | "
            "service workers' CPU per step |",
            "|---|---|---|---|"]
    for name, figures in medians.items():
        rows.append(f"| {name} | {figures['steps_per_s']:.2f} | "
                    f"{figures['trainer_cpu_ms_per_step']:.0f} ms | "
                    f"{figures['service_cpu_ms_per_step']:.0f} ms |")
    table = "\n".join(rows) + "\n"
    outputs.write_results(FLAGS.output_dir, "data_service_benchmark", {
        "config": {"steps": FLAGS.steps, "work": FLAGS.work, "rounds": FLAGS.rounds,
                   "global_batch_size": FLAGS.global_batch_size},
        "runs": runs, "medians": medians}, table)
    print(table, flush=True)


if __name__ == "__main__":
    app.run(main)
