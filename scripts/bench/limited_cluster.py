"""Runs a benchmark script as the training program of a 2-worker cluster on
a simulated network, and returns what its chief wrote.

The compression and time-to-accuracy benchmarks are one script each: run
plainly, it prepares the embedded dataset and starts itself under
``tfdist-run --bandwidth=RATE --num_workers=2`` with
``--worker_output=FILE`` (the chief writes its result there as JSON).
"""

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def loopback_bytes() -> int:
    """Bytes the loopback has carried (``/proc/net/dev``; inside a
    ``--bandwidth`` cluster's namespace: every task's traffic, once)."""
    with open("/proc/net/dev", encoding="utf-8") as dev:
        for line in dev:
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[0])  # received = sent, on loopback
    raise RuntimeError("no lo in /proc/net/dev")


def run(script: str, *, bandwidth: str, data_dir: str, output_dir: str, flags: dict,
        timeout: float, num_workers: int = 2) -> dict:
    """Generates the embedded dataset in ``data_dir`` (once), runs ``script``
    with ``flags`` (``{name: value}``) on ``num_workers`` workers under
    ``--bandwidth``, and returns the JSON its chief wrote; a failed cluster
    exits with its code."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run([sys.executable, "-m", "tfdist.data.datasets.prepare",
                    f"--data_dir={data_dir}"], cwd=REPO, check=True, timeout=600, env=env)
    os.makedirs(output_dir, exist_ok=True)
    raw = os.path.join(output_dir, "worker_result.json")
    command = [sys.executable, "-m", "tfdist.launch", f"--bandwidth={bandwidth}",
               f"--num_workers={num_workers}", "--", sys.executable, script,
               f"--worker_output={raw}",
               f"--data_dir={data_dir}"] + [f"--{name}={value}" for name, value in flags.items()]
    done = subprocess.run(command, cwd=REPO, timeout=timeout, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"the cluster failed (exit {done.returncode})")
    with open(raw, encoding="utf-8") as handle:
        return json.load(handle)
