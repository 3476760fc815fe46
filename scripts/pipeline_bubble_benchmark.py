"""Benchmark: a pipeline's bubble, each device's busy and idle time per
step, against the theory: (p - 1) / (m + p - 1) with one stage on each of
p devices (GPipe, 1F1B), (p - 1) / (v·m + p - 1) with v stages on each
(interleaved 1F1B).

    python -m scripts.bench pipeline_bubble            # p = 2, 4; m = 4, 8, 16; v = 1, 2; ~8 min
    python -m scripts.bench pipeline_bubble --quick    # every path, p = 2, m = 2

This machine has 2 cores, and S stages on S logical CPUs share them: real
compute on one stage would slow the others, and the schedule's overlap
could not show. So each stage's work is a fixed time instead: a
``TimedWork`` layer per stage whose forward pass holds its stage for
``--forward_ms`` and whose backward pass for twice that (a sleeping op on
the stage's device, which takes no core). Its op records when it starts
and ends as it runs inside the step's graph: those are the timestamps the
figures come from. The rest of a stage (a small Dense layer) takes
microseconds.

The model: per stage a Dense layer and a ``TimedWork``, cut after each
stage's ``TimedWork``; the batch is m micro-batches of 8 rows; SGD. With v
stages per device the model has p·v stages, each holding its device for
``--forward_ms`` / v: each device does the same work per micro-batch as
with one stage, in v chunks. Each (p, m, schedule, v) trains ``--steps``
steps after a first (traced) one, in a fresh process (the logical CPUs
are fixed when TensorFlow starts), with enough inter-op threads for every
stage's pass to run at once.

Per step, from the recorded passes: the span (the first pass's start to
the last one's end), each device's busy time (the sum of its passes) and
its idle fraction, 1 - busy / span. With balanced stages, forward time F
and backward B per device and micro-batch, GPipe and 1F1B take
(m + p - 1)(F + B) and leave each device idle (p - 1) / (m + p - 1) of it:
the same bubble, different memory (`python -m scripts.bench pipeline`).
Interleaved 1F1B fills and drains in chunks of 1/v: (v·m + p - 1)(F + B) / v
(Narayanan et al. 2021). A row reports the medians over steps, the theory
beside them, and the step's wall time (the host's, from the step's start
to its logs).

Outputs in ``--output_dir``: pipeline_bubble_benchmark.json and .md.
"""

import json
import pathlib
import statistics
import sys
import threading
import time

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench import flags as bench_flags, measure, outputs  # noqa: E402

bench_flags.define_common("pipeline_bubble_benchmark", quick="p = 2, m = 2, 2 steps.")
flags.DEFINE_list("stages", ["2", "4"], "Device counts p (the stages with one per device).")
flags.DEFINE_list("stages_per_device", ["1", "2"], "v: 1 runs GPipe and 1F1B, more runs "
                  "interleaved 1F1B (where m is a multiple of p).")
flags.DEFINE_list("micro_batches", ["4", "8", "16"], "Micro-batch counts m.")
flags.DEFINE_float("forward_ms", 20.0, "Each stage's forward time per micro-batch (the "
                   "backward's is twice it).")
flags.DEFINE_integer("steps", 5, "Steps measured after the first.")
flags.DEFINE_string("run_of", None, "(internal) measure one run in this process: "
                    "'<devices>:<m>:<schedule>:<stages per device>'.")
FLAGS = flags.FLAGS
ROWS_PER_MICRO_BATCH = 8


class PassLog:
    """The passes the ``TimedWork`` ops ran: (stage, direction, start, end)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.passes = []

    def add(self, stage: int, direction: str, start: float, end: float) -> None:
        with self._lock:
            self.passes.append((stage, direction, start, end))

    def take(self) -> list:
        with self._lock:
            taken, self.passes = self.passes, []
        return taken


LOG = PassLog()


def timed_work_layer():
    """The ``TimedWork`` layer class (made once TensorFlow is imported)."""
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    def holding(stage: int, direction: str, seconds: float):
        def hold(values):
            start = time.perf_counter()
            time.sleep(seconds)
            LOG.add(stage, direction, start, time.perf_counter())
            return values
        return hold

    class TimedWork(keras.layers.Layer):
        """Passes its input through, holding its stage for a fixed time in
        the forward pass and twice that in the backward pass (module doc).
        The ops are stateless (``numpy_function(stateful=False)``): stateful
        ones would be run in program order, one stage after another."""

        def __init__(self, stage: int, forward_seconds: float, **kwargs):
            super().__init__(**kwargs)
            self.stage = stage
            self.forward_seconds = forward_seconds

        def call(self, inputs):
            forward = holding(self.stage, "forward", self.forward_seconds)
            backward = holding(self.stage, "backward", 2 * self.forward_seconds)

            @tf.custom_gradient
            def work(values):
                result = tf.numpy_function(forward, [values], values.dtype, stateful=False)
                result.set_shape(values.shape)

                def gradient(upstream):
                    passed = tf.numpy_function(backward, [upstream], upstream.dtype,
                                               stateful=False)
                    passed.set_shape(upstream.shape)
                    return passed

                return result, gradient

            return work(inputs)

        def compute_output_shape(self, input_shape):
            return input_shape

    return TimedWork


def step_figures(passes: list, devices: int) -> dict:
    """One step's span, and each device's busy seconds and idle fraction
    (stage s on device s mod p)."""
    span = max(end for *_, end in passes) - min(start for _, _, start, _ in passes)
    busy = [sum(end - start for stage, _, start, end in passes if stage % devices == d)
            for d in range(devices)]
    return {"span": span, "busy": busy, "idle": [1 - b / span for b in busy],
            "passes": len(passes)}


def measure_one(pipeline_devices: int, micro_batches: int, schedule: str,
                per_device: int) -> dict:
    """One (p, m, schedule, v), in this process."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    stages = pipeline_devices * per_device
    tf.config.threading.set_inter_op_parallelism_threads(2 * stages + 2)
    import tfdist  # pylint: disable=import-outside-toplevel

    devices = tfdist.strategies.configure_logical_cpus(pipeline_devices)
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel

    timed_work = timed_work_layer()
    forward = FLAGS.forward_ms / 1000  # (per device and micro-batch)
    keras.utils.set_random_seed(1)
    layers = [keras.Input((8,))]
    for stage in range(stages):
        layers += [keras.layers.Dense(8, "tanh", name=f"dense{stage}"),
                   timed_work(stage, forward / per_device, name=f"work{stage}")]
    model = keras.Sequential(layers + [keras.layers.Dense(1, name="out")])
    model.compile(optimizer="sgd", loss="mse")
    pipeline = tfdist.parallel.Pipeline(
        cuts=[f"work{stage}" for stage in range(stages - 1)], micro_batches=micro_batches,
        schedule=schedule, devices=devices, stages_per_device=per_device)
    model = tfdist.attach(model, parallel=pipeline)
    batch = ROWS_PER_MICRO_BATCH * micro_batches
    steps = 2 if FLAGS.quick else FLAGS.steps
    x = np.random.default_rng(0).random((batch * (steps + 1), 8), "float32")
    y = x.sum(axis=1, keepdims=True)
    figures, walls, began = [], [], []

    def on_begin(index, logs):
        del index, logs
        LOG.take()
        began.append(time.perf_counter())

    def on_end(index, logs):
        del logs
        walls.append(time.perf_counter() - began[-1])
        passes = LOG.take()
        if index > 0:  # (the first step traces)
            figures.append(step_figures(passes, pipeline_devices))

    model.fit(x, y, batch_size=batch, shuffle=False, verbose=0, callbacks=[
        keras.callbacks.LambdaCallback(on_train_batch_begin=on_begin,
                                       on_train_batch_end=on_end)])
    expected_passes = 2 * stages * micro_batches
    if any(f["passes"] != expected_passes for f in figures):
        raise RuntimeError(f"a step recorded {[f['passes'] for f in figures]} passes, "
                           f"not {expected_passes}")
    theory_span = (per_device * micro_batches + pipeline_devices - 1) * 3 * forward / per_device
    return {
        "devices": pipeline_devices, "stages_per_device": per_device, "stages": stages,
        "micro_batches": micro_batches, "schedule": schedule,
        "forward_ms": FLAGS.forward_ms,
        "span_ms": 1000 * statistics.median(f["span"] for f in figures),
        "theory_span_ms": 1000 * theory_span,
        "wall_ms": 1000 * statistics.median(walls[1:]),
        "idle_per_device": [statistics.median(f["idle"][d] for f in figures)
                            for d in range(pipeline_devices)],
        "theory_idle": tfdist.parallel.schedules.bubble_fraction(
            stages, micro_batches, per_device),
        "steps": len(figures),
    }


def table(rows: list) -> str:
    lines = ["| p | v | m | schedule | span ms (theory) | step wall ms | idle per device | "
             "theory (p-1)/(v·m+p-1) |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['devices']} | {r['stages_per_device']} | {r['micro_batches']} | "
              f"{r['schedule']} | "
              f"{r['span_ms']:.0f} ({r['theory_span_ms']:.0f}) | {r['wall_ms']:.0f} | "
              f"{' / '.join(f'{i:.3f}' for i in r['idle_per_device'])} | "
              f"{r['theory_idle']:.3f} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv) -> int:
    del argv  # every option is a flag
    if FLAGS.run_of:
        devices, micro_batches, schedule, per_device = FLAGS.run_of.split(":")
        print(json.dumps(measure_one(int(devices), int(micro_batches), schedule,
                                     int(per_device))))
        return 0
    device_counts = ["2"] if FLAGS.quick else FLAGS.stages
    counts = ["2"] if FLAGS.quick else FLAGS.micro_batches
    rows = []
    for devices in map(int, device_counts):
        for micro_batches in map(int, counts):
            for per_device in map(int, FLAGS.stages_per_device):
                if per_device > 1 and micro_batches % devices:
                    continue  # (interleaved 1F1B takes the micro-batches p at a time)
                for schedule in (("gpipe", "1f1b") if per_device == 1
                                 else ("interleaved_1f1b",)):
                    command = [sys.executable, __file__,
                               f"--run_of={devices}:{micro_batches}:{schedule}:{per_device}",
                               f"--quick={FLAGS.quick}", f"--forward_ms={FLAGS.forward_ms}",
                               f"--steps={FLAGS.steps}"]
                    rows.append(measure.row_in_fresh_process(command))
                    print(rows[-1], flush=True)
    text = table(rows)
    outputs.write_results(FLAGS.output_dir, "pipeline_bubble_benchmark", {"rows": rows}, text)
    print(text)
    return 0


if __name__ == "__main__":
    app.run(main)
