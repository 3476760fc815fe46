"""How fast a killed or hung worker is noticed, on a real 2-worker cluster.

    python scripts/detection.py              # SIGKILL worker-1, SIGSTOP worker-1, SIGSTOP worker-0
    python scripts/detection.py --repeats=3

Each trial starts ``tfdist-run --num_workers=2`` (no restarts, default
``--hang_timeout`` and the strategy's default ``peer_timeout_seconds``) on
tests/programs/train_reference_mlp.py with fast steps, waits for 20 logged
steps, and sends one signal to one worker. It reports the seconds from the
signal to the first line in which the other worker names the lost task
(``PeerLostError``), and to the launcher's exit, with the launcher's
summary line. A killed task is seen by the launcher at once, and it stops
the group before the peer's own check fires ("-" in the peer column). The
bound the README documents is 60 s for both.
"""

import argparse
import os
import re
import signal
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tests.launcher_harness import LauncherRun  # noqa: E402  pylint: disable=wrong-import-position

FAULTS = (("SIGKILL", "worker-1"), ("SIGSTOP", "worker-1"), ("SIGSTOP", "worker-0"))
PROGRAM = ["python", "tests/programs/train_reference_mlp.py", "--examples=400000",
           "--batch_size=8", "--epochs=1", "--log_every_steps=10"]


def trial(signal_name: str, target: str, workdir: str, timeout: float = 120.0) -> dict:
    """One fault; seconds to the peer's error and to the launcher's exit."""
    peer = "worker-0" if target == "worker-1" else "worker-1"
    names_target = re.compile(rf"\[{peer}\].*Lost {target}\b")
    with LauncherRun(["--num_workers=2", "--max_restarts=0"],
                     PROGRAM + [f"--output_dir={workdir}"]) as run:
        run.wait_for(r"\[worker-0\] train \| epoch 1 \| step 20/", timeout=240)
        os.kill(run.pids()[target], getattr(signal, signal_name))
        sent, peer_seconds = time.monotonic(), None
        while run.process.poll() is None and time.monotonic() - sent < timeout:
            if peer_seconds is None and any(names_target.search(l) for l in list(run.lines)):
                peer_seconds = time.monotonic() - sent
            time.sleep(0.02)
        exited = run.process.poll() is not None
        launcher_seconds = time.monotonic() - sent
        run.wait(timeout=30) if exited else None
        if peer_seconds is None and any(names_target.search(l) for l in list(run.lines)):
            peer_seconds = launcher_seconds  # seen only in the output read at the end
        summary = next((line for line in reversed(run.lines)
                        if line.startswith("[launcher] ")), "")
    return {"fault": f"{signal_name} {target}", "peer": peer_seconds,
            "launcher": launcher_seconds if exited else None, "summary": summary}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    import tempfile  # pylint: disable=import-outside-toplevel

    rows = []
    for repeat in range(args.repeats):
        for signal_name, target in FAULTS:
            with tempfile.TemporaryDirectory(prefix="tfdist-detection-") as workdir:
                row = trial(signal_name, target, workdir)
            rows.append(row)
            print(f"detection: {row['fault']}: peer {row['peer']}, launcher {row['launcher']}",
                  flush=True)
    print(f"\n{'fault':<18} {'peer names it (s)':>18} {'launcher exits (s)':>19}  launcher's summary")
    for row in rows:
        peer = "-" if row["peer"] is None else f"{row['peer']:.1f}"
        launcher = "no exit" if row["launcher"] is None else f"{row['launcher']:.1f}"
        print(f"{row['fault']:<18} {peer:>18} {launcher:>19}  {row['summary'][:150]}")
    late = [r for r in rows if r["launcher"] is None or r["launcher"] > 60]
    sys.exit(1 if late else 0)


if __name__ == "__main__":
    main()
