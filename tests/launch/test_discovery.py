"""`tfdist.launch.discovery`: what a host discovery script may print, and
every answer that can not be used is reported and ignored (the job keeps
its size). The growth itself, 3 -> 2 -> 3 workers on a real cluster:
tests/scenarios/test_elastic_growth.py."""

import stat

import pytest

from tfdist.errors import ConfigurationError
from tfdist.launch import LaunchConfig
from tfdist.launch.discovery import HostDiscovery, parse_workers


@pytest.mark.parametrize("text, workers", [
    ("3\n", 3), ("host-a\nhost-b\n", 2), ("host-a:4\nhost-b:2\n\n", 6), ("10.0.0.1:2", 2),
])
def test_an_integer_or_horovod_host_lines(text, workers):
    assert parse_workers(text) == workers


@pytest.mark.parametrize("text", ["host:", "host:x", "two hosts", ":3"])
def test_anything_else_is_refused(text):
    with pytest.raises(ValueError, match="not `host` or `host:slots`"):
        parse_workers(text)


def _script(tmp_path, body):
    path = tmp_path / "discover.sh"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.mark.parametrize("printed, size", [("1", 2), ("3", 3), ("9", 4)])
def test_the_answer_is_kept_between_min_and_num_workers(tmp_path, printed, size):
    discovery = HostDiscovery(_script(tmp_path, f"echo {printed}"), fewest=2, most=4)
    assert discovery.workers() == size


@pytest.mark.parametrize("body, said", [
    ("exit 3", "exited with 3"),
    ("echo many workers", "not `host` or `host:slots`: 'many workers'"),
])
def test_a_failing_or_garbled_script_is_reported_and_ignored(tmp_path, body, said):
    lines = []
    discovery = HostDiscovery(_script(tmp_path, body), fewest=1, most=3, report=lines.append)
    assert discovery.workers() is None
    assert len(lines) == 1 and said in lines[0] and "keeping the current size" in lines[0]


def test_a_missing_script_is_reported(tmp_path):
    lines = []
    discovery = HostDiscovery(str(tmp_path / "nowhere.sh"), fewest=1, most=3,
                              report=lines.append)
    assert discovery.workers() is None and "failed" in lines[0]


@pytest.mark.parametrize("options, message", [
    ({"num_ps": 1}, r"`host_discovery` \('d.sh'\) resizes multi-worker training without ps"),
    ({"discovery_interval": 0}, r"`discovery_interval` \(0\) must be a positive"),
])
def test_bad_elastic_options_are_named(options, message):
    with pytest.raises(ConfigurationError, match=message):
        LaunchConfig(num_workers=3, host_discovery="d.sh", **options)
