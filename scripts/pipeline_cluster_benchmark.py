"""Benchmark: a pipeline with one stage per process, on a simulated
1 Gbit/s network and unlimited, against one process holding the whole
model; the bytes the stages send per step against the link's bound.

    python -m scripts.bench pipeline_cluster            # ~3 min here
    python -m scripts.bench pipeline_cluster --quick    # every path, a small model

Each cluster runs under ``tfdist-run --workers_serve`` with this script as
the chief's program: the chief holds stage 1 and the workers' servers the
others (`tfdist.parallel.cluster_stages`). With ``--bandwidth`` every task
shares one loopback limited by ``tc`` (`tfdist.launch.network`); then the
same cluster runs unlimited.

The model: an MLP (a projection of 8 features to ``--width`` units,
``--layers`` hidden layers of ``--width``, one output), SGD, cut into
``--stages`` equal stages; batches of m = ``--micro_batches``
micro-batches of ``--micro_batch_rows`` rows. In the chief, the same
model (same initial weights) is also built without a pipeline, as plain
Keras ``fit`` runs it in one process (the whole model on the chief's CPU).
Both run without XLA (a pipeline's step cannot be one XLA program).
Windows of ``--window_steps`` steps alternate between them (the order
rotating each round, ``--rounds`` rounds); per window: seconds per step,
and the bytes the loopback carried per step (with ``--bandwidth``, every
task's traffic once).

What the stages must send per step: at each cut, every micro-batch's
activations forward and their gradient backward, 2 x batch x width x 4
bytes; the link's bound is that over the rate. (The targets travel to
the last stage and its predictions back to the chief for the metrics:
2 x batch x 4 bytes.) The communication time is the median pipelined step
on the limited network minus the median on the unlimited one.

On this 2-core machine the processes share the cores: the pipeline cannot
be faster than one process here (with S = 2 both use both cores); the
figures say what the network adds and what a step costs across processes.

Outputs in ``--output_dir``: pipeline_cluster_benchmark.json and .md.
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

from bench import flags as bench_flags, limited_cluster, outputs  # noqa: E402

bench_flags.define_common("pipeline_cluster_benchmark",
                          quick="a narrow model, 2-step windows, 1 round.")
flags.DEFINE_string("bandwidth", "1gbit", "The simulated network (a tc rate).")
flags.DEFINE_integer("stages", 2, "Stages, one per process (the chief and S - 1 workers).")
flags.DEFINE_integer("width", 1024, "Units per hidden layer.")
flags.DEFINE_integer("layers", 2, "Hidden layers (a multiple of --stages).")
flags.DEFINE_integer("micro_batches", 4, "Micro-batches per batch, m.")
flags.DEFINE_integer("micro_batch_rows", 64, "Rows per micro-batch.")
flags.DEFINE_integer("rounds", 5, "Timed rounds.")
flags.DEFINE_integer("window_steps", 40, "Steps per timed window.")
flags.DEFINE_string("worker_output", None, "(internal) run as the chief; results go here.")
FLAGS = flags.FLAGS
FEATURES = 8
FORMS = ("one_process", "pipeline")


def _chief() -> None:
    logging.set_verbosity(logging.WARNING)
    import tfdist  # pylint: disable=import-outside-toplevel

    devices = tfdist.parallel.task_devices(timeout_seconds=120)
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    stages, batch = len(devices), FLAGS.micro_batches * FLAGS.micro_batch_rows
    per_stage = FLAGS.layers // stages

    def build():
        keras.utils.set_random_seed(1)
        model = keras.Sequential(
            [keras.Input((FEATURES,)), keras.layers.Dense(FLAGS.width, name="project")]
            + [keras.layers.Dense(FLAGS.width, "tanh", name=f"hidden{i}")
               for i in range(FLAGS.layers)] + [keras.layers.Dense(1, name="out")])
        model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse", jit_compile=False)
        return model

    x = np.random.default_rng(0).random((batch, FEATURES), "float32")
    stream = tf.data.Dataset.from_tensors((x, x.sum(axis=1, keepdims=True))).repeat()
    pipeline = tfdist.parallel.Pipeline(
        cuts=[f"hidden{per_stage * (s + 1) - 1}" for s in range(stages - 1)],
        micro_batches=FLAGS.micro_batches, devices=devices)
    models = {"one_process": build(),
              "pipeline": tfdist.attach(build(), parallel=pipeline)}
    for model in models.values():  # (traced, state made: untimed)
        model.fit(stream, epochs=1, steps_per_epoch=2, verbose=0)
    windows = {form: [] for form in FORMS}
    for round_index in range(FLAGS.rounds):
        order = FORMS[round_index % 2:] + FORMS[:round_index % 2]
        for form in order:
            sent = limited_cluster.loopback_bytes()
            start = time.perf_counter()
            models[form].fit(stream, epochs=1, steps_per_epoch=FLAGS.window_steps, verbose=0)
            seconds = time.perf_counter() - start
            windows[form].append({
                "seconds_per_step": seconds / FLAGS.window_steps,
                "bytes_per_step": (limited_cluster.loopback_bytes() - sent) / FLAGS.window_steps})
    result = {"windows": windows, "stages": stages, "batch": batch,
              "devices": devices,
              "activation_bytes_per_step": 2 * (stages - 1) * batch * FLAGS.width * 4,
              "target_and_prediction_bytes_per_step": 2 * batch * 4}
    pathlib.Path(FLAGS.worker_output).write_text(json.dumps(result))


def _cluster(bandwidth) -> dict:
    """Runs this script as the chief of a ``--workers_serve`` cluster of
    ``--stages`` tasks; returns what it wrote."""
    directory = pathlib.Path(FLAGS.output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    raw = directory / f"chief-{bandwidth or 'unlimited'}.json"
    command = [sys.executable, "-m", "tfdist.launch", f"--num_workers={FLAGS.stages - 1}",
               "--workers_serve"] + ([f"--bandwidth={bandwidth}"] if bandwidth else []) + [
        "--", sys.executable, __file__, f"--worker_output={raw}"] + [
        f"--{name}={getattr(FLAGS, name)}" for name in (
            "width", "layers", "micro_batches", "micro_batch_rows", "rounds", "window_steps")]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(command, cwd=REPO, timeout=1800, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"the {bandwidth or 'unlimited'} cluster failed "
                         f"(exit {done.returncode})")
    return json.loads(raw.read_text())


def _median(windows: list, key: str) -> float:
    return statistics.median(window[key] for window in windows)


def main(argv) -> int:
    del argv  # every option is a flag
    if FLAGS.worker_output:
        _chief()
        return 0
    if FLAGS.quick:
        FLAGS.width, FLAGS.micro_batch_rows, FLAGS.rounds, FLAGS.window_steps = 64, 8, 1, 2
    from tfdist.launch import network  # pylint: disable=import-outside-toplevel

    limited, free = _cluster(FLAGS.bandwidth), _cluster(None)
    bound = limited["activation_bytes_per_step"] * 8 / network.bits_per_second(FLAGS.bandwidth)
    rows = []
    for form in FORMS:
        step = _median(limited["windows"][form], "seconds_per_step")
        unlimited = _median(free["windows"][form], "seconds_per_step")
        rows.append({"form": form, "stages": limited["stages"], "batch": limited["batch"],
                     "seconds_per_step": step, "unlimited_seconds_per_step": unlimited,
                     "communication_seconds": step - unlimited,
                     "link_mb_per_step": _median(limited["windows"][form], "bytes_per_step") / 1e6,
                     "activation_mb_per_step": (limited["activation_bytes_per_step"] / 1e6
                                                if form == "pipeline" else 0.0),
                     "bound_seconds": bound if form == "pipeline" else 0.0})
        print(rows[-1], flush=True)
    lines = [f"| form | step ms at {FLAGS.bandwidth} | unlimited | difference | "
             "MB on the link per step | activations MB | their bound ms |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['form']} | {1000 * r['seconds_per_step']:.0f} | "
              f"{1000 * r['unlimited_seconds_per_step']:.0f} | "
              f"{1000 * r['communication_seconds']:.0f} | {r['link_mb_per_step']:.2f} | "
              f"{r['activation_mb_per_step']:.2f} | {1000 * r['bound_seconds']:.1f} |"
              for r in rows]
    table = "\n".join(lines) + "\n"
    outputs.write_results(FLAGS.output_dir, "pipeline_cluster_benchmark", {"rows": rows}, table)
    print(table)
    return 0


if __name__ == "__main__":
    app.run(main)
