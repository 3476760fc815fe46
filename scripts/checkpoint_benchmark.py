"""Benchmark: what checkpoints every N steps cost, synchronous against background.

    python scripts/checkpoint_benchmark.py            # 25.6M weights, ~10 min here
    python scripts/checkpoint_benchmark.py --quick    # every path, tiny model, ~1 min
    python scripts/checkpoint_benchmark.py --spare_core   # the writer on a core of its own

A 25.6M-parameter embedding classifier (a 400,000 x 64 table, ~100 MB of
weights, SGD) trains under MirroredStrategy(2) (logical CPUs) with
`tfdist.Trainer` in three forms, each its own model and Trainer:

- ``none``: no checkpoints (the reference);
- ``sync``: a checkpoint every ``--every`` steps, written in the training thread;
- ``async``: the same, ``async_checkpoint=True`` (written in the background).

Windows of ``--window_steps`` steps (one ``fit`` of one epoch each, on a
fresh checkpoint directory, so nothing is restored) alternate
``none sync none async none`` with a rotating order (`bench.timing`); the
figure is each form's PAIRED throughput ratio to its neighbouring ``none``
windows (1.0: saves cost nothing). A window ends when ``fit`` returns, so
an async window includes waiting for its last write.

Then, for each form, a fresh process trains ``3 * --every`` steps and
reports its host memory peak over its RSS before training, and the time a
save holds the training thread (``blocking``) and until its files are
complete (``complete``), as medians over its saves.

With ``--spare_core`` everything runs as above on the first CPU only,
except TensorFlow's background writer thread, which gets the second: what
background saves cost where the writer does not share the cores training
uses (the default run shares them, as a job on every core does).

Outputs in ``--output_dir``: checkpoint_benchmark.json and .md (the docs'
table); checkpoint_benchmark_spare_core.json and .md with ``--spare_core``.
"""

import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

from absl import app, flags, logging

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import flags as bench_flags, outputs, teardown, timing, workloads  # noqa: E402

bench_flags.define_common(
    "checkpoint_benchmark", quick="a 1,000-row table, 1 round of 40-step windows.")
flags.DEFINE_integer("vocabulary", 400_000, "Rows of the embedding table.")
flags.DEFINE_integer("dimension", 64, "Columns of the embedding table.")
flags.DEFINE_integer("every", 20, "Steps between checkpoints.")
flags.DEFINE_integer("window_steps", 240, "Steps per timed window (one fit).")
flags.DEFINE_integer("rounds", 5, "Timed rounds.")
flags.DEFINE_integer("global_batch_size", 256, "Global batch size.")
flags.DEFINE_bool("spare_core", False,
                  "Train on the first CPU only and give TensorFlow's background writer thread "
                  "the second (needs 2 CPUs).")
flags.DEFINE_string("memory_of", None, "(internal) measure one form in this process.")
FLAGS = flags.FLAGS

FORMS = ("none", "sync", "async")
SEQUENCE, CLASSES = 32, 10


def _rss_bytes() -> int:
    with open("/proc/self/statm", encoding="utf-8") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Cores:
    """With ``--spare_core``: training on one CPU, the writer on another."""

    def __init__(self):
        self.training, self.writer = None, None
        self.writer_threads = set()  # native ids of the writer threads placed
        self.all_cpus = os.sched_getaffinity(0)  # for the processes this one starts
        if not FLAGS.spare_core:
            return
        cpus = sorted(self.all_cpus)
        if len(cpus) < 2:
            raise SystemExit(f"--spare_core needs 2 CPUs; this process may use {cpus}.")
        self.training, self.writer = {cpus[0]}, {cpus[1]}
        for thread in os.listdir("/proc/self/task"):  # threads made later inherit it
            os.sched_setaffinity(int(thread), self.training)

    def place_writer(self, checkpoint) -> None:
        """Moves TensorFlow's writer thread (alive after an async save) to its CPU."""
        writes = checkpoint.writes
        helper = writes._helper() if writes is not None else None  # pylint: disable=protected-access
        thread = getattr(helper, "_async_save_thread", None)
        if self.writer and thread is not None and thread.native_id is not None:
            os.sched_setaffinity(thread.native_id, self.writer)
            self.writer_threads.add(thread.native_id)

    def describe(self) -> dict:
        return {"training_cpus": sorted(self.training or os.sched_getaffinity(0)),
                "writer_cpus": sorted(self.writer or os.sched_getaffinity(0)),
                "writer_threads_placed": len(self.writer_threads)}


_CORES: Optional[_Cores] = None  # set by _setup, once flags are parsed


def _setup():
    global _CORES  # pylint: disable=global-statement
    _CORES = _Cores()
    import tfdist  # pylint: disable=import-outside-toplevel

    tfdist.strategies.configure_logical_cpus(2)
    teardown.remove_iterator_teardown_stall()
    return tfdist, tfdist.make_strategy("mirrored", num_replicas=2)


def _dataset(tf):
    """One in-memory global batch, repeated (the input costs nothing)."""
    tokens = tf.random.stateless_uniform([FLAGS.global_batch_size, SEQUENCE], [1, 2],
                                         maxval=FLAGS.vocabulary, dtype=tf.int32)
    labels = tf.random.stateless_uniform([FLAGS.global_batch_size], [3, 4],
                                         maxval=CLASSES, dtype=tf.int32)
    batch = tf.data.Dataset.from_tensors((tokens, labels))
    return teardown.without_autotune(batch.repeat())


class _StepClock:
    """The time of every training step's end (a Keras callback)."""

    def __new__(cls):
        import keras  # pylint: disable=import-outside-toplevel

        class StepClock(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.times = []
                self.saves_after = []  # how many steps had ended at each save

            def on_train_batch_end(self, batch, logs=None):
                self.times.append(time.perf_counter())

        return StepClock()


class _Form:
    """One form's model, Trainer and fresh checkpoint directory per fit."""

    def __init__(self, tfdist, strategy, form: str, root: str):
        import keras  # pylint: disable=import-outside-toplevel

        with strategy.scope():
            model = workloads.examples_recipes().build_embedding_model(
                FLAGS.vocabulary, SEQUENCE, CLASSES, dimension=FLAGS.dimension)
            model.compile(optimizer=keras.optimizers.SGD(0.1),
                          loss="sparse_categorical_crossentropy")
        self.form, self.root, self.saves, self.steady = form, root, [], []
        self.directory = os.path.join(root, form)
        self.clock = None  # the running fit's step clock
        self.since_save = None  # step durations by steps since the last save
        self.forget_steps()
        self.trainer = tfdist.Trainer(model, strategy,
            checkpointing=tfdist.CheckpointOptions(
                None if form == "none" else self.directory, every_steps=FLAGS.every,
                every_epoch=False, async_write=form == "async"),
            reporting=tfdist.ReportingOptions(log_every_steps=10**9))
        checkpoint = self.trainer._checkpoint  # pylint: disable=protected-access
        if checkpoint is not None:  # time each save in the training thread
            save = checkpoint.save

            def timed_save(*args, **kwargs):
                start = time.perf_counter()
                path = save(*args, **kwargs)
                self.saves.append(time.perf_counter() - start)
                self.clock.saves_after.append(len(self.clock.times))
                _CORES.place_writer(checkpoint)
                return path

            checkpoint.save = timed_save

    def run(self, dataset, steps: int) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)  # nothing to restore
        clock = self.clock = _StepClock()
        self.trainer.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[clock])
        self._count_steps_since_save(clock)
        if len(clock.times) > FLAGS.every:
            # Steps per second from the first save on, to the window's last
            # step: every save's copy and write, not the wait for the last
            # write when fit returns (once per fit, not per save).
            first = FLAGS.every - 1
            self.steady.append((len(clock.times) - 1 - first)
                               / (clock.times[-1] - clock.times[first]))

    def forget_steps(self) -> None:
        """Starts `since_save` afresh (after the warm-up): per position, the
        durations of the steps that many steps after a save (0: the step
        the save falls in, from the end of the step before it to the end
        of the next); "none" has no saves and counts every step at 0."""
        self.since_save = [[] for _ in range(FLAGS.every)]

    def _count_steps_since_save(self, clock) -> None:
        """Files each step's duration under the steps since the last save
        (a save runs after a step's end, so it falls in the next step's)."""
        last_save = None
        saves = iter(clock.saves_after)
        next_save = next(saves, None)
        for index in range(1, len(clock.times)):
            while next_save is not None and next_save <= index:
                last_save, next_save = next_save, next(saves, None)
            if last_save is None and clock.saves_after:
                continue  # before the window's first save
            since = 0 if last_save is None else index - last_save
            if since < FLAGS.every:
                self.since_save[since].append(clock.times[index] - clock.times[index - 1])

    def steps_after_save_ms(self, step_without_saves: float) -> dict:
        """What a save adds to the step it falls in and to the steps after
        it, in ms over ``step_without_saves`` (medians by position)."""
        extra = [1e3 * (statistics.median(durations) - step_without_saves)
                 if durations else None for durations in self.since_save]
        return {"save_step_ms": extra[0],
                "later_steps_ms": sum(value for value in extra[1:] if value is not None),
                "by_steps_since_save_ms": extra}


def _measure_memory(form: str) -> dict:
    """Peak RSS over the RSS before training, and save durations (this process)."""
    tfdist, strategy = _setup()
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    root = tempfile.mkdtemp(prefix="tfdist-ckpt-bench-")
    try:
        runner = _Form(tfdist, strategy, form, root)
        dataset = _dataset(tf)
        runner.run(dataset, 2)  # traced and built
        runner.saves.clear()
        before, peak, running = _rss_bytes(), [0], [True]

        def sample():  # the lifetime peak (ru_maxrss) may predate training
            while running[0]:
                peak[0] = max(peak[0], _rss_bytes())
                time.sleep(0.002)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        runner.run(dataset, 3 * FLAGS.every)
        running[0] = False
        sampler.join()
        peak = peak[0]
        result = {"form": form, "rss_before_mb": before / 2**20,
                  "peak_over_before_mb": max(0, peak - before) / 2**20}
        if form != "none":
            checkpoint = runner.trainer._checkpoint  # pylint: disable=protected-access
            complete = []
            for step in range(1, 6):  # a save, then its files complete
                start = time.perf_counter()
                checkpoint.save(10**6 + step, 0, 0)
                checkpoint.finish_writes()
                complete.append(time.perf_counter() - start)
            result.update(blocking_ms=1e3 * statistics.median(runner.saves[:3]),
                          complete_ms=1e3 * statistics.median(complete),
                          checkpoint_mb=sum(os.path.getsize(os.path.join(runner.directory, f))
                                            for f in os.listdir(runner.directory)
                                            if f.startswith(f"ckpt-{10**6 + 5}.")) / 2**20)
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _memory_in_subprocess(form: str) -> dict:
    argv = [sys.executable, __file__, f"--memory_of={form}"] + [
        f"--{name}={getattr(FLAGS, name)}"
        for name in ("vocabulary", "dimension", "every", "global_batch_size", "quick",
                     "spare_core")]
    every_cpu = _CORES.all_cpus  # the child places its own threads
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True,
                               env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                               preexec_fn=lambda: os.sched_setaffinity(0, every_cpu))
    try:
        out, _ = process.communicate(timeout=900)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"the memory run of {form!r} failed (exit {process.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def _markdown(result: dict) -> str:
    rows = ["| form | throughput vs no saves (median, p25-p75) | steady state, without "
            "the end-of-fit wait | save blocks training | save complete | host memory peak "
            "over start |",
            "|---|---|---|---|---|---|"]
    for form in FORMS:
        ratio = result["vs_none"].get(form)
        memory = result["memory"][form]
        cell = (f"{ratio['median']:.2f} ({ratio['p25']:.2f}-{ratio['p75']:.2f})"
                if ratio else "1.00 (reference)")
        steady = result.get("steady_vs_none", {}).get(form)
        steady_cell = f"{steady:.2f}" if steady is not None else "-"
        rows.append(f"| {form} | {cell} | {steady_cell} | {memory.get('blocking_ms', 0):.0f} ms | "
                    f"{memory.get('complete_ms', 0):.0f} ms | "
                    f"{memory['peak_over_before_mb']:.0f} MB |")
    rows += ["", f"What a save adds to the timed windows' steps (ms over the median step "
                 f"without saves, {result['step_without_saves_ms']:.1f} ms):", "",
             "| form | the step the save falls in | the steps after it, in all | per save |",
             "|---|---|---|---|"]
    for form, added in result["what_a_save_adds"].items():
        rows.append(f"| {form} | {added['save_step_ms']:.1f} ms | {added['later_steps_ms']:.1f} ms "
                    f"| {added['save_step_ms'] + added['later_steps_ms']:.1f} ms |")
    return "\n".join(rows) + "\n"


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # TensorFlow's async writer logs each save
    if FLAGS.quick:
        FLAGS.vocabulary, FLAGS.rounds, FLAGS.window_steps = 1000, 1, 40
    if FLAGS.memory_of:
        print(json.dumps(_measure_memory(FLAGS.memory_of)), flush=True)
        return
    tfdist, strategy = _setup()
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    root = tempfile.mkdtemp(prefix="tfdist-ckpt-bench-")
    try:
        dataset = _dataset(tf)
        forms = {form: _Form(tfdist, strategy, form, root) for form in FORMS}
        for runner in forms.values():  # traced, built, a save or two warmed up
            runner.run(dataset, 2 * FLAGS.every)
            runner.forget_steps()
        runners = {form: (lambda steps, runner=forms[form]: runner.run(dataset, steps))
                   for form in FORMS}
        timeline = timing.alternate(runners, FLAGS.rounds, FLAGS.window_steps, FLAGS.global_batch_size,
                                    reference="none")
        waits = forms["async"].trainer._checkpoint.writes.waits  # pylint: disable=protected-access
        steady = {form: forms[form].steady[1:] for form in FORMS}  # (not the warm-up fit)
        step_without_saves = statistics.median(forms["none"].since_save[0])
        after_save = {form: forms[form].steps_after_save_ms(step_without_saves)
                      for form in ("sync", "async")}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    parameters = FLAGS.vocabulary * FLAGS.dimension + FLAGS.dimension * CLASSES + CLASSES
    result = {
        "config": {"parameters": parameters, "every": FLAGS.every,
                   "window_steps": FLAGS.window_steps, "rounds": FLAGS.rounds,
                   "global_batch_size": FLAGS.global_batch_size, "strategy": "mirrored:2",
                   "spare_core": FLAGS.spare_core, **_CORES.describe()},
        "rates": timing.rates_by_name(timeline),
        "vs_none": timing.paired_ratios(timeline, "none"),
        "async_waits_for_previous_write": waits,
        "step_without_saves_ms": 1e3 * step_without_saves,
        "what_a_save_adds": after_save,
        "steady_vs_none": {form: statistics.median(steady[form]) / statistics.median(steady["none"])
                           for form in FORMS if steady[form] and steady["none"]},
        "memory": {form: _memory_in_subprocess(form) for form in FORMS},
    }
    table = _markdown(result)
    name = "checkpoint_benchmark_spare_core" if FLAGS.spare_core else "checkpoint_benchmark"
    outputs.write_results(FLAGS.output_dir, name, result, table)
    cores = (f"training on CPU {result['config']['training_cpus']}, the writer on CPU "
             f"{result['config']['writer_cpus']}" if FLAGS.spare_core else "on every CPU")
    print(f"{parameters / 1e6:.1f}M parameters, a checkpoint every {FLAGS.every} steps, "
          f"MirroredStrategy(2), {cores}:\n{table}", flush=True)


if __name__ == "__main__":
    app.run(main)
