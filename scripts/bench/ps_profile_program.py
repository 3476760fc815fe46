"""Where a parameter-server step's time goes, per task: the chief of
`scripts/ps_profile.py`'s cluster (run under ``tfdist-run --num_ps=1``).

The contenders (`bench.contenders`) alternate in windows of about
``--window_seconds`` each, the order rotating per round. For every window it
records the wall time and the CPU seconds every task of the cluster spent
(the coordinator, each worker, the ps; read from ``/proc/<pid>/stat`` of the
launcher's children), so a gap between tfdist and the hand-written loop
shows up as extra CPU on a named task. At the end one more window per
contender runs under ``cProfile`` (the coordinator's Python; by own and
cumulative time). The result is
a JSON file.
"""

import argparse
import cProfile
import io
import json
import os
import pathlib
import pstats
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import contenders  # noqa: E402

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


def cluster_tasks() -> dict:
    """``{"coordinator": pid, "worker-0": pid, "ps-0": pid, ...}``: this
    process and its siblings (the launcher's other children), named by the
    task in their TF_CONFIG."""
    tasks = {"coordinator": os.getpid()}
    parent = os.getppid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) != parent:
                    continue
            with open(f"/proc/{entry}/environ", "rb") as environ:
                variables = dict(item.split(b"=", 1) for item in environ.read().split(b"\0")
                                 if b"=" in item)
        except OSError:
            continue
        if b"TF_CONFIG" in variables:
            task = json.loads(variables[b"TF_CONFIG"])["task"]
            tasks[f"{task['type']}-{task['index']}"] = int(entry)
    return tasks


def timed_window(run, steps: int, tasks: dict) -> dict:
    before = {name: cpu_seconds(pid) for name, pid in tasks.items()}
    start = time.perf_counter()
    run(steps)
    wall = time.perf_counter() - start
    return {"wall_s": wall,
            "cpu_s": {name: cpu_seconds(pid) - before[name] for name, pid in tasks.items()}}


def profiled_window(run, steps: int, top: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    run(steps)
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return text.getvalue()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--steps_per_execution", type=int, default=1)
    parser.add_argument("--global_batch_size", type=int, default=256)
    parser.add_argument("--window_seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--contenders", default="tfdist,custom_loop")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()

    import tfdist  # pylint: disable=import-outside-toplevel

    strategy = tfdist.make_strategy("parameter_server", timeout_seconds=120)
    spe = args.steps_per_execution
    names = args.contenders.split(",")
    runners = {name: build() for name, build in contenders.builders(
        strategy, args.model, args.global_batch_size, spe, names).items()}
    tasks = cluster_tasks()
    print(f"tasks: {tasks}", flush=True)
    probe = max(2, 64 // spe) * spe
    for run in runners.values():
        run(probe)  # tracing, then warm
    start = time.perf_counter()
    runners[names[-1]](probe)
    per_step = (time.perf_counter() - start) / probe
    steps = max(2, round(args.window_seconds / per_step / spe)) * spe
    print(f"window: {steps} steps", flush=True)
    windows = {name: [] for name in names}
    for index in range(args.rounds):
        order = names[index % len(names):] + names[:index % len(names)]
        for name in order:
            windows[name].append(timed_window(runners[name], steps, tasks))
        print(f"round {index + 1}/{args.rounds}: " + ", ".join(
            f"{name} {args.global_batch_size * steps / windows[name][-1]['wall_s']:,.0f} ex/s"
            for name in names), flush=True)
    profiles = {name: profiled_window(runners[name], steps, top=25) for name in names}
    summary = {}
    for name in names:
        summary[name] = {
            "examples_per_s": statistics.median(
                args.global_batch_size * steps / w["wall_s"] for w in windows[name]),
            "cpu_ms_per_step": {task: statistics.median(1000 * w["cpu_s"][task] / steps
                                                        for w in windows[name])
                                for task in tasks},
            "wall_ms_per_step": statistics.median(1000 * w["wall_s"] / steps
                                                  for w in windows[name]),
        }
    pathlib.Path(args.output).write_text(json.dumps(
        {"config": vars(args), "tasks": tasks, "window_steps": steps, "summary": summary,
         "windows": windows, "profiles": profiles}, indent=1))


if __name__ == "__main__":
    main()
