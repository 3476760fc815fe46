"""Chaos: seeded random faults on real local clusters, each trial judged.

    python scripts/chaos.py --trials=20 --seed=1             # long form, 2 workers
    python scripts/chaos.py --mode=ps --trials=10 --seed=1   # long form, parameter servers
    python scripts/chaos.py --trials=3 --seed=7              # short form (tests/scenarios/test_chaos.py)

Each trial starts a real local cluster with ``tfdist-run --max_restarts=2``:
``--mode=mwms``: 2 workers running tests/programs/train_reference_mlp.py;
``--mode=ps``: a chief, 1 worker and 1 ps running tests/programs/train_ps.py.
Both train 3 epochs of 5 steps with a checkpoint every 2 steps, 0.2 s per
step, and validate on 4,000 examples after every epoch. One fault is
injected, drawn from the seed:

* a signal: SIGKILL, SIGTERM, SIGSTOP (never continued) or SIGSTOP then
  SIGCONT after 2-6 s;
* a task: worker-0 (the chief) or worker-1 (mwms); chief-0, worker-0 or
  ps-0 (ps);
* a moment: start-up (0-4 s after launch), a training step (after the
  N-th progress line), right after a checkpoint save, or during an epoch's
  validation.

Outcomes, exactly one per trial:

* ``exact``: the run finished and every worker's weights equal single-device
  Keras ``fit`` on the same data (1e-5);
* ``named error``: the run failed, within the bound, with a last line naming
  the task;
* defects: ``WRONG`` (finished, weights differ), ``HANG`` (no end within
  --trial_timeout), ``ORPHAN`` (a task still alive after the launcher
  exited), ``CORRUPT`` (the newest checkpoint does not load).

Prints a table of trials; exits 1 if any trial is a defect.
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

_STARTED = re.compile(r"\[launcher\] started (\S+) \(pid (\d+)\)")
SIGNALS = ("SIGKILL", "SIGTERM", "SIGSTOP", "SIGSTOP+CONT")
TASKS = {"mwms": ("worker-0", "worker-1"), "ps": ("chief-0", "worker-0", "ps-0")}
MOMENTS = ("start-up", "step", "checkpoint", "evaluation")
# The task whose progress lines mark the moments, and the result files.
LEADER = {"mwms": "worker-0", "ps": "chief-0"}
RESULTS = {"mwms": ("worker-0.json", "worker-1.json"), "ps": ("chief.json",)}


def draw(rng: random.Random, mode: str = "mwms"):
    """One fault: (signal, task, moment, detail)."""
    sig, task, moment = rng.choice(SIGNALS), rng.choice(TASKS[mode]), rng.choice(MOMENTS)
    detail = {"start-up": rng.uniform(0, 4), "step": rng.randint(1, 12),
              "checkpoint": 2 * rng.randint(1, 6), "evaluation": rng.randint(1, 3)}[moment]
    cont_after = rng.uniform(2, 6) if sig == "SIGSTOP+CONT" else None
    return {"signal": sig, "task": task, "moment": moment, "at": round(detail, 1),
            "cont_after": None if cont_after is None else round(cont_after, 1)}


class Cluster:
    """tfdist-run as a real process; output collected; everything ended by pid."""

    def __init__(self, workdir: str, mode: str = "mwms", bandwidth: str = ""):
        tasks, program = (
            (["--num_workers=2"], "tests/programs/train_reference_mlp.py") if mode == "mwms"
            else (["--num_workers=1", "--num_ps=1"], "tests/programs/train_ps.py")
        )
        command = [
            sys.executable, "-m", "tfdist.launch", *tasks, "--max_restarts=2",
            *([f"--bandwidth={bandwidth}"] if bandwidth else []),
            "--hang_timeout=10", "--grace_period=10", "--",
            sys.executable, program,
            f"--output_dir={workdir}/out", f"--checkpoint_dir={workdir}/ckpt",
            "--checkpoint_every_steps=2", "--step_delay=0.2", "--log_every_steps=1",
            "--validation_examples=4000",
        ]
        self.leader = LEADER[mode]
        self.lines = []
        self.process = subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1"),
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def pids(self):
        return {m.group(1): int(m.group(2)) for m in map(_STARTED.search, list(self.lines)) if m}

    def all_pids(self):
        return [int(m.group(2)) for m in map(_STARTED.search, list(self.lines)) if m]

    def wait_for(self, pattern, timeout):
        regex, deadline = re.compile(pattern), time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            if any(regex.search(line) for line in list(self.lines)):
                return True
            time.sleep(0.02)
        return False

    def orphans(self):
        alive = []
        for pid in self.all_pids():
            try:
                os.kill(pid, 0)
                with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                    if stat.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(pid)
            except (ProcessLookupError, FileNotFoundError):
                pass
        return alive

    def close(self):
        for pid in [self.process.pid] + self.all_pids():
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.process.wait()


def inject(cluster: Cluster, fault) -> str:
    """Waits for the fault's moment and sends it; returns what happened."""
    task, leader = fault["task"], cluster.leader
    if fault["moment"] == "start-up":
        cluster.wait_for(rf"\[launcher\] started {task}", 30)
        time.sleep(fault["at"])
    elif fault["moment"] == "step":
        if not cluster.wait_for(rf"\[{leader}\] train \| epoch \d \| step {fault['at'] % 5 or 5}/5", 120):
            return "moment never came"
    elif fault["moment"] == "evaluation":  # the epoch's last step is logged, then it validates
        if not cluster.wait_for(rf"\[{leader}\] train \| epoch {fault['at']} \| step 5/5", 120):
            return "moment never came"
        time.sleep(0.1)
    else:  # right after the save at this global step (every 2 steps)
        step = fault["at"]
        epoch, in_epoch = (step - 1) // 5 + 1, (step - 1) % 5 + 1
        if not cluster.wait_for(rf"\[{leader}\] train \| epoch {epoch} \| step {in_epoch}/5", 120):
            return "moment never came"
    pid = cluster.pids().get(task)
    if pid is None:
        return "task not started"
    sig = signal.SIGSTOP if fault["signal"].startswith("SIGSTOP") else getattr(signal, fault["signal"])
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return "task already gone"
    if fault["cont_after"] is not None:
        time.sleep(fault["cont_after"])
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    return "sent"


def checkpoint_loads(directory: str) -> bool:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    latest = tf.train.latest_checkpoint(directory)
    if latest is None:
        return True  # nothing saved yet is not corruption
    reader = tf.train.load_checkpoint(latest)
    for name in reader.get_variable_to_shape_map():
        reader.get_tensor(name)
    return True


def judge(cluster: Cluster, code, workdir: str, reference, bound_seconds: float, took: float,
          mode: str = "mwms"):
    import numpy as np  # pylint: disable=import-outside-toplevel

    if code is None:
        return "HANG"
    if cluster.orphans():
        return "ORPHAN"
    try:
        checkpoint_loads(os.path.join(workdir, "ckpt"))
    except Exception:  # pylint: disable=broad-except
        return "CORRUPT"
    if code == 0:
        for name in RESULTS[mode]:
            path = os.path.join(workdir, "out", name)
            if not os.path.exists(path):
                return "WRONG"
            weights = json.load(open(path, encoding="utf-8"))["weights"]
            for expected, actual in zip(reference, weights):
                if np.max(np.abs(np.asarray(actual) - expected)) > 1e-5:
                    return "WRONG"
        return "exact"
    last = cluster.lines[-1] if cluster.lines else ""
    named = re.search(r"FAILED: (worker|chief|ps)-\d+: ", last)
    return "named error" if named and took <= bound_seconds else "UNNAMED"


def keras_reference():
    from tests.support import reference as ref  # pylint: disable=import-outside-toplevel

    model, _ = ref.keras_fit(ref.global_batches(70, 16), 3, "adam")
    return model.get_weights()


def define_flags() -> None:
    """Chaos' flags; defined when it runs as a program (the tests import
    this module for `draw` alongside other tools' flags)."""
    flags.DEFINE_enum("mode", "mwms", ["mwms", "ps"], "The cluster: 2 workers, or a chief, "
                      "1 worker and 1 ps.")
    flags.DEFINE_integer("trials", 3, "Trials, one fault each.")
    flags.DEFINE_integer("seed", 7, "Seeds the faults drawn.")
    flags.DEFINE_float("trial_timeout", 400.0, "A trial not ended within this is a HANG.")
    flags.DEFINE_string("bandwidth", "",
                        "Run every trial under tfdist-run --bandwidth (e.g. 1gbit).")
    flags.DEFINE_string("json", None, "Write the trials and the verdict here.")


def main(argv) -> int:
    del argv  # every option is a flag
    args = flags.FLAGS
    reference = keras_reference()
    rng = random.Random(args.seed)
    rows = []
    for trial in range(args.trials):
        fault = draw(rng, args.mode)
        with tempfile.TemporaryDirectory(prefix="tfdist-chaos-") as workdir:
            cluster = Cluster(workdir, args.mode, args.bandwidth)
            started = time.monotonic()
            try:
                injected = inject(cluster, fault)
                try:
                    code = cluster.process.wait(timeout=args.trial_timeout)
                except subprocess.TimeoutExpired:
                    code = None
                took = time.monotonic() - started
                time.sleep(0.5)
                outcome = judge(cluster, code, workdir, reference, args.trial_timeout, took,
                                args.mode)
            finally:
                cluster.close()
        restarts = sum("[launcher] restart" in line for line in cluster.lines)
        row = dict(fault, trial=trial + 1, injected=injected, exit_code=code,
                   limited_network=any("shares one loopback limited to" in line
                                       for line in cluster.lines),
                   restarts=restarts, seconds=round(took, 1), outcome=outcome,
                   last_line=(cluster.lines[-1] if cluster.lines else "")[:160])
        rows.append(row)
        print(f"trial {row['trial']:2d} | {fault['signal']:12} | {fault['task']:8} | "
              f"{fault['moment']:10} {fault['at']:>5} | {injected:17} | exit {code} | "
              f"restarts {restarts} | {row['seconds']:6.1f} s | {outcome}", flush=True)
    defects = [r for r in rows if r["outcome"] not in ("exact", "named error")]
    counts = {o: sum(r["outcome"] == o for r in rows) for o in sorted({r["outcome"] for r in rows})}
    print(f"chaos ({args.mode}): {len(rows)} trials, seed {args.seed}: {counts}; "
          f"{'PASSED' if not defects else 'FAILED'}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"ok": not defects, "trials": rows}, out)
    return 1 if defects else 0


if __name__ == "__main__":
    define_flags()
    app.run(main)
