"""Benchmark: tfdist against Keras `fit` and a hand-written loop, every strategy.

    python scripts/benchmark.py                      # the full table, ~50 min here
    python scripts/benchmark.py --quick              # every code path, ~1 min
    python scripts/benchmark.py --strategies=mirrored:2 --models=mlp --rounds=10

Strategies (``--strategies``): ``one_device``, ``mirrored:N`` (N logical
CPUs, or N GPUs where there are GPUs), ``multi_worker:N`` (N workers under
``tfdist-run``, MultiWorkerMirroredStrategy, one replica each) and
``parameter_server:N`` (N workers + 1 ps under ``tfdist-run --num_ps=1``).
Each configuration (strategy x model x steps_per_execution) runs in its own
process or cluster, because logical devices and TF_CONFIG are fixed per
process. Inside it the contenders (`bench.contenders`: tfdist `Trainer.fit`,
`tfdist.attach` + `model.fit`, Keras 3 `fit`, a hand-written
`strategy.run` / `ClusterCoordinator` loop) train the same model on the same
data, global batch and strategy, timed in windows of about
``--window_seconds`` that alternate with a rotating order (`bench.timing`).
Reported: median examples/s and each contender's PAIRED ratio to the
hand-written loop and to Keras `fit` (same round), with quartiles and the
medians of the first and second half of the rounds, which show whether the
run was long enough.

Outputs in ``--output_dir``: benchmark.json (every rate), benchmark.txt,
benchmark.md (the docs' Performance tables: per configuration,
scaling, then per contender) and with ``--plot`` ratios.png and
scaling.png (throughput against replicas, with the ideal line).
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench import flags as bench_flags, contenders, report, workloads  # noqa: E402

bench_flags.define_common(
    "benchmark", quick="one_device, mirrored:2, multi_worker:2 and parameter_server:1, the mlp, spe 2, 2 rounds of 0.2 s windows.")
flags.DEFINE_list("strategies", ["one_device", "mirrored:2", "mirrored:4", "multi_worker:2",
                                 "parameter_server:1", "parameter_server:2"],
                  "one_device, mirrored:N, multi_worker:N, parameter_server:N.")
flags.DEFINE_list("models", list(workloads.MODELS), "mlp, convnet, embedding.")
flags.DEFINE_list("steps_per_execution", ["1", "16"], "Values to run.")
flags.DEFINE_list("contenders", list(contenders.DEFAULT),
                  f"Of {list(contenders.DEFAULT + contenders.OPTIONAL)}.")
flags.DEFINE_integer("global_batch_size", 256, "Global batch size.")
flags.DEFINE_float("window_seconds", 1.5, "Length of one timed window.")
flags.DEFINE_integer("rounds", 10, "Timed rounds (each contender once per round, each between two windows of the hand-written loop).")
flags.DEFINE_integer("probe_steps", 64, "Warm-up / calibration steps.")
flags.DEFINE_bool("keep_teardown_stall", False,
                  "Keep TensorFlow's iterator-teardown stall in the windows (bench.teardown): "
                  "what an epoch's end costs a user, but it decides most windows' rates.")
flags.DEFINE_bool("plot", False, "Also draw ratios.png and scaling.png (matplotlib).")
flags.DEFINE_string("child", None, "Internal: run one single-process configuration (JSON).")
flags.DEFINE_integer("timeout_seconds", 1800, "Bound on one configuration.")
FLAGS = flags.FLAGS

CLUSTER_PROGRAM = pathlib.Path(__file__).resolve().parent / "bench" / "cluster_program.py"


def _validate_strategy(entry: str) -> None:
    kind, _, count = entry.partition(":")
    if kind not in ("one_device", "mirrored", "multi_worker", "parameter_server") or (
            count and not count.isdigit()) or (kind == "one_device" and count):
        raise app.UsageError(
            f"--strategies: {entry!r} is not one_device, mirrored:N, multi_worker:N or "
            "parameter_server:N (N a positive number).")


def _configurations():
    if FLAGS.quick:
        strategies = ["one_device", "mirrored:2", "multi_worker:2", "parameter_server:1"]
        models, spes, rounds, window, probe = ["mlp"], [2], 2, 0.2, 8
    else:
        strategies, models = FLAGS.strategies, FLAGS.models
        spes = [int(value) for value in FLAGS.steps_per_execution]
        rounds, window, probe = FLAGS.rounds, FLAGS.window_seconds, FLAGS.probe_steps
    for entry in strategies:
        _validate_strategy(entry)
    for entry in strategies:
        for model in models:
            for spe in spes:
                yield {"strategy": entry, "model": model, "steps_per_execution": spe,
                       "global_batch_size": FLAGS.global_batch_size,
                       "contenders": FLAGS.contenders, "window_seconds": window,
                       "rounds": rounds, "probe_steps": probe,
                       "keep_teardown_stall": FLAGS.keep_teardown_stall}


# -- a single-process configuration (child process) ------------------------


def run_child(config) -> dict:
    from bench import measure, teardown  # pylint: disable=import-outside-toplevel

    import tfdist  # pylint: disable=import-outside-toplevel

    if not config.get("keep_teardown_stall"):
        teardown.remove_iterator_teardown_stall()

    kind, _, count = config["strategy"].partition(":")
    strategy = (tfdist.make_strategy("mirrored", num_replicas=int(count) if count else None)
                if kind == "mirrored" else tfdist.make_strategy("one_device"))
    builders = contenders.builders(strategy, config["model"], config["global_batch_size"],
                                   config["steps_per_execution"], config["contenders"])
    result = measure.measure(
        builders, batch_size=config["global_batch_size"],
        steps_per_execution=config["steps_per_execution"],
        window_seconds=config["window_seconds"], rounds=config["rounds"],
        probe_steps=config["probe_steps"], progress=lambda line: print(line, file=sys.stderr, flush=True))
    return dict(result, config=config)


# -- the parent: one process or cluster per configuration ------------------


def _run(command, output_path, config) -> dict:
    """Runs ``command`` in its own session, streaming its progress; the
    whole session is killed when it overruns ``--timeout_seconds``."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    process = subprocess.Popen(command, env=env, start_new_session=True,
                               stdout=subprocess.PIPE if output_path is None else None,
                               text=True)
    try:
        stdout, _ = process.communicate(timeout=FLAGS.timeout_seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return {"config": config, "error": f"timed out after {FLAGS.timeout_seconds} s"}
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # anything left in the session
        except ProcessLookupError:
            pass
    if process.returncode != 0:
        return {"config": config, "error": f"exit code {process.returncode}"}
    text = stdout if output_path is None else pathlib.Path(output_path).read_text()
    return json.loads(text.strip().splitlines()[-1])


def run_configuration(config, output_dir) -> dict:
    kind, _, count = config["strategy"].partition(":")
    if kind in ("one_device", "mirrored"):
        command = [sys.executable, os.path.abspath(__file__), f"--child={json.dumps(config)}"]
        return _run(command, None, config)
    name = f"{config['strategy']}-{config['model']}-{config['steps_per_execution']}".replace(":", "")
    output = os.path.join(output_dir, f"cluster-{name}.json")
    command = [sys.executable, "-m", "tfdist.launch", f"--num_workers={int(count or 2)}",
               "--grace_period=5"]
    if kind == "parameter_server":
        command.append("--num_ps=1")
    command += ["--", sys.executable, str(CLUSTER_PROGRAM), f"--config={json.dumps(config)}",
                f"--output={output}"]
    return _run(command, output, config)


def main(argv):
    del argv
    if FLAGS.child:
        print(json.dumps(run_child(json.loads(FLAGS.child))))
        return
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    configurations = list(_configurations())
    runs, started = [], time.monotonic()
    for index, config in enumerate(configurations, 1):
        print(f"[{index}/{len(configurations)}, {time.monotonic() - started:.0f} s] "
              f"{config['strategy']} {config['model']} spe={config['steps_per_execution']}",
              flush=True)
        runs.append(run_configuration(config, FLAGS.output_dir))
    table = report.text_table(runs)
    print(table)
    out = pathlib.Path(FLAGS.output_dir)
    (out / "benchmark.json").write_text(json.dumps(runs, indent=1))
    (out / "benchmark.txt").write_text(table + "\n")
    (out / "benchmark.md").write_text("\n\n".join([
        report.summary_table(runs), report.scaling_table(runs),
        report.markdown_table(runs)]) + "\n")
    if FLAGS.plot:
        report.plot(runs, str(out / "ratios.png"), str(out / "scaling.png"))
    failed = [run["config"] for run in runs if "error" in run]
    if failed:
        print(f"{len(failed)} configuration(s) failed: {failed}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
