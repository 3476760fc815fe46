"""Benchmark: an input-bound job on 2 workers, with and without the tf.data service.

    python scripts/data_service_benchmark.py            # 3 rounds, ~5 min here
    python scripts/data_service_benchmark.py --quick    # every path, ~1 min

Each example's preprocessing is CPU-heavy (``--work`` chained 64x64
matmuls, ~0.5 MFLOP each), the model small, so the input pipeline decides
the speed. Per round, two clusters run one after the other (order
alternating), each ``tfdist-run --num_workers=2`` training a
MultiWorkerMirroredStrategy MLP for ``--steps`` timed steps after one
warm-up epoch:

- ``0 service workers``: each training worker runs the pipeline itself;
- ``1 service worker``: ``--data_service_workers=1``, ``data_service="auto"``:
  the pipeline runs in the service worker's process.

Reported per configuration (medians over rounds): steps/s, the training
processes' CPU time per step (user + system, the mean of the two workers),
and the service worker's CPU time per step. Both training workers read
every global batch (tfdist's exact sharding), so the work is done twice
either way; on this 2-core machine the point is where the CPU goes, not
speed. Several service workers are not run: under a synchronous strategy
tfdist refuses them (`tfdist.data.service`).

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

from absl import app, flags

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

flags.DEFINE_string("output_dir", "/tmp/tfdist_data_service_benchmark", "Where results go.")
flags.DEFINE_integer("rounds", 3, "Rounds (each runs both configurations).")
flags.DEFINE_integer("steps", 100, "Timed steps per run.")
flags.DEFINE_integer("work", 64, "Chained matmuls per example (the preprocessing's cost).")
flags.DEFINE_integer("global_batch_size", 32, "Global batch size.")
flags.DEFINE_bool("quick", False, "A check that every path works: 1 round of 6 steps.")
flags.DEFINE_string("worker_output", None, "(internal) run as a training worker, write here.")
FLAGS = flags.FLAGS

CONFIGS = {"0 service workers": 0, "1 service worker": 1}


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
    """One training task (under tfdist-run): a warm-up epoch, then a timed one."""
    import tfdist  # pylint: disable=import-outside-toplevel

    strategy = tfdist.make_strategy("multi_worker_mirrored")
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer="sgd",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer = tfdist.Trainer(model, strategy, data_service="auto", log_every_steps=10**9)
    trainer.fit(_pipeline(tf, 4), epochs=1, verbose=0)  # traced, built, service job warmed
    dataset = _pipeline(tf, FLAGS.steps)
    cpu, start = _cpu_seconds(), time.perf_counter()
    trainer.fit(dataset, epochs=1, verbose=0)
    result = {"seconds": time.perf_counter() - start, "cpu_seconds": _cpu_seconds() - cpu}
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    with open(f"{FLAGS.worker_output}.{index}", "w", encoding="utf-8") as out:
        json.dump(result, out)


def _process_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run_cluster(service_workers: int, workdir: str) -> dict:
    """One tfdist-run cluster; the training workers' and service worker's figures."""
    output = os.path.join(workdir, f"k{service_workers}")
    command = [sys.executable, "-m", "tfdist.launch", "--num_workers=2",
               f"--data_service_workers={service_workers}", "--",
               sys.executable, __file__, f"--worker_output={output}"] + [
        f"--{name}={getattr(FLAGS, name)}" for name in ("steps", "work", "global_batch_size")]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True,
                               env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    lines, service_cpu = [], [0.0]

    def follow():
        for line in process.stdout:
            lines.append(line)

    threading.Thread(target=follow, daemon=True).start()
    try:
        while process.poll() is None:  # the service worker's CPU, until it ends
            pids = [int(m.group(1)) for m in (re.search(r"started data-worker-0 \(pid (\d+)\)", l)
                                              for l in list(lines)) if m]
            if pids:
                try:
                    service_cpu[0] = _process_cpu_seconds(pids[-1])
                except (FileNotFoundError, ProcessLookupError):
                    pass
            time.sleep(0.2)
        process.wait(timeout=900)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait()
    if process.returncode != 0:
        raise RuntimeError("the cluster failed:\n" + "".join(lines[-40:]))
    workers = [json.load(open(f"{output}.{i}", encoding="utf-8")) for i in range(2)]
    seconds = max(w["seconds"] for w in workers)
    return {"steps_per_s": FLAGS.steps / seconds,
            "trainer_cpu_ms_per_step": 1e3 * statistics.mean(
                w["cpu_seconds"] for w in workers) / FLAGS.steps,
            # The whole run's service CPU (warm-up included), per timed step.
            "service_cpu_ms_per_step": 1e3 * service_cpu[0] / (FLAGS.steps + 4)}


def main(argv):
    del argv
    if FLAGS.quick:
        FLAGS.rounds, FLAGS.steps, FLAGS.work = 1, 6, 2
    if FLAGS.worker_output:
        _train_worker()
        return
    runs = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="tfdist-ds-bench-") as workdir:
        for round_index in range(FLAGS.rounds):
            order = list(CONFIGS) if round_index % 2 == 0 else list(CONFIGS)[::-1]
            for name in order:
                runs[name].append(_run_cluster(CONFIGS[name], workdir))
                print(f"round {round_index + 1}/{FLAGS.rounds}: {name}: {runs[name][-1]}",
                      flush=True)
    medians = {name: {key: statistics.median(run[key] for run in values) for key in values[0]}
               for name, values in runs.items()}
    rows = ["| configuration | steps/s | training worker CPU per step | service worker CPU per step |",
            "|---|---|---|---|"]
    for name, figures in medians.items():
        rows.append(f"| {name} | {figures['steps_per_s']:.2f} | "
                    f"{figures['trainer_cpu_ms_per_step']:.0f} ms | "
                    f"{figures['service_cpu_ms_per_step']:.0f} ms |")
    table = "\n".join(rows) + "\n"
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    with open(os.path.join(FLAGS.output_dir, "data_service_benchmark.json"), "w",
              encoding="utf-8") as out:
        json.dump({"config": {"steps": FLAGS.steps, "work": FLAGS.work, "rounds": FLAGS.rounds,
                              "global_batch_size": FLAGS.global_batch_size},
                   "runs": runs, "medians": medians}, out, indent=2)
    with open(os.path.join(FLAGS.output_dir, "data_service_benchmark.md"), "w",
              encoding="utf-8") as out:
        out.write(table)
    print(table, flush=True)


if __name__ == "__main__":
    app.run(main)
