"""Every runner through the same cases (`tests/loops/runner_contract.py`):
the synchronous runner on one device and on 3 mirrored replicas (its
device loop with and without the end check), the coordinator on a real
in-process parameter-server cluster in a process of its own."""

import json
import pathlib
import subprocess
import sys

import pytest

from tests.loops import runner_contract
from tfdist.loops.runners import SynchronousRunner

REPO = pathlib.Path(__file__).resolve().parents[2]


def _expected(runner_name):
    skipped = runner_contract.NOT_APPLICABLE.get(runner_name, {})
    return {name: value for name, value in runner_contract.EXPECTED.items()
            if name not in skipped}


@pytest.mark.parametrize("replicas", [1, 3])
def test_the_synchronous_runner_keeps_the_contract(make_strategy, replicas):
    observed = runner_contract.observe(SynchronousRunner, make_strategy(replicas), "synchronous")
    assert observed == _expected("synchronous")


def test_the_coordinator_keeps_the_contract():
    done = subprocess.run(
        [sys.executable, "-m", "tests.programs.runner_contract_on_parameter_servers"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    observed = json.loads(done.stdout.strip().splitlines()[-1])
    assert observed == _expected("coordinator")
    assert set(runner_contract.CASES) - set(observed) == set(
        runner_contract.NOT_APPLICABLE["coordinator"])
