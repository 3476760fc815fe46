"""``tfdist-run --bandwidth=RATE``: every task in a network namespace whose
loopback is limited by tc's token bucket (`tfdist.launch.network`); gone
with the run; bad rates and machines that cannot do it are clear errors.
Training on 2 workers over it: tests/scenarios/test_multi_worker.py."""

import os
import shutil
import subprocess
import sys

import pytest

from tests.support.launcher_harness import REPO, LauncherRun
from tests.support.network_limits import needs_namespaces
from tfdist.errors import ConfigurationError
from tfdist.launch import LaunchConfig, launch, network


def _loopback_qdisc() -> str:
    return subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True,
                          timeout=30).stdout


def test_rates_in_tc_notation():
    assert network.bits_per_second("1gbit") == 1e9
    assert network.bits_per_second("2.5Gbit") == 2.5e9
    assert network.bits_per_second("100mbps") == 8e8
    assert network.burst_bytes(1e9) == 500_000 and network.burst_bytes(1e8) == 256 * 1024
    for bad in ("fast", "1", "gbit", "-1gbit", "0gbit", "1 gigabit"):
        with pytest.raises(ConfigurationError, match=r"`--bandwidth` .* is not a rate"):
            network.bits_per_second(bad)


def test_a_bad_rate_stops_tfdist_run_before_anything_starts():
    done = subprocess.run([sys.executable, "-m", "tfdist.launch", "--bandwidth=fast",
                           "--num_workers=1", "--", "true"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert "`--bandwidth` ('fast') is not a rate" in done.stderr and "started" not in done.stdout


def test_without_root_it_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ConfigurationError, match="needs root"):
        network.check_can_limit()


def test_launch_as_a_library_refuses_a_bandwidth_it_cannot_apply():
    with pytest.raises(ConfigurationError, match="use `tfdist-run --bandwidth"):
        launch(LaunchConfig(num_workers=1, bandwidth="1gbit", start_timeout=0), ["true"])


@needs_namespaces
def test_every_task_shares_one_limited_loopback_and_nothing_is_left(tmp_path):
    before = _loopback_qdisc()
    with LauncherRun(["--bandwidth=1gbit", "--num_workers=2", "--start_timeout=0"],
                     ["sh", "-c", "tc qdisc show dev lo; readlink /proc/self/ns/net"]) as run:
        assert run.wait(timeout=120) == 0, run.output
    assert "every task shares one loopback limited to 1gbit" in run.output
    for task in ("worker-0", "worker-1"):
        assert f"[{task}] qdisc tbf" in run.output and "rate 1Gbit" in run.output, run.output
    namespaces = {line.split()[-1] for line in run.lines if "net:[" in line}
    assert len(namespaces) == 1  # one namespace, shared by both tasks
    assert namespaces != {os.readlink("/proc/self/ns/net")}  # and not this process's
    assert _loopback_qdisc() == before  # the host's loopback is untouched


@needs_namespaces
def test_a_missing_tool_is_named(monkeypatch):
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "tc" else real(tool))
    with pytest.raises(ConfigurationError, match="needs tc"):
        network.check_can_limit()
