"""Where the time of a parameter-server step goes, tfdist against the
hand-written ``ClusterCoordinator`` loop, per task of one real cluster.

    python scripts/ps_profile.py --num_workers=2 --model=mlp --steps_per_execution=1
    python scripts/ps_profile.py --contenders=tfdist,custom_loop,custom_loop_tfdist_data

Starts ``tfdist-run --num_workers=N --num_ps=1`` with
`scripts/bench/ps_profile_program.py` as the chief, which alternates the
contenders of `scripts/benchmark.py` (``tfdist`` = ``Trainer.fit``,
``custom_loop`` = TensorFlow's tutorial loop; ``custom_loop_tfdist_data``
= that loop on tfdist's per-worker streams, to tell the data's cost from
the step's) in windows of a few seconds
and samples every task's CPU time from ``/proc``. Prints, per contender,
examples/s and CPU milliseconds per step of each task (medians over the
windows), and the coordinator's ``cProfile`` of one window each
(``--show_profiles``). On this 2-core machine the coordinator, the ps and
every worker share the cores, so CPU any task spends per step is time
the others lose.
"""

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
PROGRAM = REPO / "scripts" / "bench" / "ps_profile_program.py"


def table(result: dict) -> str:
    summary = result["summary"]
    names = list(summary)
    tasks = sorted(result["tasks"], key=lambda t: (t != "coordinator", t))
    width = max([len("contender")] + [len(name) for name in names])
    lines = [f"{'contender':<{width}} {'ex/s':>9} {'wall ms/step':>12} "
             + " ".join(f"{t + ' cpu':>16}" for t in tasks) + f" {'all cpu':>9}"]
    for name in names:
        row = summary[name]
        cpu = row["cpu_ms_per_step"]
        lines.append(f"{name:<{width}} {row['examples_per_s']:>9,.0f} {row['wall_ms_per_step']:>12.2f} "
                     + " ".join(f"{cpu[t]:>16.2f}" for t in tasks)
                     + f" {sum(cpu.values()):>9.2f}")
    for name in names[:1] + names[2:]:  # each against the second (the loop, by default)
        if len(names) < 2:
            break
        first, second = summary[name], summary[names[1]]
        lines.append(f"{name} / {names[1]}: "
                     f"{first['examples_per_s'] / second['examples_per_s']:.3f} x examples/s; "
                     "CPU ms per step, difference: " + ", ".join(
                         f"{t} {first['cpu_ms_per_step'][t] - second['cpu_ms_per_step'][t]:+.2f}"
                         for t in tasks))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num_workers", type=int, default=2)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--steps_per_execution", type=int, default=1)
    parser.add_argument("--window_seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--contenders", default="tfdist,custom_loop")
    parser.add_argument("--timeout_seconds", type=float, default=900)
    parser.add_argument("--show_profiles", action="store_true")
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tfdist-ps-profile-") as workdir:
        output = os.path.join(workdir, "result.json")
        command = [sys.executable, "-m", "tfdist.launch", f"--num_workers={args.num_workers}",
                   "--num_ps=1", "--grace_period=5", "--", sys.executable, str(PROGRAM),
                   f"--model={args.model}", f"--steps_per_execution={args.steps_per_execution}",
                   f"--window_seconds={args.window_seconds}", f"--rounds={args.rounds}",
                   f"--contenders={args.contenders}", f"--output={output}"]
        process = subprocess.Popen(command, cwd=REPO, start_new_session=True,
                                   env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        try:
            process.wait(timeout=args.timeout_seconds)
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # every task, also on failure
            except ProcessLookupError:
                pass
        if not os.path.exists(output):
            sys.exit(f"ps_profile: the cluster wrote no result (exit code {process.returncode}).")
        result = json.loads(pathlib.Path(output).read_text())
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"\n{args.num_workers} workers + 1 ps, {args.model}, spe {args.steps_per_execution}, "
          f"{result['window_steps']} steps per window, {args.rounds} rounds (medians)")
    print(table(result))
    if args.show_profiles:
        for name, text in result["profiles"].items():
            print(f"\n--- coordinator cProfile, one window of {name} ---\n{text}")


if __name__ == "__main__":
    main()
