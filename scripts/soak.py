"""Soak: a real local cluster trains fast steps for minutes while every task's
threads, resident memory and open files are sampled from /proc.

    python scripts/soak.py --mode=mwms --minutes=10   # long form: 2 workers (MWMS)
    python scripts/soak.py --mode=ps --minutes=10     # long form: 1 worker + 1 ps
    python scripts/soak.py --mode=pipeline --minutes=3   # a Pipeline, one stage per process
    python scripts/soak.py --mode=composed --minutes=3   # data x pipeline x fully sharded, 2 workers
    python scripts/soak.py --mode=mesh --minutes=3   # data x pipeline x model, 2 workers x 4 CPUs
    python scripts/soak.py --mode=gossip --minutes=3   # Gossip("ring") over 4 workers
    python scripts/soak.py --mode=mwms --minutes=1 --epoch_steps=512   # short form (tests/scenarios/test_soak.py)
    python scripts/soak.py --mode=mwms --minutes=10 --epoch_steps=512  # epoch ends: iterators made and freed
    python scripts/soak.py --mode=mwms --minutes=10 --endless_data     # executions without an end check
    python scripts/soak.py --mode=mwms --minutes=3 --model=embedding   # sparse gradients, varying shapes
    python scripts/soak.py --mode=mwms --minutes=3 --sharded_state --async_checkpoint  # sharded state, its saves
    python scripts/soak.py --mode=mwms --minutes=3 --fully_sharded --async_checkpoint  # fully sharded weights

Each run starts ``tfdist-run`` with `scripts/bench/soak_train.py` (global batch 8,
one step per host call, a checkpoint every 500 steps, a progress line every
100), samples every task every ``--interval`` seconds, and at the end sends
the launcher SIGTERM, which must stop every task (saving a checkpoint)
within ``--max_stop_seconds`` (default 15; the launcher's grace period is
30). It prints a table per task and a
verdict, and with ``--json`` writes both.

Verdict, after a warm-up (the first quarter of the run, at least 15 s):
threads and open files may not grow by more than ``--slack`` (default 8)
over their first value after the warm-up (threads: the median of the last
third of the samples over that of the first third, so that a released data
iterator's threads, alive for seconds until TensorFlow frees it, are not
taken for a leak; the peak is reported as ``thread_spike``); resident
memory may not grow by
more than ``--max_rss_kb_per_step`` KB per training step, a least-squares
slope over the samples after the warm-up (default 1 for ``mwms``, 8 for
``ps``).

MWMS is flat at one step per host call: 0.011 / 0.004 KB per step over
34,100 steps in 3 minutes (2026-11-23, 0.3 / 0.1 MB in all). What it took:
TensorFlow's multi-worker runtime keeps ~1.6 KB per host call for every
collective op whose instance key is new at each call (its default;
docs/reliability.md), so tfdist's functions fix the keys when
they are traced (`tfdist._internal.collectives.function`) and no eager collective is
left per log point, epoch or save; and TensorFlow keeps a tensor per
distinct Python scalar it is handed, so step numbers and logged values go
as numpy scalars (`tfdist._internal.host_values`). Parameter servers keep ~0.6-0.7
KB per step on the chief and the ps, from their checkpoint saves (~230 KB
per save; 0.006 / 0.022 / 0.016 KB per step without periodic saves; not
yet found), hence their bound. ``--checkpoint_every_steps`` larger than
the run leaves out the periodic saves (to tell their cost apart).
"""

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STARTED = re.compile(r"\[launcher\] started (\S+) \(pid (\d+)\)")
_STEP = re.compile(r"\] train \| epoch (\d+) \| step (\d+)")


def read_proc(pid: int):
    """(threads, RSS in MB, open files) of ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
        files = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError):
        return None
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0]) / 1024.0, files


def launcher_command(mode: str, workdir: str, steps: int, steps_per_execution: int = 1,
                     checkpoint_every_steps: int = 500, epoch_steps: int = 0,
                     endless_data: bool = False, bandwidth: str = "",
                     async_checkpoint: bool = False, data_service_workers: int = 0,
                     local_sgd: int = 0, model: str = "mlp", sharded_state: bool = False,
                     fully_sharded: bool = False):
    train = [sys.executable, os.path.join(REPO, "scripts", "bench", "soak_train.py"),
             f"--checkpoint_dir={os.path.join(workdir, 'ckpt')}", f"--steps={steps}",
             f"--steps_per_execution={steps_per_execution}",
             f"--checkpoint_every_steps={checkpoint_every_steps}",
             f"--epoch_steps={epoch_steps}"] + (["--endless_data"] if endless_data else []) + (
                 ["--async_checkpoint"] if async_checkpoint else []) + (
                 ["--data_service=auto"] if data_service_workers else []) + (
                 [f"--local_sgd={local_sgd}"] if local_sgd else []) + (
                 ["--sharded_state"] if sharded_state else []) + (
                 ["--fully_sharded"] if fully_sharded else []) + [f"--model={model}"]
    cluster = {"mwms": ["--num_workers=2"], "ps": ["--num_workers=1", "--num_ps=1"],
               "pipeline": ["--num_workers=1", "--workers_serve"],
               "composed": ["--num_workers=2"], "mesh": ["--num_workers=2"],
               "gossip": ["--num_workers=4"]}[mode]
    if mode == "ps":
        train.append("--strategy=parameter_server")
    if mode == "pipeline":  # the chief trains stage 1, a worker's server holds stage 2
        train.append("--strategy=pipeline")
    if mode == "composed":  # each worker's pipeline over its 2 CPUs, weights sharded over workers
        train += ["--strategy=pipeline_per_worker", "--fully_sharded"]
    if mode == "mesh":  # each worker's 2 stages of 2 model devices (tensor parallel)
        train.append("--strategy=mesh_per_worker")
    if mode == "gossip":  # 4 workers on a ring: each exchanges with 2 neighbours per step
        train.append("--gossip=ring")
    if bandwidth:  # tfdist-run --bandwidth: every task on one limited loopback
        cluster.append(f"--bandwidth={bandwidth}")
    if data_service_workers:  # a dispatcher and service workers, sampled like the others
        cluster.append(f"--data_service_workers={data_service_workers}")
    return [sys.executable, "-m", "tfdist.launch", *cluster, "--grace_period=30", "--", *train]


def slope(points):
    """Least-squares slope of (x, y) points (0 for fewer than 2)."""
    if len(points) < 2:
        return 0.0
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    var = sum((x - mean_x) ** 2 for x, _ in points)
    return 0.0 if var == 0 else sum((x - mean_x) * (y - mean_y) for x, y in points) / var


def _thirds(values):
    """Medians (the lower middle value: counts stay whole) of the first and
    the last third of ``values``."""
    third = max(1, len(values) // 3)
    return statistics.median_low(values[:third]), statistics.median_low(values[-third:])


def judge(samples, *, warmup_seconds: float, slack: int, max_rss_kb_per_step: float):
    """Per task: peaks, growth after the warm-up, and whether it is flat."""
    verdicts = {}
    for task in sorted({s["task"] for s in samples}):
        rows = [s for s in samples if s["task"] == task]
        after = [s for s in rows if s["t"] >= warmup_seconds] or rows[-1:]
        first = after[0]
        steps = [s for s in after if s["step"] is not None]
        kb_per_step = 1024.0 * slope([(s["step"], s["rss_mb"]) for s in steps])
        thread_start, thread_end = _thirds([s["threads"] for s in after])
        verdict = {
            "samples": len(rows),
            "peak_threads": max(s["threads"] for s in rows),
            "peak_rss_mb": round(max(s["rss_mb"] for s in rows), 1),
            "peak_fds": max(s["fds"] for s in rows),
            # Threads that stay: a freed data iterator's threads live on for
            # seconds (`tfdist.data.iterator_release`), tf.data's come and go; a
            # leak moves the median.
            "thread_growth": thread_end - thread_start,
            "thread_spike": max(s["threads"] for s in after) - thread_start,
            "fd_growth": max(s["fds"] for s in after) - first["fds"],
            "rss_growth_mb": round(after[-1]["rss_mb"] - first["rss_mb"], 1),
            "rss_kb_per_step": round(kb_per_step, 3),
        }
        verdict["flat"] = (
            verdict["thread_growth"] <= slack and verdict["fd_growth"] <= slack
            and kb_per_step <= max_rss_kb_per_step
        )
        verdicts[task] = verdict
    return verdicts


class Soak:
    """One run: start, sample until the deadline, stop with SIGTERM."""

    def __init__(self, mode: str, minutes: float, interval: float, workdir: str, steps: int,
                 steps_per_execution: int = 1, checkpoint_every_steps: int = 500,
                 epoch_steps: int = 0, endless_data: bool = False, bandwidth: str = "",
                 async_checkpoint: bool = False, data_service_workers: int = 0,
                 local_sgd: int = 0, model: str = "mlp", sharded_state: bool = False,
                 fully_sharded: bool = False):
        self.mode, self.seconds, self.interval = mode, minutes * 60, interval
        self.epoch_steps = epoch_steps
        self.lines, self.samples = [], []
        self.process = subprocess.Popen(
            launcher_command(mode, workdir, steps, steps_per_execution, checkpoint_every_steps,
                             epoch_steps, endless_data, bandwidth, async_checkpoint,
                             data_service_workers, local_sgd, model, sharded_state,
                             fully_sharded),
            cwd=REPO, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1"),
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def pids(self):
        return {m.group(1): int(m.group(2)) for m in map(_STARTED.search, list(self.lines)) if m}

    def step(self):
        for line in reversed(self.lines[-50:]):
            match = _STEP.search(line)
            if match:  # the run's step: epochs are epoch_steps long
                epoch, step = int(match.group(1)), int(match.group(2))
                return (epoch - 1) * self.epoch_steps + step
        return None

    def run(self, progress=print):
        started = time.monotonic()
        next_report = started
        while time.monotonic() - started < self.seconds and self.process.poll() is None:
            now = time.monotonic() - started
            step = self.step()
            for task, pid in self.pids().items():
                found = read_proc(pid)
                if found:
                    threads, rss_mb, fds = found
                    self.samples.append({"t": round(now, 1), "task": task, "step": step,
                                         "threads": threads, "rss_mb": rss_mb, "fds": fds})
            if time.monotonic() >= next_report:
                progress(f"soak {self.mode}: {now:5.0f}/{self.seconds:.0f} s, step {step}, "
                         + ", ".join(f"{s['task']} {s['threads']} thr {s['rss_mb']:.0f} MB "
                                     f"{s['fds']} fds" for s in self.samples[-len(self.pids()):]))
                next_report += 30
            time.sleep(self.interval)
        ended_early = self.process.poll() is not None
        stop_started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            code = None
        stop_seconds = time.monotonic() - stop_started
        self.close()
        return {"ended_early": ended_early, "exit_code": code,
                "limited_network": any("shares one loopback limited to" in line
                                       for line in self.lines),
                "stop_seconds": round(stop_seconds, 1), "last_step": self.step(),
                "minutes": round((stop_started - started) / 60, 2)}

    def close(self):
        """Ends the launcher and every task, by pid, whatever happened."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        for pid in self.pids().values():
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._reader.join(timeout=10)


def define_flags() -> None:
    """The soak's flags; defined when it runs as a program (the tests import
    this module for `judge` alongside other tools' flags)."""
    flags.DEFINE_enum("mode", "mwms", ["mwms", "ps", "pipeline", "composed", "mesh", "gossip"],
                      "The cluster: 2 workers, 1 worker + 1 ps, a pipeline of 2 stages "
                      "(the chief and a worker's server: tfdist-run --workers_serve), or "
                      "composed: 2 workers, each a pipeline of 2 stages over its 2 CPUs, "
                      "each stage's weights fully sharded over the workers; mesh: 2 workers, "
                      "each 2 stages of 2 model devices over its 4 CPUs (data x pipeline x "
                      "model); gossip: 4 workers, Gossip('ring').")
    flags.DEFINE_float("minutes", 1.0, "How long the cluster trains.")
    flags.DEFINE_float("interval", 2.0, "Seconds between samples of every task.")
    flags.DEFINE_integer("steps", 10_000_000, "Training steps (the run stops at --minutes first).")
    flags.DEFINE_integer("steps_per_execution", 1, "Steps per host call.")
    flags.DEFINE_integer("checkpoint_every_steps", 500,
                         "A larger value than the run's steps: no checkpoint but the last.")
    flags.DEFINE_integer("epoch_steps", 0, "Epochs of this many steps, each with a fresh "
                         "iterator (0: one epoch).")
    flags.DEFINE_bool("endless_data", False,
                      "Endless data: executions without an end-of-data check.")
    flags.DEFINE_integer("slack", 8, "Threads and open files a task may gain after the warm-up.")
    flags.DEFINE_float("max_rss_kb_per_step", None,
                       "Default: 1 for mwms and pipeline, 8 for ps (see the module docstring).")
    flags.DEFINE_float("max_stop_seconds", 15.0,
                       "SIGTERM to the launcher must end every task within this.")
    flags.DEFINE_string("bandwidth", "",
                        "Run the cluster under tfdist-run --bandwidth (e.g. 1gbit).")
    flags.DEFINE_bool("async_checkpoint", False,
                      "Checkpoints written in the background (CheckpointOptions(async_write=True)).")
    flags.DEFINE_integer("data_service_workers", 0,
                         "Read the data through a tf.data service with this many workers.")
    flags.DEFINE_integer("local_sgd", 0, "Train with LocalSGD(every_steps=N) (0: synchronous).")
    flags.DEFINE_bool("sharded_state", False,
                      "Train with ShardedOptimizerState() (its saves gather the state whole).")
    flags.DEFINE_bool("fully_sharded", False,
                      "Train with FullySharded() (each worker keeps half of every weight).")
    flags.DEFINE_enum("model", "mlp", ["mlp", "embedding"],
                      "embedding: Embedding(mask_zero) + pooling on padded batches of 2..10 "
                      "ids, a new length most steps (variable-shaped sparse gradient "
                      "all-gathers).")
    flags.DEFINE_string("json", None, "Write samples and verdict here.")


def main(argv) -> int:
    del argv  # every option is a flag
    args = flags.FLAGS
    max_rss_kb_per_step = args.max_rss_kb_per_step
    if max_rss_kb_per_step is None:
        max_rss_kb_per_step = {"mwms": 1.0, "ps": 8.0, "pipeline": 1.0,
                               "composed": 1.0, "mesh": 1.0, "gossip": 1.0}[args.mode]
    with tempfile.TemporaryDirectory(prefix="tfdist-soak-") as workdir:
        soak = Soak(args.mode, args.minutes, args.interval, workdir, args.steps,
                    args.steps_per_execution, args.checkpoint_every_steps, args.epoch_steps,
                    args.endless_data, args.bandwidth, args.async_checkpoint,
                    args.data_service_workers, args.local_sgd, args.model,
                    sharded_state=args.sharded_state, fully_sharded=args.fully_sharded)
        try:
            run = soak.run()
        finally:
            soak.close()
    verdicts = judge(soak.samples, warmup_seconds=max(15.0, args.minutes * 15),
                     slack=args.slack, max_rss_kb_per_step=max_rss_kb_per_step)
    stopped = any("stopped by SIGTERM" in line for line in soak.lines[-5:])
    stopped_in_time = run["stop_seconds"] <= args.max_stop_seconds
    ok = (not run["ended_early"] and run["exit_code"] == 143 and stopped and stopped_in_time
          and bool(verdicts) and all(v["flat"] for v in verdicts.values()))
    print(f"\nsoak {args.mode}: {run['minutes']} min, {run['last_step']} steps; "
          f"SIGTERM stopped every task in {run['stop_seconds']} s (exit {run['exit_code']}; "
          f"bound {args.max_stop_seconds:g} s)")
    print(f"{'task':10} {'peak thr':>8} {'thr +':>6} {'peak RSS MB':>11} {'RSS +MB':>8} "
          f"{'KB/step':>8} {'peak fds':>8} {'fds +':>6}  flat")
    for task, v in verdicts.items():
        print(f"{task:10} {v['peak_threads']:8d} {v['thread_growth']:6d} {v['peak_rss_mb']:11.1f} "
              f"{v['rss_growth_mb']:8.1f} {v['rss_kb_per_step']:8.3f} {v['peak_fds']:8d} "
              f"{v['fd_growth']:6d}  {v['flat']}")
    print("soak:", "PASSED" if ok else "FAILED")
    if not ok:
        print("\n".join(soak.lines[-30:]))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"ok": ok, "run": run, "verdicts": verdicts, "samples": soak.samples,
                       "tail": soak.lines[-30:]}, out)
    return 0 if ok else 1


if __name__ == "__main__":
    define_flags()
    app.run(main)
