"""strategies/mirrored.py runs as a user runs it: a real process, real files."""

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def _run(args, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.run(
        [sys.executable, str(REPO / "strategies" / "mirrored.py"), *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO,
    )


def test_mirrored_program_trains_learns_and_resumes(tmp_path):
    common = [
        "--num_replicas=2", f"--data_dir={tmp_path / 'data'}",
        f"--model_dir={tmp_path / 'model'}", "--log_every_steps=40",
    ]
    first = _run(common + ["--epochs=1"])
    assert first.returncode == 0, first.stderr[-3000:]
    assert "2 replicas | synthetic_patterns: 10000 training examples" in first.stdout
    assert "train | epoch 1 | step 40/79 | loss" in first.stdout
    accuracy_1 = float(first.stdout.split("final |")[1].split("accuracy")[1].split()[0])

    second = _run(common + ["--epochs=2"])
    assert second.returncode == 0, second.stderr[-3000:]
    assert "epoch 1" not in second.stdout  # resumed from the epoch-1 checkpoint
    accuracy_2 = float(second.stdout.split("final |")[1].split("accuracy")[1].split()[0])
    assert accuracy_1 > 0.5  # chance is 0.1
    assert accuracy_2 > accuracy_1
    assert list((tmp_path / "model").glob("ckpt-*.index"))
    assert list((tmp_path / "model" / "logs" / "train").glob("events.out.tfevents.*"))
