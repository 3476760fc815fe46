"""Chaos, short form: 1 seeded fault on a real 2-worker cluster (in CI; the
same on a parameter-server cluster and on a 1 Gbit/s network with
``--full``), each trial
either finishes exactly like one device or fails naming a task; no hang,
no orphan process, no corrupted checkpoint.

Long forms: ``python scripts/chaos.py --trials=20 --seed=1`` and
``python scripts/chaos.py --mode=ps --trials=10 --seed=1`` (docs/reliability.md).
"""

import importlib.util
import json
import pathlib
import random
import subprocess
import sys

import pytest

from tests.support.network_limits import needs_namespaces

REPO = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("chaos", REPO / "scripts" / "chaos.py")
chaos = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chaos)


def test_faults_are_drawn_from_the_seed_over_every_signal_task_and_moment():
    first = [chaos.draw(random.Random(3)) for _ in range(1)]
    assert first == [chaos.draw(random.Random(3))]
    for mode in ("mwms", "ps"):
        drawn = [chaos.draw(rng, mode) for rng in [random.Random(1)] for _ in range(200)]
        assert {d["signal"] for d in drawn} == set(chaos.SIGNALS)
        assert {d["task"] for d in drawn} == set(chaos.TASKS[mode])
        assert {d["moment"] for d in drawn} == set(chaos.MOMENTS)
        assert all((d["cont_after"] is not None) == (d["signal"] == "SIGSTOP+CONT") for d in drawn)
    assert {"chief-0", "worker-0", "ps-0"} == set(chaos.TASKS["ps"])
    assert "evaluation" in chaos.MOMENTS


@pytest.mark.chaos
def test_a_seeded_fault_ends_exactly_or_with_a_named_error(tmp_path):
    report = tmp_path / "chaos.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "chaos.py"), "--trials=1", "--seed=7",
         f"--json={report}"], cwd=REPO, timeout=1500, capture_output=True, text=True,
    )
    result = json.loads(report.read_text())
    assert result["ok"], done.stdout[-6000:]
    # Seed 7: SIGSTOP of worker-0 at a step (the long forms draw 20 and 10).
    assert len(result["trials"]) == 1
    assert all(t["injected"] == "sent" for t in result["trials"]), done.stdout


@pytest.mark.chaos
@pytest.mark.full_form  # CI: the parameter-server faults of tests/scenarios/test_parameter_server.py
def test_one_seeded_fault_on_a_parameter_server_cluster(tmp_path):
    report = tmp_path / "chaos.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "chaos.py"), "--mode=ps", "--trials=1",
         "--seed=7", f"--json={report}"], cwd=REPO, timeout=900, capture_output=True, text=True,
    )
    result = json.loads(report.read_text())
    assert result["ok"], done.stdout[-6000:]
    assert [t["injected"] for t in result["trials"]] == ["sent"], done.stdout


@pytest.mark.chaos
@pytest.mark.full_form  # CI runs the same fault on the loopback's full speed
@needs_namespaces
def test_the_seeded_fault_on_a_1_gbit_network(tmp_path):
    """The short form's fault (seed 7) with every task on one loopback
    limited to 1 Gbit/s (tfdist-run --bandwidth): the same bounds hold."""
    report = tmp_path / "chaos.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "chaos.py"), "--trials=1", "--seed=7",
         "--bandwidth=1gbit", f"--json={report}"], cwd=REPO, timeout=1500, capture_output=True,
        text=True,
    )
    result = json.loads(report.read_text())
    assert result["ok"], done.stdout[-6000:]
    assert [t["injected"] for t in result["trials"]] == ["sent"], done.stdout
    assert result["trials"][0]["limited_network"], done.stdout[-3000:]
